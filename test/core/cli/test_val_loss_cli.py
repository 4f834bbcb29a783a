"""`wam-diff2 val-loss`: the fixed-noise objective on held-out samples, and a teacher's rho_5."""
from __future__ import annotations

import json

import pytest

from wam_diff2_core.cli import main
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build_tiny_checkpoint
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("val-data"), num_samples=4)


def val_loss(*args) -> int:
    """The command line in this process (the checkpoints load in milliseconds, a new interpreter in seconds)."""
    return main(["val-loss", "--device", "cpu", "--dtype", "float32", "--min-pixels", str(TINY_MIN_PIXELS),
                 "--max-pixels", str(TINY_MAX_PIXELS), *map(str, args)])


def test_val_loss_is_reproducible_and_counts_samples(tiny_checkpoint, data_file, tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert val_loss("--model", tiny_checkpoint, "--data", data_file, "--limit", 3, "--rounds", 2, "--json", first) == 0
    out = capsys.readouterr().out
    val_loss("--model", tiny_checkpoint, "--data", data_file, "--limit", 3, "--rounds", 2, "--json", second)
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["samples"] == 3 and a["rounds"] == 2 and a["ce"] > 0
    assert a["ce"] == b["ce"]                                   # the same noise draws
    assert "val-loss: 3 samples x 2 noise draws" in out and "teacher" not in a


def test_a_teacher_identical_to_the_model_agrees_fully(tiny_checkpoint, data_file, tmp_path):
    figures = tmp_path / "t.json"
    val_loss("--model", tiny_checkpoint, "--data", data_file, "--teacher", tiny_checkpoint, "--json", figures)
    same = json.loads(figures.read_text())
    assert same["top5_overlap"] == pytest.approx(1.0) and same["divergence"] == pytest.approx(0.0, abs=1e-5)
    other = build_tiny_checkpoint(tmp_path / "other", seed=7)            # another random model
    val_loss("--model", tiny_checkpoint, "--data", data_file, "--teacher", other, "--loss", "forward_kl",
             "--json", figures)
    different = json.loads(figures.read_text())
    assert different["loss"] == "forward_kl" and different["divergence"] > 0.01
    assert different["top5_overlap"] < 0.9


def test_bad_settings_are_named(tiny_checkpoint, data_file, capsys):
    assert val_loss("--model", tiny_checkpoint, "--data", data_file, "--rounds", 0) == 2
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
