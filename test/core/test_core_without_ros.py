"""The core never imports ROS: every module of ``wam_diff2_core`` imports, and ``--help`` of every
``wam-diff2`` subcommand (and of ``python -m wam_diff2_core.trainer``) runs, in an interpreter where
rclpy, every ROS package of the ament index (std_msgs, sensor_msgs, nav_msgs, geometry_msgs, ...)
and this package's messages (``wam_diff2_ros``) cannot be imported.

The blocking is a meta-path finder installed first in a fresh interpreter, so an import of any of
them, at module level or inside a function run by ``--help``, raises ImportError there; a core that
caught that ImportError and carried on would still be caught by the check that no blocked import
was even attempted.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from test.support import REPO_ROOT as ROOT

# always blocked, whatever the ament index of this machine holds
ROS_NAMES = ("rclpy", "rosidl_runtime_py", "rosidl_parser", "rpyutils", "builtin_interfaces", "std_msgs",
             "sensor_msgs", "nav_msgs", "geometry_msgs", "diagnostic_msgs", "rosgraph_msgs", "lifecycle_msgs",
             "visualization_msgs", "carla_msgs", "vision_msgs", "launch", "launch_ros", "ament_index_python",
             "wam_diff2_ros")

PROBE = r"""
import contextlib, importlib, io, json, os, pkgutil, runpy, sys
from pathlib import Path

BLOCKED = set(json.loads(sys.argv[1]))
attempts = []

class NoRos:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ImportError(f"{name} is blocked: the core must not import ROS")
        return None

sys.meta_path.insert(0, NoRos())
import wam_diff2_core
from wam_diff2_core.cli import SUBCOMMANDS, build_parser

modules, mains = ["wam_diff2_core"], []
for info in pkgutil.walk_packages(wam_diff2_core.__path__, "wam_diff2_core."):
    if info.name.endswith(".__main__"):
        mains.append(info.name.removesuffix(".__main__"))
    else:
        importlib.import_module(info.name)
        modules.append(info.name)

def help_of(run):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            run()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
    return out.getvalue()

helps = {name: help_of(lambda: build_parser().parse_args([name, "--help"])) for name in SUBCOMMANDS}
for package in mains:             # python -m wam_diff2_core.cli / .trainer
    sys.argv = [package, "--help"]
    helps["-m " + package] = help_of(lambda: runpy.run_module(package, run_name="__main__", alter_sys=True))
print(json.dumps({"modules": modules, "mains": mains, "helps": helps, "attempts": attempts,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
"""


def core_sources() -> list[Path]:
    return sorted((ROOT / "wam_diff2_core").rglob("*.py"))


def test_every_core_module_and_subcommand_help_runs_without_ros(ament_packages):
    blocked = sorted(set(ROS_NAMES) | ament_packages)
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(blocked)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    expected = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                for p in core_sources() if p.name != "__main__.py"}
    assert set(found["modules"]) == expected                 # every module, none skipped
    assert sorted(found["mains"]) == ["wam_diff2_core.cli", "wam_diff2_core.params", "wam_diff2_core.trainer"]
    assert found["attempts"] == [] and found["loaded"] == []  # not even a guarded try
    from wam_diff2_core.cli import SUBCOMMANDS
    for name in SUBCOMMANDS:
        assert found["helps"][name].startswith(f"usage: wam-diff2 {name}"), name
    assert found["helps"]["-m wam_diff2_core.trainer"].startswith("usage: python -m wam_diff2_core.trainer")
    assert found["helps"]["-m wam_diff2_core.cli"].startswith("usage: wam-diff2")
    assert found["helps"]["-m wam_diff2_core.params"].startswith("usage: python -m wam_diff2_core.params")


def test_the_probe_would_see_a_ros_import():
    """The same finder stops a module that imports rclpy (so the test above can fail)."""
    code = PROBE.split("import wam_diff2_core\n")[0] + "import rclpy\n"
    out = subprocess.run([sys.executable, "-c", code, json.dumps(["rclpy"])], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "rclpy is blocked" in out.stderr


def test_no_core_module_mentions_rclpy():
    mentions = [f"{p.relative_to(ROOT)}:{i}" for p in core_sources()
                for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                if re.search(r"\brclpy\b", line)]
    assert not mentions, mentions


def test_no_core_module_imports_ros_even_inside_a_function(ament_packages):
    """Imports the run-time probe cannot reach (inside functions that --help never calls), read with ast.
    Before the ROS tools moved out, cli/replay.py and cli/closed_loop.py imported wam_diff2_ros here."""
    import ast
    blocked = set(ROS_NAMES) | ament_packages
    found = []
    for path in core_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in blocked]
    assert not found, found
