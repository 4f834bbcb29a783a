"""Run directories (``config.yaml``, ``metrics.jsonl``, ``checkpoints/step-N/``, ``final/``), atomic
checkpoints and the metrics file; what each holds and why a killed run, resume or prune never leaves a
checkpoint that looks whole but is not: training/README.md, Outputs.

    tmp = begin_partial(final); ...; write_progress(tmp, {"step": 500}); publish(tmp, final)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

from ..utils.atomic import atomic_write_text

CHECKPOINTS = "checkpoints"
FINAL = "final"
METRICS = "metrics.jsonl"
TRAINER_STATE = "trainer_state"
PROGRESS = "progress.json"
FILES = "files"              # progress.json: every file of the checkpoint (relative paths)
PRUNED = ".pruned"           # suffix of a checkpoint being deleted
_STEP_DIR = re.compile(r"^step-(\d+)$")
log = logging.getLogger(__name__)


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial")


def begin_partial(final: Path) -> Path:
    """A fresh hidden directory to write ``final`` into (any stale one is removed)."""
    tmp = partial_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, final: Path) -> None:
    """Rename a complete ``tmp`` to ``final`` (replacing an older ``final``)."""
    for path in tmp.rglob("*"):
        if path.is_file():
            _fsync(path)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    _fsync(final.parent, folder=True)


def _fsync(path: Path, *, folder: bool = False) -> None:
    """Flush a file to disk; a folder's entries too where the system can (no error where it cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not folder:
            raise


def checkpoint_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete resumable checkpoints, oldest first (an incomplete ``step-N`` is skipped with a warning)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if not (match and child.is_dir()):
            continue
        if missing := missing_files(child):
            log.warning("%s is incomplete (%s missing): not resumed from", child, missing)
            continue
        found.append((int(match.group(1)), child))
    return sorted(found)


def missing_files(checkpoint: Path) -> str | None:
    """What is missing from a checkpoint directory (None when it is complete): progress.json or a file
    it lists (a checkpoint written before progress.json listed its files: its weights)."""
    try:
        files = read_progress(checkpoint).get(FILES)
    except (OSError, ValueError, AttributeError):
        return f"{TRAINER_STATE}/{PROGRESS}"
    if files is None:
        return None if any(checkpoint.glob("*.safetensors")) else "*.safetensors"
    gone = [name for name in files if not (checkpoint / name).is_file()]
    if not gone:
        return None
    return ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoint_dirs(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the ``keep_last`` newest complete checkpoints (and what a killed prune left). Each is
    renamed out of the ``step-N`` names first (atomic), then deleted: a kill mid-delete leaves only a hidden
    ``.step-N.pruned`` directory, which nothing resumes from."""
    for _, path in checkpoint_dirs(run_dir)[:-keep_last]:
        doomed = path.with_name(f".{path.name}{PRUNED}")
        shutil.rmtree(doomed, ignore_errors=True)
        path.rename(doomed)
        _fsync(path.parent, folder=True)
        shutil.rmtree(doomed, ignore_errors=True)
    for leftover in (Path(run_dir) / CHECKPOINTS).glob(f".step-*{PRUNED}"):
        shutil.rmtree(leftover, ignore_errors=True)


def read_progress(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / TRAINER_STATE / PROGRESS).read_text())


def write_progress(checkpoint: Path, progress: dict[str, Any]) -> None:
    """Write progress.json last: with the list of every other file of the checkpoint (its completeness)."""
    (checkpoint / TRAINER_STATE).mkdir(parents=True, exist_ok=True)
    target = checkpoint / TRAINER_STATE / PROGRESS
    files = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file() and p != target)
    target.write_text(json.dumps({**progress, FILES: files}, indent=2) + "\n")


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with (Path(run_dir) / METRICS).open("a") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(run_dir: Path, step: int) -> None:
    """On resume: drop the records of the steps the resumed run will redo."""
    path = Path(run_dir) / METRICS
    if path.exists():
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in read_metrics(path) if r.get("step", 0) <= step))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path) / METRICS if Path(path).is_dir() else Path(path)
    records = []
    for line in filter(None, map(str.strip, path.read_text().splitlines())):
        with contextlib.suppress(json.JSONDecodeError):   # a line cut by a kill: the step is redone after resume
            records.append(json.loads(line))
    return records


def loss_curve(records: Iterable[dict[str, Any]], key: str = "loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in records if "step" in r and key in r}
