"""The nodes' console entry points (``wam-diff2-planner``, ``-controller``, ``-localization``); the tools'
(:mod:`.tools.cli`) check the ROS 2 libraries with :func:`import_node_module` too.

``-h`` / ``--help`` (the node module's docstring) and ``--version`` answer without importing rclpy
(arguments after ``--ros-args`` are ROS's). Where the ROS 2 libraries cannot load (rclpy missing, the
messages not built, their typesupport libraries not on the library path: only ``.venv/bin/activate``
sourced) or a Python library the node imports is missing, one line says what to source or install
instead of a traceback. Then the node module's ``main()`` runs with the command line unchanged.
"""
from __future__ import annotations

import ast
import ctypes
import importlib
import importlib.util
import pathlib
import sys

from wam_diff2_core.version import __version__

MESSAGES_PACKAGE = "wam_diff2_ros"
SOURCE_HINT = ("source scripts/env.sh in a checkout set up with `make setup`, or install/setup.bash of the "
               "colcon workspace (after the ROS 2 distribution's setup.bash)")
PIP_HINT = ("install requirements/python.txt into the Python that runs the node and activate it "
            "(docs/install.md: install on a ROS 2 distribution)")
EXIT_NOT_SET_UP = 2
OWN_PACKAGES = ("wam_diff2_core", "wam_diff2_ros")


def own_arguments(argv: list[str]) -> list[str]:
    """The arguments before ``--ros-args`` (those after it are rclpy's)."""
    return argv[:argv.index("--ros-args")] if "--ros-args" in argv else list(argv)


def usage(prog: str, module: str) -> str:
    """Usage line + the node module's docstring, read from its source (importing it would import rclpy)."""
    spec = importlib.util.find_spec(module)
    doc = ast.get_docstring(ast.parse(pathlib.Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return (f"usage: {prog} [-h] [--version] [--ros-args [ROS ARGUMENTS ...]]\n\n{doc}\n\n"
            "options:\n  -h, --help   show this help and exit (no node is started)\n"
            "  --version    print the version and exit\n"
            "  --ros-args   ROS arguments: --params-file FILE, -p NAME:=VALUE, -r FROM:=TO, ...\n")


def typesupport_libraries(msg_package_dir: pathlib.Path) -> list[str]:
    """The package's typesupport libraries the rmw loads by name at run time (lib/ of its prefix:
    <prefix>/lib/pythonX.Y/site-packages/wam_diff2_ros/msg -> <prefix>/lib)."""
    parents = msg_package_dir.parents
    lib = parents[3] if len(parents) > 3 else None
    if lib is None or not lib.is_dir():
        return []
    return sorted(p.name for p in lib.glob(f"lib{MESSAGES_PACKAGE}__rosidl_typesupport_*.so"))


def ros_problem() -> str | None:
    """Why the ROS 2 libraries cannot run this package's nodes here (None: they can)."""
    try:
        import rclpy  # noqa: F401
    except ImportError as exc:
        return f"cannot import rclpy ({exc})"
    try:
        msg = importlib.import_module(f"{MESSAGES_PACKAGE}.msg")
    except ImportError as exc:
        return f"the package's messages ({MESSAGES_PACKAGE}.msg) are not importable ({exc})"
    for name in typesupport_libraries(pathlib.Path(msg.__file__).parent):
        try:     # what the rmw does when the node creates a publisher: dlopen by name
            ctypes.CDLL(name)
        except OSError:
            return f"cannot load {name} (its folder is not on LD_LIBRARY_PATH)"
    return None


def run(prog: str, module: str, argv: list[str] | None = None) -> int:
    own = own_arguments(sys.argv[1:] if argv is None else argv)
    if "-h" in own or "--help" in own:
        print(usage(prog, module), end="")
        return 0
    if "--version" in own:
        print(f"{prog} {__version__}")
        return 0
    node_module = import_node_module(prog, module)
    return node_module if isinstance(node_module, int) else node_module.main()


def import_node_module(prog: str, module: str):
    """``module`` once the ROS 2 libraries and the Python libraries it imports load here; otherwise
    ``EXIT_NOT_SET_UP``, after one line on stderr saying what to source or install."""
    problem = ros_problem()
    if problem is not None:
        print(f"{prog}: {problem}: {SOURCE_HINT}", file=sys.stderr)
        return EXIT_NOT_SET_UP
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in OWN_PACKAGES:
            raise                                            # a bug of ours, not a missing library
        print(f"{prog}: cannot import {exc.name} ({exc}): {PIP_HINT}", file=sys.stderr)
        return EXIT_NOT_SET_UP


def planner() -> int:
    return run("wam-diff2-planner", "wam_diff2_ros.planner.node")


def controller() -> int:
    return run("wam-diff2-controller", "wam_diff2_ros.controller_node")


def localization() -> int:
    return run("wam-diff2-localization", "wam_diff2_ros.localization_node")
