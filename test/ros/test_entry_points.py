"""The console entry points: --help and --version without a node, one source for the version, and
one line saying what to source (not a typesupport traceback) where the ROS 2 libraries cannot load.

Each runs as its own process, as a user starts it: the console scripts of the venv, with either
this checkout's environment (scripts/env.sh, as `make test` runs) or only `.venv/bin/activate`
sourced (the Python habit).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.version import __version__
from wam_diff2_ros import entry_point

BIN = Path(sys.executable).parent
NODES = {"wam-diff2-planner": "wam_diff2_ros.planner.node", "wam-diff2-controller": "wam_diff2_ros.controller_node",
         "wam-diff2-localization": "wam_diff2_ros.localization_node"}
TIMEOUT_S = 120


def run(cmd: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)


def venv_only_env() -> dict[str, str]:
    """What `. .venv/bin/activate` leaves in a clean login environment (no scripts/env.sh)."""
    venv = ROOT / ".venv"
    clean = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    out = subprocess.run(["bash", "-c", f". {venv}/bin/activate && env -0"], env=clean, capture_output=True,
                         timeout=TIMEOUT_S, check=True).stdout.decode()
    env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    assert "AMENT_PREFIX_PATH" not in env and "LD_LIBRARY_PATH" not in env and env["VIRTUAL_ENV"] == str(venv)
    return env


@pytest.mark.parametrize("prog", sorted(NODES))
def test_help_prints_the_usage_and_the_node_documentation_without_rclpy(prog):
    out = run([str(BIN / prog), "--help"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {prog} [-h] [--version] [--ros-args")
    doc = entry_point.usage(prog, NODES[prog])
    first_line = doc.split("\n\n")[1].splitlines()[0]
    assert first_line in out.stdout and "--ros-args" in out.stdout
    # no node: rclpy is never imported (the same function, in a fresh interpreter)
    probe = run([sys.executable, "-c", "import sys; from wam_diff2_ros.entry_point import run; "
                 f"code = run({prog!r}, {NODES[prog]!r}, ['-h']); print('rclpy' in sys.modules, code)"])
    assert probe.stdout.strip().splitlines()[-1] == "False 0", probe.stderr


@pytest.mark.parametrize("prog", ["wam-diff2", "wam-diff2-ros", *sorted(NODES)])
def test_every_entry_point_prints_the_one_version(prog):
    out = run([str(BIN / prog), "--version"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{prog} {__version__}"


def test_arguments_after_ros_args_belong_to_ros():
    assert entry_point.own_arguments(["--ros-args", "-p", "model_path:=--help"]) == []
    assert entry_point.own_arguments(["--version", "--ros-args", "-p", "x:=1"]) == ["--version"]
    assert entry_point.own_arguments([]) == []


def test_the_ros_check_passes_where_the_nodes_run():
    # this process has scripts/env.sh's environment, in which every ROS test starts nodes
    out = run([sys.executable, "-c", "from wam_diff2_ros.entry_point import ros_problem; print(ros_problem())"])
    assert out.stdout.strip() == "None", out.stdout + out.stderr


@pytest.mark.parametrize("prog", sorted(NODES))
def test_with_only_the_venv_activated_the_nodes_stop_with_one_line(prog, tmp_path):
    """Before: each node died with an RCLError traceback (dlopen of the messages' typesupport)."""
    env = venv_only_env()
    out = run([str(ROOT / ".venv" / "bin" / prog), "--ros-args", "-p", "use_sim_time:=true"], env=env,
              cwd=tmp_path)
    assert out.returncode == entry_point.EXIT_NOT_SET_UP, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"{prog}: cannot load libwam_diff2_ros__rosidl_typesupport_")
    assert "source scripts/env.sh" in lines[0] and "install/setup.bash" in lines[0]
    assert out.stdout == ""
    # --help, --version and the ROS-free command still work there
    assert run([str(ROOT / ".venv" / "bin" / prog), "--version"], env=env).stdout.strip() == f"{prog} {__version__}"
    assert run([str(ROOT / ".venv" / "bin" / prog), "-h"], env=env).returncode == 0


