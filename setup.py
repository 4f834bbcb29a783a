"""pip installation of wam_diff2_core and wam_diff2_ros (the ROS build uses CMakeLists.txt).

The version comes from wam_diff2_core/version.py, the ranges the code needs from
requirements/python.txt; exact versions for this project's machines are pinned in
requirements/core.txt (and per ROS 2 distribution in constraints/).
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
VERSION = re.search(r'^__version__ = "([^"]+)"$', (HERE / "wam_diff2_core" / "version.py").read_text(), re.M).group(1)
REQUIRES = [line.strip() for line in (HERE / "requirements" / "python.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]

setup(
    name="wam-diff2-ros",
    version=VERSION,
    description="WAM-Diff2 block-diffusion driving VLA (Qwen3-VL) for ROS 2",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["wam_diff2_core", "wam_diff2_core.*",
                                    "wam_diff2_ros", "wam_diff2_ros.*"]),
    install_requires=REQUIRES,
    extras_require={
        "ros": ["opencv-python-headless>=4.8"],  # rclpy and messages come from ROS or requirements/ros.txt
        "eval": ["rosbags>=0.10", "matplotlib>=3.8", "pycocotools>=2.0.8"],
        "train": ["accelerate>=1.0"],
        "gpu": ["flashinfer-python>=0.7"],
        "quant": ["torchao>=0.18"],          # engine.quantization other than none
        "npu": ["torch-npu>=2.4"],
        "test": ["pytest>=8", "pytest-timeout>=2", "hypothesis>=6"],
    },
    entry_points={
        "console_scripts": [
            "wam-diff2=wam_diff2_core.cli:main",
            "wam-diff2-planner=wam_diff2_ros.entry_point:planner",
            "wam-diff2-controller=wam_diff2_ros.entry_point:controller",
            "wam-diff2-localization=wam_diff2_ros.entry_point:localization",
            "wam-diff2-ros=wam_diff2_ros.tools.cli:main",
        ],
    },
)
