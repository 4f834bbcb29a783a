"""Crash-safe checkpoints: a checkpoint counts as complete only while every file its progress.json
lists exists; pruning renames before it deletes, so a kill mid-prune never leaves a half-deleted
checkpoint that resume would trust (it once left step-000003 without its weights, still "complete")."""
from __future__ import annotations

import os
import shutil

import pytest

from wam_diff2_core.trainer import checkpointing
from wam_diff2_core.trainer.checkpointing import (CHECKPOINTS, begin_partial, checkpoint_dirs, latest_checkpoint,
                                                  prune_checkpoints, publish, step_dir_name, write_progress)

# what a training checkpoint holds (finetune.save_checkpoint: the Hugging Face part + trainer_state.py)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja",
         "trainer_state/optimizer.safetensors", "trainer_state/optimizer.json", "trainer_state/scheduler.json",
         "trainer_state/rng-0.safetensors")


def _save(run, step: int):
    """A checkpoint written the way the recipe writes one: hidden partial dir, progress last, rename."""
    final = run / CHECKPOINTS / step_dir_name(step)
    tmp = begin_partial(final)
    for name in FILES:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(os.urandom(64))
    write_progress(tmp, {"step": step})
    publish(tmp, final)
    return final


def test_a_checkpoint_missing_a_file_is_not_complete_and_resume_takes_the_previous(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path, step)
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [2, 4, 6]
    (tmp_path / CHECKPOINTS / "step-000006" / "model.safetensors").unlink()
    (tmp_path / CHECKPOINTS / "step-000004" / "trainer_state" / "optimizer.safetensors").unlink()
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [2]
    assert latest_checkpoint(tmp_path) == tmp_path / CHECKPOINTS / "step-000002"


def test_a_kill_mid_prune_leaves_no_half_checkpoint_that_looks_whole(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    real_unlink = os.unlink

    def killed_after_one_file(path, *args, **kwargs):     # rmtree's first unlink, then the process dies
        real_unlink(path, *args, **kwargs)
        raise SystemExit("killed mid-prune")

    monkeypatch.setattr(os, "unlink", killed_after_one_file)
    with pytest.raises(SystemExit):
        prune_checkpoints(tmp_path, keep_last=2)
    monkeypatch.setattr(os, "unlink", real_unlink)
    # the half-deleted step-000001 is not listed, whichever of its files went first
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [2, 3]
    assert latest_checkpoint(tmp_path) == tmp_path / CHECKPOINTS / "step-000003"
    leftovers = [p.name for p in (tmp_path / CHECKPOINTS).iterdir() if p.name.startswith(".")]
    assert leftovers == [".step-000001.pruned"]
    _save(tmp_path, 4)
    prune_checkpoints(tmp_path, keep_last=2)             # the next prune also removes what the kill left
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step-000003", "step-000004"]


def test_a_checkpoint_written_before_progress_listed_its_files_needs_its_weights(tmp_path):
    final = _save(tmp_path, 5)
    progress = final / "trainer_state" / "progress.json"
    progress.write_text('{"step": 5}')                   # the older format, without "files"
    assert checkpoint_dirs(tmp_path) == [(5, final)]
    (final / "model.safetensors").unlink()
    assert checkpoint_dirs(tmp_path) == []
    shutil.rmtree(final / "trainer_state")
    assert checkpoint_dirs(tmp_path) == []


def test_pruning_keeps_the_newest_complete_ones(tmp_path):
    for step in range(1, 6):
        _save(tmp_path, step)
        prune_checkpoints(tmp_path, keep_last=2)
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [4, 5]
    assert not [p for p in (tmp_path / CHECKPOINTS).iterdir() if p.name.startswith(".")]
    assert checkpointing.missing_files(tmp_path / CHECKPOINTS / "step-000005") is None