def test_with_only_the_venv_activated_the_ros_tools_stop_with_one_line(tmp_path):
    env = venv_only_env()
    tools = str(ROOT / ".venv" / "bin" / "wam-diff2-ros")
    out = run([tools, "replay", str(tmp_path / "bag")], env=env, cwd=tmp_path)
    assert out.returncode == entry_point.EXIT_NOT_SET_UP and out.stdout == "", out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wam-diff2-ros replay: cannot load libwam_diff2_ros__rosidl_"), \
        out.stderr
    assert "source scripts/env.sh" in lines[0]
    for sub in ("replay", "closed-loop"):      # the tools' usage needs no ROS
        assert run([tools, sub, "--help"], env=env).stdout.startswith(f"usage: wam-diff2-ros {sub}")


def test_with_only_the_venv_activated_the_tools_command_works():
    env = venv_only_env()
    out = run([str(ROOT / ".venv" / "bin" / "wam-diff2"), "--version"], env=env)
    assert out.returncode == 0 and out.stdout.strip() == f"wam-diff2 {__version__}", out.stderr


def test_the_tools_help_needs_no_opencv_and_states_the_loop_defaults():
    """``wam-diff2-ros --help`` works anywhere: the closed loop's options come without the demo world (cv2)."""
    from wam_diff2_core.sim.protocol import LOCKSTEP_N, ROUTE_LENGTH_M
    from wam_diff2_core.sim.world import WorldSettings

    code = ("import sys; sys.modules['cv2'] = None; sys.argv = ['wam-diff2-ros', 'closed-loop', '--help']; "
            "from wam_diff2_ros.tools.cli import main; sys.exit(main())")
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    hz = round(1.0 / (WorldSettings().dt_s * LOCKSTEP_N))
    assert f"(default {LOCKSTEP_N}: {hz} Hz)" in text and f"(default {ROUTE_LENGTH_M:g} m)" in text, text


def test_without_rclpy_the_nodes_stop_with_one_line():
    code = ("import sys; sys.modules['rclpy'] = None; sys.argv = ['wam-diff2-planner']; "
            "from wam_diff2_ros.entry_point import planner; sys.exit(planner())")
    out = run([sys.executable, "-c", code])
    assert out.returncode == entry_point.EXIT_NOT_SET_UP
    assert re.fullmatch(r"wam-diff2-planner: cannot import rclpy \(.+\): source scripts/env\.sh .+\n", out.stderr), \
        out.stderr


# only the planner runs the model; the controller's and the localization node's parameter tables
# (wam_diff2_core.params) need no torch, so those two run where it is missing
@pytest.mark.parametrize("prog", ["wam-diff2-planner"])
def test_without_the_pip_requirements_the_nodes_stop_with_one_line(prog):
    # an interpreter where torch is missing (a ROS shell whose venv is not activated)
    code = (f"import sys; sys.modules['torch'] = None; sys.argv = [{prog!r}]; "
            f"from wam_diff2_ros.entry_point import {prog.removeprefix('wam-diff2-')} as main; sys.exit(main())")
    out = run([sys.executable, "-c", code])
    assert out.returncode == entry_point.EXIT_NOT_SET_UP, out.stderr[-3000:]
    assert re.fullmatch(rf"{prog}: cannot import torch \(.+\): install requirements/python\.txt .+\n", out.stderr), \
        out.stderr


def test_the_controller_and_the_localization_node_need_no_torch():
    code = ("import sys; sys.modules['torch'] = None; import wam_diff2_ros.controller_node, "
            "wam_diff2_ros.localization_node; print(sorted(m for m in sys.modules if m.startswith('transformers')))")
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-3000:]


def test_entry_points_are_wired_to_the_nodes():
    setup_py = (ROOT / "setup.py").read_text()
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for prog, module in NODES.items():
        func = prog.removeprefix("wam-diff2-")
        assert f'"{prog}=wam_diff2_ros.entry_point:{func}"' in setup_py
        script = ROOT / "scripts" / "ros2_run" / prog
        assert script.stat().st_mode & 0o111 and f"from wam_diff2_ros.entry_point import {func}" in script.read_text()
        assert f"scripts/ros2_run/{prog}" in cmake
        # the function runs that node module's main()
        assert f'run("{prog}", "{module}")' in (ROOT / "wam_diff2_ros" / "entry_point.py").read_text()
    assert '"wam-diff2=wam_diff2_core.cli:main"' in setup_py and "scripts/ros2_run/wam-diff2 " in cmake
    assert '"wam-diff2-ros=wam_diff2_ros.tools.cli:main"' in setup_py and "scripts/ros2_run/wam-diff2-ros" in cmake
    assert "from wam_diff2_ros.tools.cli import main" in (ROOT / "scripts" / "ros2_run" / "wam-diff2-ros").read_text()
