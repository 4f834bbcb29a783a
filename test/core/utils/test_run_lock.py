"""One writer per run folder (utils/run_lock.py): a second `train` or `infer --output` started while
the first is alive fails fast naming the holder's PID; a lock left by a killed run is taken over
with a log line; a finished run leaves no lock file. Every holder here is a real process."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test.support import REPO_ROOT as REPO
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset
from wam_diff2_core.utils.run_lock import RUN_LOCK, RunLock, RunLocked

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": str(REPO)}
HOLD = "import sys, time; from wam_diff2_core.utils.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); " \
       "print('held', flush=True); time.sleep(300)"


def _holder(lock: Path) -> subprocess.Popen:
    """A process that takes ``lock`` and keeps it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, env=ENV, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_held_lock_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    lock = tmp_path / "run" / RUN_LOCK
    holder = _holder(lock)
    try:
        with pytest.raises(RunLocked, match=f"in use by process {holder.pid} on "):
            RunLock(lock).acquire()
    finally:
        _kill(holder)                                        # a crash: the file stays, its flock is gone
    assert lock.read_text().startswith(f"{holder.pid} on ")
    with caplog.at_level(logging.WARNING, logger="wam_diff2_core.utils.run_lock"):
        with RunLock(lock):
            assert lock.read_text().startswith(f"{os.getpid()} on ")
    assert f"took over the lock of process {holder.pid} on " in caplog.text
    assert not lock.exists()                                 # released: removed


def _train_command(model, data, out, steps):
    return [sys.executable, "-m", "wam_diff2_core.trainer", "--log-level", "WARNING",
            "--config", str(REPO / "training" / "block4.yaml"), "--model.path", str(model),
            "--data.train_file", str(data), "--data.data_root", str(data.parent),
            "--data.min_pixels", str(TINY_MIN_PIXELS), "--data.max_pixels", str(TINY_MAX_PIXELS),
            "--train.global_batch_size", "2", "--train.micro_batch_size", "2", "--train.max_steps", str(steps),
            "--output.dir", str(out), "--output.save_every_steps", "1"]


@pytest.mark.slow
def test_a_second_trainer_on_a_live_run_fails_fast_and_the_first_finishes(tiny_checkpoint, tmp_path):
    """Before: a --resume started beside a live run raced its checkpoint pruning."""
    data = write_tiny_dataset(tmp_path / "data", num_samples=2)
    out = tmp_path / "run"
    first = subprocess.Popen(_train_command(tiny_checkpoint, data, out, 40), cwd=REPO, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints").is_dir():             # the first run is training
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        second = subprocess.run(_train_command(tiny_checkpoint, data, out, 40) + ["--resume"], cwd=REPO, env=ENV,
                                capture_output=True, text=True, timeout=240)
        assert first.poll() is None, "the first run ended before the second was refused"
        assert second.returncode == 2
        assert f"run folder is in use by process {first.pid} on " in second.stderr
        assert time.monotonic() - started < 60                # before any model is loaded
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            _kill(first)
    assert (out / "final").is_dir() and not (out / RUN_LOCK).exists()


def test_infer_refuses_an_output_another_process_writes(tmp_path, capsys):
    from wam_diff2_core.cli import main
    output = tmp_path / "preds.json"
    samples = tmp_path / "eval.jsonl"
    samples.write_text(json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    holder = _holder(output.with_name("preds.json.lock"))
    try:
        assert main(["infer", "--model", str(tmp_path / "no-model"), "--input", str(samples), "--output",
                     str(output), "--device", "cpu"]) == 2
    finally:
        _kill(holder)
    assert f"output is in use by process {holder.pid} on " in capsys.readouterr().err
    assert not output.exists() and not output.with_name("preds.json.partial.jsonl").exists()   # nothing touched
