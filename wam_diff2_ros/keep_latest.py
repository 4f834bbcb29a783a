"""A keep-latest slot: callbacks store only the newest item, a worker takes it.

Old items are replaced, never queued, so a slow model always works on the newest frame and
the latency never grows with the backlog.

    slot = LatestSlot()
    slot.put(frame)                 # in a subscription callback; True if an unread item was dropped
    item = slot.take(timeout_s=0.1) # in the worker; None on timeout or after close()
"""
from __future__ import annotations

import threading
from typing import Generic, TypeVar

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

    def clear(self) -> bool:
        """Drop the stored item; returns True when there was one."""
        with self._cond:
            had, self._item = self._item is not None, None
            return had

    def close(self) -> None:
        """Wake any waiting ``take`` (it returns what is stored, or None)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self._closed = False
