"""Writing rosbag2 bags without ROS: a whole bag at once (:func:`write_bag`) or message by message from
any thread, atomically (:class:`BagStreamWriter`). Message definitions are stored in the bag, so
Foxglove and ``ros2 bag`` read it without this package.

    write_bag("out_bag", {"/planner/output/trajectory": "wam_diff2_ros/msg/Trajectory"}, messages)
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from .bag_types import default_typestore
from .bags import BagError, error_text

STORAGES = ("mcap", "sqlite3")


def new_writer(path: Path, storage: str):
    """An unopened rosbags writer of bag format version 9 (ROS 2 Kilted); BagError for an unknown storage."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    if storage not in STORAGES:
        raise BagError(f"storage: {storage!r} is not one of {', '.join(STORAGES)}")
    return Writer(path, version=9, storage_plugin=StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3)


def offered_qos(latched: bool, reliable: bool = True, depth: int = 100) -> list:
    """One offered QoS profile: keep-last ``depth`` (1 when latched: transient local), reliable or best effort."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    never = QosTime(0x7FFFFFFF, 0xFFFFFFFF)
    return [Qos(QosHistory.KEEP_LAST, 1 if latched else depth,
                QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
                QosDurability.TRANSIENT_LOCAL if latched else QosDurability.VOLATILE,
                never, never, QosLiveliness.AUTOMATIC, never, False)]


def _cdr(msg, store, msgtype: str) -> bytes:
    return msg if isinstance(msg, (bytes, bytearray, memoryview)) else store.serialize_cdr(msg, msgtype)


def write_bag(path: str | Path, topics: dict[str, str], messages: Iterable[tuple[str, int, Any]], *,
              storage: str = "mcap", typestore=None, latched: Iterable[str] = ()) -> Path:
    """Write ``(topic, bag time ns, message or CDR bytes)`` into a new rosbag2 folder ``path``.

    ``topics``: topic -> msgtype. ``latched`` topics are recorded with a transient-local QoS profile (what
    ``ros2 bag play`` re-offers); the others with none.
    """
    store = typestore or default_typestore()
    latched = set(latched)
    with new_writer(Path(path), storage) as writer:
        conns = {topic: writer.add_connection(topic, msgtype, typestore=store,
                                              offered_qos_profiles=offered_qos(True) if topic in latched else [])
                 for topic, msgtype in topics.items()}
        for topic, bag_time_ns, msg in messages:
            writer.write(conns[topic], int(bag_time_ns), _cdr(msg, store, topics[topic]))
    return Path(path)


class BagStreamWriter:
    """A new rosbag2 bag written message by message, atomically, from any thread.

    The bag grows in a hidden sibling folder (``.NAME.partial-*``) and appears at ``path`` only on
    :meth:`close`; :meth:`abort` (or an exception inside a ``with`` block, Ctrl-C included) removes it.
    Only one writer thread the object owns touches the storage (sqlite3 connections must stay in the
    thread that made them): :meth:`write` queues the message (a storage error surfaces at :meth:`close`),
    the other methods wait for that thread.

        with BagStreamWriter("out_bag", storage="mcap") as w:
            w.add_topic("/planner/output/trajectory", "wam_diff2_ros/msg/Trajectory")
            w.write("/planner/output/trajectory", t_ns, cdr_bytes)
    """

    def __init__(self, path: str | Path, *, storage: str = "mcap", typestore=None, overwrite: bool = False):
        if storage not in STORAGES:
            raise BagError(f"storage: {storage!r} is not one of {', '.join(STORAGES)}")
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise BagError(f"{self.path}: already exists (use --overwrite to replace it)")
        self.storage = storage
        self.typestore = typestore or default_typestore()
        self.topics: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._done = False
        self._tmp: Path | None = None
        self._writer = None
        self._conns: dict[str, Any] = {}
        # one thread runs every storage call, in the order they were queued
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"bag-writer-{self.path.name}")
        try:
            self._call(self._open)
        except BaseException:
            self._done = True
            self._thread.shutdown(wait=False)
            raise

    def _call(self, fn, *args, **kwargs):
        return self._thread.submit(fn, *args, **kwargs).result()

    # -- on the writer thread
    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.partial-", dir=self.path.parent))
        try:
            self._writer = new_writer(self._tmp / self.path.name, self.storage)
            self._writer.open()
        except BaseException:
            self._discard()
            raise

    def _write(self, topic: str, bag_time_ns: int, data: bytes) -> None:
        if self._error is None:
            try:
                self._writer.write(self._conns[topic], bag_time_ns, data)
            except BaseException as exc:  # kept for close()
                self._error = exc

    def _finish(self) -> Path:
        if self._error is not None:
            self._discard()                     # the storage's files closed too, not only removed
            raise BagError(f"{self.path}: writing failed ({error_text(self._error)})") from self._error
        try:
            self._writer.close()
            if self.path.exists():
                shutil.rmtree(self.path) if self.path.is_dir() else self.path.unlink()
            (self._tmp / self.path.name).rename(self.path)
            return self.path
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _discard(self) -> None:
        with contextlib.suppress(Exception):    # a writer that failed half-way: the folder goes anyway
            if self._writer is not None:
                self._writer.close()
        self._writer = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _end(self, fn):
        """Run ``fn`` (finish or discard) once, then let the writer thread go."""
        with self._lock:
            if self._done:
                return None
            self._done = True
        try:
            return self._call(fn)
        finally:
            self._thread.shutdown()

    # -- the API
    def add_topic(self, topic: str, msgtype: str, *, reliable: bool = True, latched: bool = False) -> None:
        """A connection for ``topic``; ``reliable`` / ``latched`` are stored as its offered QoS."""
        with self._lock:
            if self._done:
                raise BagError(f"{self.path}: already closed")
            if topic in self.topics:
                if self.topics[topic] != msgtype:
                    raise BagError(f"{topic}: recorded as {self.topics[topic]}, now offered as {msgtype}")
                return
            if msgtype not in self.typestore.fielddefs:
                raise BagError(f"{topic}: no message definition for {msgtype} is known here, so it cannot be "
                               "recorded")
            self._conns[topic] = self._call(self._writer.add_connection, topic, msgtype, typestore=self.typestore,
                                            offered_qos_profiles=offered_qos(latched, reliable))
            self.topics[topic] = msgtype
            self.counts[topic] = 0

    def write(self, topic: str, bag_time_ns: int, msg) -> None:
        """Queue one message (rosbags message or CDR bytes) logged at ``bag_time_ns``; ignored once closed."""
        with self._lock:
            if self._done:
                return
            if topic not in self.topics:
                raise BagError(f"{topic}: not added to {self.path} (add_topic first)")
            data = bytes(_cdr(msg, self.typestore, self.topics[topic]))
            self._thread.submit(self._write, topic, int(bag_time_ns), data)
            self.counts[topic] += 1

    def close(self) -> Path:
        """Write what is queued, finish the bag and move it to ``path`` (replacing what is there)."""
        return self._end(self._finish) or self.path

    def abort(self) -> None:
        """Drop the partial bag; ``path`` is left as it was."""
        self._end(self._discard)

    def __enter__(self) -> "BagStreamWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
