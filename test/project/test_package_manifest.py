"""package.xml against the code: every ROS package the Python code, the launch files and the agent
import is declared (optional ones conditionally), and one version everywhere.

Imports are read with ast from the sources (not by importing them: launch, launch_ros and
vision_msgs are not installable here, carla_msgs only where scripts/build_ros_interfaces.sh built it). A ROS package is a name in the ament index here
(AMENT_PREFIX_PATH) or one of the ROS packages listed in NOT_INSTALLABLE_HERE. Every other
top-level import must be the standard library, this package, or a Python library listed in
PYTHON_LIBRARIES with where it comes from, so an import of a new ROS package cannot go unnoticed.
Runs in ``colcon test`` too (CMakeLists.txt), where the modules come from the install tree.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT

catkin_pkg = pytest.importorskip("catkin_pkg.package", reason="catkin_pkg comes with the ROS 2 wheels")

SOURCES = sorted([*ROOT.glob("wam_diff2_core/**/*.py"), *ROOT.glob("wam_diff2_ros/**/*.py"),
                  *ROOT.glob("launch/*.py"), *ROOT.glob("agents/*.py"), *ROOT.glob("scripts/ros2_run/*")])
OWN = {"wam_diff2_core", "wam_diff2_ros"}
# ROS 2 packages that are not on PyPI (so not in the ament index of every environment the tests run in:
# carla_msgs is built by scripts/build_ros_interfaces.sh, absent from the install-tree tests' environment)
NOT_INSTALLABLE_HERE = {"launch", "launch_ros", "vision_msgs", "carla_msgs", "autoware_planning_msgs", "tf2_msgs",
                        "derived_object_msgs"}
# ROS packages the code may do without (imported inside try/except ImportError)
OPTIONAL_ROS = {"vision_msgs", "carla_msgs", "autoware_planning_msgs", "tf2_msgs", "derived_object_msgs"}
# the rest, with where a ROS user gets it: a rosdep key declared in package.xml, or pip
PYTHON_LIBRARIES = {
    "numpy": "rosdep python3-numpy", "yaml": "rosdep python3-yaml", "cv2": "rosdep python3-opencv",
    "torch": "pip", "torchvision": "pip", "transformers": "pip", "safetensors": "pip", "tokenizers": "pip",
    "PIL": "pip", "tqdm": "pip", "huggingface_hub": "pip (with transformers)",
    "accelerate": "pip, training only", "rosbags": "pip, bag evaluation only", "ruamel": "pip (with rosbags)",
    "matplotlib": "pip, evaluation plots only", "pycocotools": "pip, detection scores only",
    "torchao": "pip .[quant], engine.quantization only",
    "flashinfer": "pip .[gpu]", "torch_npu": "pip .[npu]",
    "triton": "with torch's CUDA builds (pip), engine.layer_kernels on CUDA only",
    "leaderboard": "the CARLA leaderboard's own Python (agents/ runs inside it)",
}


def top_level_imports(path: Path) -> dict[str, bool]:
    """{top-level module: imported only inside a try whose handlers catch ImportError}."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in node.handlers):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            found[top] = found.get(top, True) and id(node) in guarded
    return found


@pytest.fixture(scope="module")
def manifest():
    package = catkin_pkg.parse_package(str(ROOT / "package.xml"))
    package.validate()
    return package


def declared(package, env: dict[str, str]) -> dict[str, set[str]]:
    package.evaluate_conditions(env)
    kinds = ("buildtool_depends", "build_depends", "exec_depends", "test_depends", "build_export_depends")
    return {k: {d.name for d in getattr(package, k) if d.evaluated_condition is not False} for k in kinds}


def imports_by_module() -> dict[str, dict[str, bool]]:
    """{top-level module: {source file (relative): optional}} over every source."""
    out: dict[str, dict[str, bool]] = {}
    for path in SOURCES:
        for name, optional in top_level_imports(path).items():
            out.setdefault(name, {})[str(path.relative_to(ROOT))] = optional
    return out


