"""scripts/build_ros_interfaces.sh and scripts/env.sh: the upstream interface packages (carla_msgs,
derived_object_msgs) built once per checkout's venv under a key of what the build reads, reused while it is
unchanged, never left half-built under that key, and put on the paths by env.sh (without colcon's
hooks, discovery kept on localhost).

The build itself (2-4 minutes on 2 cores) is set-up's job; these tests use the one set-up made, and
a deliberately broken copy of the packages fails within seconds (its first package does not configure).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT

SHARED = ROOT.parent / "shared" / "ros_interfaces"


def bash(script: str, **env: str) -> subprocess.CompletedProcess:
    clean = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
             **env}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300)


# what the build script builds (scripts/ros_interfaces.sh names them once)
PACKAGES = tuple(bash(". scripts/ros_interfaces.sh; echo $WD2_ROS_INTERFACE_PACKAGES").stdout.split())


def interfaces_dir(**env: str) -> Path:
    out = bash(f"_wd2_root={ROOT}; . scripts/ros_interfaces.sh; wd2_ros_interfaces_dir", **env)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


def copy_packages(dest: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(SHARED / pkg, dest / pkg)
        for path in (dest / pkg).rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)      # shared/ may be a read-only copy
    return dest


def test_env_sh_puts_the_built_packages_on_the_paths_and_keeps_discovery_local():
    built = interfaces_dir() / "install"
    assert built.is_dir(), "set-up has not built the interface packages (bash scripts/build_ros_interfaces.sh)"
    out = bash(". scripts/env.sh && python -c 'import carla_msgs.msg as c, derived_object_msgs.msg as d; "
               "print(c.__file__); print(d.ObjectArray.__module__)' && echo \"$ROS_AUTOMATIC_DISCOVERY_RANGE\" "
               "&& echo \"$AMENT_PREFIX_PATH\" && echo \"${ROS_DISTRO:-unset}\"",
               ROS_AUTOMATIC_DISCOVERY_RANGE="SUBNET")
    assert out.returncode == 0, out.stderr
    module, object_module, discovery, prefixes, distro = out.stdout.split("\n")[:5]
    assert Path(module).is_relative_to(built) and object_module.startswith("derived_object_msgs.msg")
    assert discovery == "LOCALHOST"                   # even when the shell had widened it
    assert str(built) in prefixes.split(":") and distro == "unset"   # no ros_environment hooks sourced


def test_the_key_is_the_content_of_the_packages_not_their_place(tmp_path):
    copy = copy_packages(tmp_path / "shared")
    assert interfaces_dir(WAM_DIFF2_ROS_INTERFACES=str(copy)) == interfaces_dir()
    msg = copy / "carla_msgs" / "msg" / "CarlaSpeedometer.msg"
    msg.write_text(msg.read_text() + "\nfloat64 added\n")
    changed = interfaces_dir(WAM_DIFF2_ROS_INTERFACES=str(copy))
    assert changed != interfaces_dir() and changed.parent == interfaces_dir().parent
    cache = interfaces_dir(WAM_DIFF2_CACHE=str(tmp_path / "cache"))
    assert cache == tmp_path / "cache" / "ros-interfaces" / interfaces_dir().name


def test_each_checkouts_venv_has_its_own_build(tmp_path):
    """Same packages, wheels and script in another checkout: another key (the build records its venv's paths)."""
    other = tmp_path / "checkout"
    (other / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "build_ros_interfaces.sh", other / "scripts")
    site = other / ".venv" / "lib" / "python3.11" / "site-packages"
    for wheel in (ROOT / ".venv" / "lib" / "python3.11" / "site-packages").glob("ros_*.dist-info"):
        (site / wheel.name).mkdir(parents=True)
    out = bash(f"_wd2_root={other}; . scripts/ros_interfaces.sh; wd2_ros_interfaces_dir",
               WAM_DIFF2_ROS_INTERFACES=str(SHARED))
    assert out.returncode == 0, out.stderr
    theirs = Path(out.stdout.strip())
    assert theirs != interfaces_dir() and theirs.parent == interfaces_dir().parent
    moved = bash(f"_wd2_root={other}; . scripts/ros_interfaces.sh; wd2_ros_interfaces_dir",
                 WAM_DIFF2_ROS_INTERFACES=str(copy_packages(tmp_path / "shared")))
    assert moved.returncode == 0 and Path(moved.stdout.strip()) == theirs    # the shared folder's place: no
    (tmp_path / "link").symlink_to(other)
    linked = bash(f"_wd2_root={tmp_path / 'link'}; . scripts/ros_interfaces.sh; wd2_ros_interfaces_dir",
                  WAM_DIFF2_ROS_INTERFACES=str(SHARED))
    assert linked.returncode == 0 and Path(linked.stdout.strip()) == theirs  # the same checkout by a link: no


def test_an_unchanged_set_is_reused_without_building(tmp_path):
    target = interfaces_dir(WAM_DIFF2_CACHE=str(tmp_path))
    (target / "install").mkdir(parents=True)
    out = bash("bash scripts/build_ros_interfaces.sh", WAM_DIFF2_CACHE=str(tmp_path))
    assert out.returncode == 0 and f"up to date: {target}" in out.stdout, out.stdout + out.stderr


def test_a_failed_build_leaves_no_workspace_under_the_key(tmp_path):
    copy = copy_packages(tmp_path / "shared")
    cmake = copy / "build_support" / "ros_environment" / "CMakeLists.txt"
    cmake.write_text("this_is_not_cmake(\n" + cmake.read_text())
    env = {"WAM_DIFF2_ROS_INTERFACES": str(copy), "WAM_DIFF2_CACHE": str(tmp_path / "cache")}
    target = interfaces_dir(**env)
    out = bash("bash scripts/build_ros_interfaces.sh", **env)
    assert out.returncode == 1 and "colcon build failed" in out.stderr, out.stdout + out.stderr
    assert not target.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [f"{target.name}.log"]   # the log, no partial
    assert "ros_environment" in (target.parent / f"{target.name}.log").read_text()


def test_a_missing_shared_folder_is_named(tmp_path):
    out = bash("bash scripts/build_ros_interfaces.sh", WAM_DIFF2_ROS_INTERFACES=str(tmp_path / "nowhere"))
    assert out.returncode == 1 and f"{tmp_path / 'nowhere'}/carla_msgs not found" in out.stderr


@pytest.fixture(autouse=True)
def _needs_shared():
    if not (SHARED / "carla_msgs").is_dir():
        pytest.fail(f"{SHARED} is missing: the upstream interface packages are expected beside the checkout")
