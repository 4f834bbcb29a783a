"""A training run killed with SIGKILL mid-way and resumed with --resume reproduces the loss
curve and the final weights of an uninterrupted run (model, optimizer, scheduler, RNG and
data position restored); the kill leaves no half checkpoint that looks whole."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from test.support import REPO_ROOT as REPO
from test.support.hostile_data import sigkill_when
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.checkpointing import checkpoint_dirs, loss_curve, missing_files, read_metrics
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset

STEPS = 12
KILL_AFTER_CHECKPOINT = "step-000004"


def _command(model, data, out, *extra):
    return [sys.executable, "-m", "wam_diff2_core.trainer", "--log-level", "WARNING",
            "--config", str(REPO / "training" / "block4.yaml"), "--model.path", str(model),
            "--data.train_file", str(data), "--data.data_root", str(data.parent),
            "--data.min_pixels", str(TINY_MIN_PIXELS), "--data.max_pixels", str(TINY_MAX_PIXELS),
            "--train.global_batch_size", "4", "--train.micro_batch_size", "2", "--train.max_steps", str(STEPS),
            "--optim.lr", "2e-3", "--optim.merger_lr", "2e-3", "--output.dir", str(out),
            "--output.save_every_steps", "2", "--output.keep_last", "3", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tiny_checkpoint, tmp_path):
    data = write_tiny_dataset(tmp_path / "data", num_samples=6)
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    # 1. the run that gets killed, as soon as its step-4 checkpoint is complete
    target = killed / "checkpoints" / KILL_AFTER_CHECKPOINT
    sigkill_when(_command(tiny_checkpoint, data, killed), target.exists, what="checkpoint appeared", cwd=REPO,
                 env=_env())
    assert not (killed / "final").exists(), "the run finished before the kill"
    saved = [step for step, _ in checkpoint_dirs(killed)]
    assert saved and saved[-1] < STEPS
    for path in (killed / "checkpoints").iterdir():
        # anything without the hidden partial prefix is a complete checkpoint
        assert path.name.startswith(".") or missing_files(path) is None

    # 2. resume it, and 3. the same run without interruption
    resumed = subprocess.run(_command(tiny_checkpoint, data, killed, "--resume"), cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    from wam_diff2_core.trainer.__main__ import main          # in this process: one launch less
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                    # as OMP_NUM_THREADS=1 in the subprocesses
    try:
        assert main(_command(tiny_checkpoint, data, straight)[3:]) == 0
    finally:
        torch.set_num_threads(threads)

    want = loss_curve(read_metrics(straight))
    got_records = read_metrics(killed)
    assert [r["step"] for r in got_records] == list(range(1, STEPS + 1))   # each step once, none lost
    got = loss_curve(got_records)
    assert sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-7), step
    lrs = {r["step"]: r["lr"] for r in read_metrics(straight)}
    assert {r["step"]: r["lr"] for r in got_records} == pytest.approx(lrs)

    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(killed / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-6


# ---------------------------------------------------------------- resume state without pickles
class _PlantedPayload:
    """Unpickling this creates ``marker``: what an attacker's file in a run folder would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _short_run(tiny_checkpoint, data, out):
    from wam_diff2_core.trainer.recipes import run_stage
    from wam_diff2_core.trainer.training_config import load_training_config
    overrides = _command(tiny_checkpoint, data, out, "--train.max_steps", "4", "--output.save_every_steps", "2")
    return load_training_config(REPO / "training" / "block4.yaml", overrides[7:]), run_stage


def test_resume_state_is_safetensors_and_json_and_resumes_exactly(tiny_checkpoint, tmp_path):
    import shutil
    data = write_tiny_dataset(tmp_path / "data", num_samples=6)
    cfg, run_stage = _short_run(tiny_checkpoint, data, tmp_path / "straight")
    run_stage(cfg)
    state = tmp_path / "straight" / "checkpoints" / "step-000002" / "trainer_state"
    assert sorted(p.name for p in state.iterdir()) == ["optimizer.json", "optimizer.safetensors", "progress.json",
                                                     "rng-0.safetensors", "scheduler.json"]
    # the same run stopped after its step-2 checkpoint: its final/ and later metrics never written
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", resumed)
    shutil.rmtree(resumed / "final")
    records = read_metrics(resumed)
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["step"] <= 2))
    run_stage(cfg.replace(**{"output.dir": str(resumed)}), resume=True)
    assert loss_curve(read_metrics(resumed)) == loss_curve(read_metrics(tmp_path / "straight"))
    a = load_file(str(tmp_path / "straight" / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("planted", ["checkpoints/step-000002/trainer_state/custom_checkpoint_0.pkl",
                                     "checkpoints/step-000002/notes.txt", "metrics.jsonl.bak"])
def test_resume_refuses_a_run_folder_with_a_pickle_and_runs_none_of_it(tiny_checkpoint, tmp_path, planted):
    import pickle
    from wam_diff2_core.config import ConfigError
    data = write_tiny_dataset(tmp_path / "data", num_samples=6)
    out = tmp_path / "run"
    cfg, run_stage = _short_run(tiny_checkpoint, data, out)
    cfg = cfg.replace(**{"train.max_steps": 3})           # step-2 checkpoint, then final/ (removed below)
    run_stage(cfg)
    import shutil
    shutil.rmtree(out / "final")
    marker = tmp_path / "pwned"
    (out / planted).write_bytes(pickle.dumps(_PlantedPayload(marker)))
    with pytest.raises(ConfigError, match=re.escape(str(out / planted)) + ".* is a pickle"):
        run_stage(cfg, resume=True)
    assert not marker.exists()
    assert not (out / "final").exists()                   # refused before anything was read or written