def test_the_scan_sees_the_sources():
    names = {str(p.relative_to(ROOT)) for p in SOURCES}
    assert {"wam_diff2_ros/planner/node.py", "launch/leaderboard.launch.py", "agents/wam_diff2_agent.py",
            "scripts/ros2_run/wam-diff2-planner"} <= names
    imports = imports_by_module()
    assert imports["launch_ros"] and imports["rclpy"] and imports["ament_index_python"]
    assert all(imports["carla_msgs"].values()), "carla_msgs is imported only inside try/except ImportError"


def test_every_import_is_classified(ament_packages):
    ros = ament_packages | NOT_INSTALLABLE_HERE
    assert {"rclpy", "std_msgs"} <= ros, "the ament index is not on AMENT_PREFIX_PATH (source scripts/env.sh)"
    unknown = {name: sorted(files) for name, files in imports_by_module().items()
               if name not in sys.stdlib_module_names and name not in OWN and name not in ros
               and name not in PYTHON_LIBRARIES and name != "__future__"}
    assert not unknown, (f"imports that are neither the standard library, a ROS package nor a known Python "
                         f"library (add a ROS package to package.xml, a Python library to requirements/ and "
                         f"PYTHON_LIBRARIES): {unknown}")


def test_every_imported_ros_package_is_declared(manifest, ament_packages):
    ros = ament_packages | NOT_INSTALLABLE_HERE
    run_deps = declared(manifest, {"WAM_DIFF2_CARLA": "1"})["exec_depends"]
    build = declared(manifest, {})
    run_deps |= build["build_export_depends"]       # <depend> is build + exec
    imported = {name: files for name, files in imports_by_module().items() if name in ros - OWN}
    missing = {name: sorted(files) for name, files in imported.items() if name not in run_deps}
    assert not missing, f"ROS packages imported but not an exec_depend / depend of package.xml: {missing}"
    for name, files in imported.items():
        if not all(files.values()):
            assert name not in OPTIONAL_ROS, f"{name} is optional but imported unguarded in {files}"
    # the Python libraries that come from rosdep keys are declared too
    keys = {v.split()[1] for v in PYTHON_LIBRARIES.values() if v.startswith("rosdep")}
    assert keys <= run_deps


def test_carla_msgs_is_a_conditional_dependency(manifest):
    assert "carla_msgs" not in declared(manifest, {})["exec_depends"]          # rosdep / colcon skip it
    assert "carla_msgs" in declared(manifest, {"WAM_DIFF2_CARLA": "1"})["exec_depends"]
    # everything else is unconditional
    manifest.evaluate_conditions({})
    conditional = {d.name for k in ("exec_depends", "build_depends", "test_depends", "buildtool_depends")
                   for d in getattr(manifest, k) if d.condition}
    assert conditional == {"carla_msgs"}


def test_messages_and_test_dependencies_are_declared(manifest):
    deps = declared(manifest, {})
    assert {"ament_cmake", "ament_cmake_python", "rosidl_default_generators"} <= deps["buildtool_depends"]
    assert {"ament_cmake_pytest", "python3-pytest"} <= deps["test_depends"]
    assert "rosidl_interface_packages" in {g.name for g in manifest.member_of_groups}
    assert manifest.get_build_type() == "ament_cmake"
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert f"project({manifest.name})" in cmake
    for dep in re.search(r"DEPENDENCIES ([\w ]+)\n", cmake).group(1).split():
        assert dep in deps["build_depends"] and dep in deps["exec_depends"] | deps["build_export_depends"]


def test_one_version_everywhere(manifest):
    from wam_diff2_core.version import __version__
    assert manifest.version == __version__
    setup_py = ROOT / "setup.py"
    if setup_py.exists():        # the source tree (colcon test runs from it too)
        out = subprocess.run([sys.executable, str(setup_py), "--version"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == __version__
