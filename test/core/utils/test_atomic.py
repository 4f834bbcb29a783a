"""Atomic writes publish with the modes a plain mkdir() / open() gives, not tempfile's private ones."""
from __future__ import annotations

import os
import stat

import pytest

from wam_diff2_core.utils.atomic import atomic_directory, atomic_write_json


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_published_directories_and_files_get_the_modes_of_plain_ones(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out / "checkpoint") as tmp:
        (tmp / "weights.bin").write_bytes(b"x")
    atomic_write_json(out / "summary.json", {"a": 1})
    (tmp_path / "plain_dir").mkdir()
    (tmp_path / "plain_file").write_text("{}")
    assert mode(out / "checkpoint") == mode(tmp_path / "plain_dir") != 0o700      # 0o755 under umask 022
    assert mode(out / "summary.json") == mode(tmp_path / "plain_file") != 0o600
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "summary.json"]   # no partials


def test_a_failed_directory_write_leaves_the_old_one(tmp_path):
    with atomic_directory(tmp_path / "out") as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "out", overwrite=True) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("interrupted")
    assert (tmp_path / "out" / "a").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out"]
