"""A keep-latest slot: callbacks store only the newest item, a worker thread takes it.

Old items are replaced, never queued, so a slow model always works on the newest frame and
the latency never grows with the backlog.
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class LatestSlot(Generic[T]):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: T | None = None
        self._closed = False

    def put(self, item: T) -> bool:
        """Store ``item``; returns True when it replaced an item nobody had taken."""
        with self._cond:
            replaced = self._item is not None
            self._item = item
            self._cond.notify()
            return replaced

    def take(self, timeout_s: float | None = None) -> T | None:
        """The newest item (and empty the slot); None after ``timeout_s`` or once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._item is not None or self._closed, timeout_s)
            item, self._item = self._item, None
            return item

    def close(self) -> None:
        """Wake any waiting ``take`` (it returns what is stored, or None)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class LatestWorker(Generic[T]):
    """A thread that hands the newest item of its :attr:`slot` to ``process``, one at a time, until stopped.
    An exception from ``process`` goes to ``on_error``, which returns False to end the thread."""

    TAKE_TIMEOUT_S = 0.2       # how often an idle worker looks at its stop flag

    def __init__(self, process: Callable[[T], None], on_error: Callable[[Exception], bool], name: str):
        self.slot: LatestSlot[T] = LatestSlot()
        self._process, self._on_error, self._name = process, on_error, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._abandoned: threading.Thread | None = None     # stopped, still inside ``process``

    def start(self) -> None:
        """Start a thread on a new, empty slot."""
        self.slot = LatestSlot()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """The thread ends after its current item; a waiting ``take`` returns at once."""
        self._stop.set()
        self.slot.close()

    def join(self, timeout_s: float) -> bool:
        """Wait for the stopped thread (not from itself); False: still inside ``process`` after ``timeout_s``."""
        thread, self._thread = self._thread, None
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            self._abandoned = thread
            return False
        return True

    def still_running(self) -> bool:
        """True while a thread that outlived its ``join`` is still inside ``process``."""
        return self._abandoned is not None and self._abandoned.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            item = self.slot.take(timeout_s=self.TAKE_TIMEOUT_S)
            if item is None or self._stop.is_set():
                continue
            try:
                self._process(item)
            except Exception as exc:  # the worker survives anything one item does, unless on_error says not
                if not self._on_error(exc):
                    return
