"""Run state outside the work tree: the cache root and the run folders, their environment variables in the shell's
order (an empty one is unset), a bad run name refused naming it, and the command line the scripts call."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wam_diff2_core.utils.cache_dirs import cache_root, run_dir, runs_root


def test_the_cache_root_is_wam_diff2_cache_then_xdg_then_home(tmp_path):
    home = {"HOME": str(tmp_path / "home")}
    assert cache_root(home) == tmp_path / "home" / ".cache" / "wam-diff2"
    assert cache_root({**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg" / "wam-diff2"
    assert cache_root({**home, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "WAM_DIFF2_CACHE": str(tmp_path / "c")}) \
        == tmp_path / "c"
    assert cache_root({**home, "WAM_DIFF2_CACHE": "", "XDG_CACHE_HOME": ""}) == cache_root(home)   # empty = unset


def test_runs_live_under_the_cache_unless_wam_diff2_runs_moves_them(tmp_path):
    env = {"WAM_DIFF2_CACHE": str(tmp_path / "c")}
    assert runs_root(env) == tmp_path / "c" / "runs"
    assert run_dir("demo", env) == tmp_path / "c" / "runs" / "demo"
    assert run_dir("demo", {**env, "WAM_DIFF2_RUNS": str(tmp_path / "r")}) == tmp_path / "r" / "demo"
    relative = run_dir("demo", {"WAM_DIFF2_RUNS": "here"})
    assert relative.is_absolute() and relative == Path.cwd() / "here" / "demo"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../demo", "/abs", "-x", "a b"])
def test_a_run_name_that_is_not_one_folder_name_is_refused(name):
    with pytest.raises(ValueError, match="run name .*one folder name"):
        run_dir(name, {"WAM_DIFF2_CACHE": "/tmp/c"})


def test_the_command_line_prints_the_folder_and_refuses_a_bad_name(tmp_path):
    env = {"WAM_DIFF2_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "wam_diff2_core.utils.cache_dirs"]
    done = subprocess.run([*command, "runs", "demo"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"{tmp_path / 'runs' / 'demo'}\n"
    assert subprocess.run([*command, "root"], env=env, capture_output=True, text=True,
                          timeout=60).stdout == f"{tmp_path}\n"
    bad = subprocess.run([*command, "runs", "../x"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "run name '../x'" in bad.stderr
