"""Where state that outlives a session lives: the user's cache, outside the checkout.

    python -m wam_diff2_core.utils.cache_dirs runs demo       # ~/.cache/wam-diff2/runs/demo
    run_dir("device-demo")                                    # the same from Python

The cache root is ``$WAM_DIFF2_CACHE``, else ``$XDG_CACHE_HOME/wam-diff2``, else ``~/.cache/wam-diff2`` (an empty
variable counts as unset, as in the shell's ``${VAR:-...}``; ``scripts/ros_interfaces.sh`` builds the ROS
interface packages under the same root). Training runs live in ``<root>/runs/<name>`` (``$WAM_DIFF2_RUNS`` moves
every run), so ``make train-demo`` stopped in one session continues in the next on the same machine, where a run
folder inside the work tree would not survive a fresh checkout.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Mapping

CACHE_ENV = "WAM_DIFF2_CACHE"
RUNS_ENV = "WAM_DIFF2_RUNS"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The cache root (module docstring), absolute."""
    cache = environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME") or Path.home()) / ".cache"
    return Path(environ.get(CACHE_ENV) or Path(cache) / "wam-diff2").expanduser().absolute()


def runs_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The folder that holds every run folder: ``$WAM_DIFF2_RUNS``, else ``<cache root>/runs``."""
    runs = environ.get(RUNS_ENV)
    return Path(runs).expanduser().absolute() if runs else cache_root(environ) / "runs"


def run_dir(name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """The run folder ``name`` (one folder name: letters, digits, '.', '_', '-'); ValueError naming a bad one."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"run name {name!r}: give one folder name of letters, digits, '.', '_' and '-' "
                         "(it is placed under the runs folder)")
    return runs_root(environ) / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_diff2_core.utils.cache_dirs",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("root", help="print the cache root")
    runs = sub.add_parser("runs", help="print the run folder NAME")
    runs.add_argument("name")
    args = parser.parse_args(argv)
    try:
        print(cache_root() if args.what == "root" else run_dir(args.name))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
