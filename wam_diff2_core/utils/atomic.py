"""Atomic writes: a reader sees the old file/directory or the complete new one, never half."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


# tempfile makes private files (0600) and directories (0700); what we publish gets the modes a plain
# open() / mkdir() would give (read once: reading the umask means setting it, process-wide)
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_directory(dst: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it is renamed to ``dst``."""
    dst = Path(dst)
    if dst.exists() and not overwrite:
        from ..config import ConfigError
        raise ConfigError(f"{dst}: already exists")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    tmp.chmod(0o777 & ~_UMASK)
    try:
        yield tmp
        if dst.exists():
            old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            dst.rename(old)
            tmp.rename(dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
