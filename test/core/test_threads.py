"""Every `wam-diff2` subcommand that runs a model takes --threads (the planner node's
engine.cpu_threads, one flag helper); 0 = OMP_NUM_THREADS when set, else the process's CPU
affinity (not the machine's core count), applied with torch.set_num_threads."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test.support import REPO_ROOT as REPO
from wam_diff2_core.cli import SUBCOMMANDS, build_parser
from wam_diff2_core.config import ENGINE_FIELDS

RUNS_A_MODEL = {"infer", "bench", "val-loss", "eval-bag", "closed-loop"}


def test_every_command_that_runs_a_model_has_threads_with_the_engines_default():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in RUNS_A_MODEL:
        assert name in SUBCOMMANDS
        action = sub.choices[name]._option_string_actions.get("--threads")
        assert action is not None, name
        assert action.dest == "cpu_threads" and action.default == ENGINE_FIELDS["cpu_threads"].default, name
        assert "--cpu-threads" not in sub.choices[name]._option_string_actions, name   # one spelling


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
@pytest.mark.parametrize("omp, want", [(None, "1"), ("3", "3")])
def test_the_default_is_omp_num_threads_else_the_affinity_not_the_core_count(omp, want):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    code = ("import os, torch; from wam_diff2_core.config import apply_cpu_threads; "
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); torch.set_num_threads(7); "
            "print(apply_cpu_threads(0), torch.get_num_threads(), os.cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out[:2] == [want, want]


def test_a_negative_thread_count_names_the_setting():
    from wam_diff2_core.config import ConfigError, apply_cpu_threads
    with pytest.raises(ConfigError, match="cpu_threads: -1 is below 0"):
        apply_cpu_threads(-1)
