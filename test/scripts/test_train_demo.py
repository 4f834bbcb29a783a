"""scripts/train_demo.sh (make train-demo), the CPU recipe: its run state lives in the user's cache, outside the
work tree, so a run stopped in one session continues in the next on the same machine (RUNS= names another
folder). The recipe itself is hours of CPU; its stages' skip-and-resume is what scripts/train_device.py's CPU twin
exercises (test_train_device.py), and the trainer's --resume has its own kill-and-resume test."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from test.support import REPO_ROOT as ROOT


@pytest.mark.parametrize("runs", [None, "elsewhere"])
def test_the_cpu_recipe_keeps_its_run_state_outside_the_work_tree(tmp_path, runs):
    env = {**os.environ, "WAM_DIFF2_CACHE": str(tmp_path / "cache")}
    for name in ("RUNS", "WAM_DIFF2_RUNS"):
        env.pop(name, None)
    if runs:
        env["RUNS"] = str(tmp_path / runs)
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "train_demo.sh")], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        first = proc.stdout.readline()           # printed before any work starts
    finally:
        os.killpg(proc.pid, signal.SIGKILL)      # the recipe would go on for hours
        proc.wait(timeout=60)
    expected = tmp_path / runs if runs else tmp_path / "cache" / "runs" / "demo"
    assert first == f"train_demo: run state in {expected}\n"
