"""Fuzz-style: one samples file mixing every kind of bad record (an oversized image, an undecodable
one, a missing one, a non-object record, a broken line, wrong field types, a duplicate id, a
placeholder/image count mismatch) with good samples. Through ``wam-diff2 infer`` (uninterrupted,
and killed with SIGKILL mid-run then ``--resume``d) every good sample decodes and every bad record
gets its own error naming it; through training the bad ones are reported and skipped and the run
completes."""
from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from test.support import REPO_ROOT as REPO
from test.support.hostile_data import BAD_CASES, GOOD_IDS, sigkill_when, write_hostile_dataset
from wam_diff2_core.cli import main
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.checkpointing import read_metrics

INFER_FLAGS = ["--device", "cpu", "--max-new-tokens", "24"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    return write_hostile_dataset(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_checkpoint, hostile, tmp_path_factory):
    """One uninterrupted infer run over the hostile file: (exit status, records, log text)."""
    out = tmp_path_factory.mktemp("straight") / "preds.json"
    handler = _Collect()
    logging.getLogger("wam_diff2_core").addHandler(handler)
    try:
        code = main(_infer_args(tiny_checkpoint, hostile, out))
    finally:
        logging.getLogger("wam_diff2_core").removeHandler(handler)
    return code, json.loads(out.read_text()), "\n".join(handler.lines)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _infer_args(ckpt, data, out, *extra):
    return ["infer", "--model", str(ckpt), "--input", str(data), "--output", str(out), *INFER_FLAGS, *extra]


def _check_records(records: list[dict]) -> None:
    """Every good sample decoded once, every bad record its own error, in input order."""
    good = [r for r in records if "prediction" in r]
    assert [r["id"] for r in good] == list(GOOD_IDS)
    assert all(r["stats"]["tokens"] >= 1 and "error" not in r for r in good)
    errors = [r for r in records if "error" in r]
    assert len(records) == 15 and len(errors) == 11                  # 15 lines: 4 good, 11 bad records
    assert [r["line"] for r in records] == list(range(1, 16))
    for r in errors:
        assert r["error"].startswith(f"sample {r['id']} (line {r['line']}): "), r
        assert BAD_CASES[r["id"]] in r["error"], r
    assert sorted({r["id"] for r in errors}) == sorted(BAD_CASES)
    assert [r["line"] for r in errors if r["id"] == "twice"] == [9, 11]     # both records of the duplicate id


def _decoded(records: list[dict]) -> dict[str, str]:
    return {r["id"]: r["prediction"] for r in records if "prediction" in r}


def test_infer_decodes_every_good_sample_and_gives_every_bad_record_its_error(uninterrupted):
    code, records, log_text = uninterrupted
    assert code == 0
    _check_records(records)
    assert "8 of 15 records refused up front" in log_text           # the ones no image is needed to refuse


def test_infer_killed_mid_run_then_resumed_gives_the_uninterrupted_result(tiny_checkpoint, hostile, tmp_path,
                                                                          uninterrupted):
    out = tmp_path / "killed.json"
    partial = tmp_path / "killed.json.partial.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    sigkill_when([sys.executable, "-m", "wam_diff2_core.cli", *_infer_args(tiny_checkpoint, hostile, out)],
                 lambda: partial.exists() and "prediction" in partial.read_text(),    # one good sample decoded
                 what="decoded sample", cwd=REPO, env=env)
    assert not out.exists()
    left = partial.read_text().splitlines()
    assert 0 < len(left) < 7                                          # 7 samples need their images read

    assert main(_infer_args(tiny_checkpoint, hostile, out, "--resume")) == 0
    records = json.loads(out.read_text())
    _check_records(records)
    assert _decoded(records) == _decoded(uninterrupted[1])
    assert not partial.exists()


@pytest.mark.slow
def test_training_on_hostile_data_reports_every_bad_record_and_completes(tiny_checkpoint, hostile, tmp_path, caplog):
    from wam_diff2_core.trainer.__main__ import main as train_main

    out = tmp_path / "run"
    argv = ["--log-level", "WARNING", "--config", str(REPO / "training" / "block4.yaml"),
            "--model.path", str(tiny_checkpoint), "--data.train_file", str(hostile),
            "--data.data_root", str(hostile.parent), "--data.min_pixels", str(TINY_MIN_PIXELS),
            "--data.max_pixels", str(TINY_MAX_PIXELS), "--train.global_batch_size", "6",
            "--train.micro_batch_size", "2", "--train.max_steps", "2", "--data.shuffle", "false",
            "--output.dir", str(out), "--threads", "1"]
    import torch
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING):
            assert train_main(argv) == 0
        assert torch.get_num_threads() == 1                     # --threads, as every command that runs a model
    finally:
        torch.set_num_threads(threads)
    assert (out / "final" / "model.safetensors").is_file()
    # found while reading (logged once at start) or while encoding (logged and listed per step)
    for sample_id, reason in BAD_CASES.items():
        assert f"sample {sample_id} (line" in caplog.text and reason in caplog.text, sample_id
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:          # the 6 readable records, one epoch per step: the 2 bad images skipped
        assert sorted(r["skipped"]) == ["oversized", "undecodable"] and r["samples"] == 4
