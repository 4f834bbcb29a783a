"""One writer per run folder: a lock file held with ``flock`` by the process that writes there.

    with RunLock(run_dir / RUN_LOCK):          # train: output.dir/.lock; infer: OUTPUT.lock
        ...                                    # a second run fails fast, naming this process

The lock file holds the holder's PID and host. The kernel drops a ``flock`` when its process ends
however it ends, so the next run takes over a crashed run's lock (logging its PID); a run that finds
the lock held stops at once with a :class:`RunLocked` error naming the holder. On release the file is
removed while still locked, and a taker checks that the file it locked is still the one at the path,
so a release and a take-over never leave two holders.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from ..config import ConfigError

RUN_LOCK = ".lock"
log = logging.getLogger(__name__)


class RunLocked(ConfigError):
    """Another live process holds the lock (the message names it)."""


class RunLock:
    """Holds ``path`` (created if needed) from :meth:`acquire` (or ``with``) to :meth:`release`."""

    def __init__(self, path: str | Path, what: str = "run folder"):
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise RunLocked(f"{self.path.parent}: this {self.what} is in use by process "
                                    f"{holder or '(unknown)'} (lock file {self.path}); wait for it to finish "
                                    "or stop it") from None
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)                 # released (and removed) between our open and our lock: again
        stale = _read(fd)
        if stale:
            log.warning("%s: took over the lock of process %s, which ended without releasing it (a crash)",
                        self.path, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)   # still locked: nobody can take it between unlink and unlock
        os.close(self._fd)               # closing drops the flock
        self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()
