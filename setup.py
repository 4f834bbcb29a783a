"""pip installation of wam_diff2_core and wam_diff2_ros (the ROS build uses CMakeLists.txt).

Exact versions for this project's machines are pinned in requirements/*.txt; the ranges here
are what the code needs.
"""
from setuptools import find_packages, setup

setup(
    name="wam-diff2-ros",
    version="0.1.0",
    description="WAM-Diff2 block-diffusion driving VLA (Qwen3-VL) for ROS 2",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["wam_diff2_core", "wam_diff2_core.*",
                                    "wam_diff2_ros", "wam_diff2_ros.*"]),
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "transformers>=5.17,<6",
        "safetensors>=0.4",
        "tokenizers>=0.21",
        "numpy>=1.24",
        "pillow>=10",
        "pyyaml>=6",
        "tqdm>=4.66",
    ],
    extras_require={
        "ros": ["opencv-python-headless>=4.8"],  # rclpy and messages come from ROS or requirements/ros.txt
        "eval": ["rosbags>=0.10", "matplotlib>=3.8"],
        "train": ["accelerate>=1.0"],
        "gpu": ["flashinfer-python>=0.7"],
        "npu": ["torch-npu>=2.4"],
        "test": ["pytest>=8", "pytest-timeout>=2", "hypothesis>=6"],
    },
    entry_points={
        "console_scripts": [
            "wam-diff2=wam_diff2_core.cli:main",
            "wam-diff2-planner=wam_diff2_ros.planner_node:main",
            "wam-diff2-controller=wam_diff2_ros.controller_node:main",
            "wam-diff2-localization=wam_diff2_ros.localization_node:main",
        ],
    },
)
