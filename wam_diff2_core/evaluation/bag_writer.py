"""Writing rosbag2 bags without ROS: a whole bag at once (:func:`write_bag`) or message by message from
any thread, atomically (:class:`BagStreamWriter`). Message definitions are stored in the bag, so
Foxglove and ``ros2 bag`` read it without this package.

    write_bag("out_bag", {"/planner/output/trajectory": "wam_diff2_ros/msg/Trajectory"}, messages)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .bag_types import default_typestore
from .bags import BagError, error_text


def write_bag(path: str | Path, topics: dict[str, str], messages: Iterable[tuple[str, int, Any]], *,
              storage: str = "mcap", typestore=None, latched: Iterable[str] = ()) -> Path:
    """Write ``(topic, bag time ns, message or CDR bytes)`` into a new rosbag2 folder ``path``.

    ``topics``: topic -> msgtype. Message definitions are stored in the bag, so Foxglove and
    ``ros2 bag`` read it without this package. ``latched`` topics are recorded with a
    transient-local QoS profile (what ``ros2 bag play`` re-offers).
    """
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
    from rosbags.rosbag2 import StoragePlugin, Writer

    plugins = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
    if storage not in plugins:
        raise BagError(f"storage: {storage!r} is not one of {', '.join(plugins)}")
    store = typestore or default_typestore()
    latched = set(latched)
    never = QosTime(0x7FFFFFFF, 0xFFFFFFFF)
    with Writer(Path(path), version=9, storage_plugin=plugins[storage]) as writer:
        conns = {}
        for topic, msgtype in topics.items():
            qos = []
            if topic in latched:
                qos = [Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL,
                           never, never, QosLiveliness.AUTOMATIC, never, False)]
            conns[topic] = writer.add_connection(topic, msgtype, typestore=store, offered_qos_profiles=qos)
        for topic, bag_time_ns, msg in messages:
            data = msg if isinstance(msg, (bytes, bytearray, memoryview)) else store.serialize_cdr(msg, topics[topic])
            writer.write(conns[topic], int(bag_time_ns), data)
    return Path(path)


class BagStreamWriter:
    """A new rosbag2 bag written message by message, atomically, from any thread.

    The bag grows in a hidden sibling folder (``.NAME.partial-*``) and appears at ``path`` only
    on :meth:`close`; :meth:`abort` (or an exception inside a ``with`` block, Ctrl-C included)
    removes it, so a reader never finds a half-written bag at ``path``. Messages are stored as
    given (CDR bytes unchanged, or a rosbags message serialized with ``typestore``); each topic's
    message definition comes from ``typestore`` (default: Kilted's and this package's types).

    The storage is touched only by one writer thread the object owns (sqlite3 connections must
    stay in the thread that made them), so every method may be called from any thread:
    :meth:`write` queues the message (a storage error surfaces at :meth:`close`), the others wait
    for the writer thread.

        with BagStreamWriter("out_bag", storage="mcap") as w:
            w.add_topic("/planner/output/trajectory", "wam_diff2_ros/msg/Trajectory")
            w.write("/planner/output/trajectory", t_ns, cdr_bytes)
    """

    def __init__(self, path: str | Path, *, storage: str = "mcap", typestore=None, overwrite: bool = False):
        import queue
        import threading

        if storage not in ("mcap", "sqlite3"):
            raise BagError(f"storage: {storage!r} is not one of mcap, sqlite3")
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise BagError(f"{self.path}: already exists (use --overwrite to replace it)")
        self.storage = storage
        self.typestore = typestore or default_typestore()
        self.topics: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._done = False
        self._tmp: Path | None = None
        self._writer = None
        self._thread = threading.Thread(target=self._serve, name=f"bag-writer-{self.path.name}", daemon=True)
        self._thread.start()
        try:
            self._call(self._open)
        except BaseException:
            self._done = True
            self._queue.put((self._discard, (), None))     # ends the writer thread
            raise

    # -- the writer thread
    def _serve(self) -> None:
        while True:
            fn, args, reply = self._queue.get()
            try:
                result = fn(*args)
                if reply is not None:
                    reply.append((True, result))
            except BaseException as exc:  # handed to the caller (reply) or kept for close()
                if reply is not None:
                    reply.append((False, exc))
                elif self._error is None:
                    self._error = exc
            if reply is not None:
                reply.event.set()
            if fn in (self._finish, self._discard):
                return

    def _call(self, fn, *args):
        import threading

        class Reply(list):
            event = None

        reply = Reply()
        reply.event = threading.Event()
        self._queue.put((fn, args, reply))
        reply.event.wait()
        ok, value = reply[0]
        if not ok:
            raise value
        return value

    def _open(self) -> None:
        import tempfile

        from rosbags.rosbag2 import StoragePlugin, Writer

        plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[self.storage]
        self._writer = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.partial-", dir=self.path.parent))
        self._writer = Writer(self._tmp / self.path.name, version=9, storage_plugin=plugin)
        self._conns: dict[str, Any] = {}
        try:
            self._writer.open()
        except BaseException:
            self._discard()
            raise

    def _add(self, topic: str, msgtype: str, qos) -> None:
        self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=self.typestore,
                                                         offered_qos_profiles=qos)

    def _write(self, topic: str, bag_time_ns: int, data: bytes) -> None:
        if self._error is None:
            self._writer.write(self._conns[topic], bag_time_ns, data)

    def _finish(self) -> Path:
        import shutil

        try:
            if self._error is not None:
                raise BagError(f"{self.path}: writing failed ({error_text(self._error)})") from self._error
            self._writer.close()
            if self.path.exists():
                shutil.rmtree(self.path) if self.path.is_dir() else self.path.unlink()
            (self._tmp / self.path.name).rename(self.path)
            return self.path
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _discard(self) -> None:
        import shutil

        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:   # a writer that failed half-way: the folder goes anyway
            pass
        self._writer = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- the API
    def add_topic(self, topic: str, msgtype: str, *, reliable: bool = True, latched: bool = False) -> None:
        """A connection for ``topic``; ``reliable`` / ``latched`` are stored as its offered QoS."""
        from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

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
            never = QosTime(0x7FFFFFFF, 0xFFFFFFFF)
            qos = [Qos(QosHistory.KEEP_LAST, 1 if latched else 100,
                       QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
                       QosDurability.TRANSIENT_LOCAL if latched else QosDurability.VOLATILE,
                       never, never, QosLiveliness.AUTOMATIC, never, False)]
            self._call(self._add, topic, msgtype, qos)
            self.topics[topic] = msgtype
            self.counts[topic] = 0

    def write(self, topic: str, bag_time_ns: int, msg) -> None:
        """Queue one message (rosbags message or CDR bytes) logged at ``bag_time_ns``; ignored once closed."""
        with self._lock:
            if self._done:
                return
            if topic not in self.topics:
                raise BagError(f"{topic}: not added to {self.path} (add_topic first)")
            data = msg if isinstance(msg, (bytes, bytearray, memoryview)) else \
                self.typestore.serialize_cdr(msg, self.topics[topic])
            self._queue.put((self._write, (topic, int(bag_time_ns), bytes(data)), None))
            self.counts[topic] += 1

    def close(self) -> Path:
        """Write what is queued, finish the bag and move it to ``path`` (replacing what is there)."""
        with self._lock:
            if self._done:
                return self.path
            self._done = True
        return self._call(self._finish)

    def abort(self) -> None:
        """Drop the partial bag; ``path`` is left as it was."""
        with self._lock:
            if self._done:
                return
            self._done = True
        self._call(self._discard)

    def __enter__(self) -> "BagStreamWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
