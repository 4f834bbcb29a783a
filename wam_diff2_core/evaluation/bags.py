"""rosbag2 bags without ROS: open (sqlite3 or mcap, a folder or a single file), know the types, read.

Types come from the bag itself first (rosbag2 stores each topic's message definition), then
from the ROS 2 Kilted standard set, ``derived_object_msgs`` (carla-ros-bridge's objects) and this
package's ``msg/*.msg`` for bags that carry none.
Every failure a bag can cause surfaces as :class:`BagError` with the bag and the reason: a
missing path, a truncated or corrupt storage file, a topic that is absent or has an unexpected
type, a type nobody can decode.

    with open_bag("run.mcap") as bag:
        print(bag.topic_types)                              # {topic: msgtype}
        for topic, bag_time_ns, msg in bag.messages([carla_topics()["odometry"]]):    # wam_diff2_core.topics
            ...
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..topics import DEFAULT_CAMERA, DEFAULT_COMMAND_TOPIC, DEFAULT_ROLE, carla_topics

STORAGE_SUFFIXES = {".mcap": "mcap", ".db3": "sqlite3"}
PACKAGE = "wam_diff2_ros"

IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
ODOMETRY_TYPES = ("nav_msgs/msg/Odometry",)
ROUTE_TYPES = ("nav_msgs/msg/Path",)
COMMAND_TYPES = ("std_msgs/msg/String",)
CAMERA_INFO_TYPES = ("sensor_msgs/msg/CameraInfo",)
OBJECTS_TYPES = ("derived_object_msgs/msg/ObjectArray",)


class BagError(Exception):
    """A bag cannot be used as asked; the message says which bag and why."""


@dataclass(frozen=True)
class BagTopics:
    """Input topics; defaults are carla-ros-bridge's names for ``role``. None = not used."""

    image: str
    odometry: str
    route: str | None = None          # nav_msgs/Path (latched); used when present in the bag
    command: str | None = None        # std_msgs/String, overrides the route; used when present
    camera_info: str | None = None    # informational (image size in the report); used when present
    objects: str | None = None        # derived_object_msgs/ObjectArray (other agents): collision rate when present

    @classmethod
    def carla(cls, role: str = DEFAULT_ROLE, camera: str = DEFAULT_CAMERA, **overrides: str | None) -> "BagTopics":
        """carla-ros-bridge's topics for ``role``; the command is the planner node's own input topic."""
        topics = {**carla_topics(role, camera), "command": DEFAULT_COMMAND_TOPIC}
        topics.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**topics)

    def as_dict(self) -> dict[str, str | None]:
        return dict(image=self.image, odometry=self.odometry, route=self.route, command=self.command,
                    camera_info=self.camera_info, objects=self.objects)


# ----------------------------------------------------------------------------- types
def package_msg_dir() -> Path | None:
    """This package's ``msg/`` folder: the source tree, else an installed ``share/<pkg>/msg``."""
    candidates = [Path(__file__).resolve().parents[2] / "msg"]
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            candidates.append(Path(prefix) / "share" / PACKAGE / "msg")
    return next((c for c in candidates if c.is_dir() and any(c.glob("*.msg"))), None)


@lru_cache(maxsize=1)
def default_types() -> dict[str, Any]:
    """Kilted's standard message types, carla-ros-bridge's ``derived_object_msgs`` when installed (see
    :mod:`.derived_objects`) and this package's, as a rosbags types dict."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from .derived_objects import object_types

    types = dict(get_typestore(Stores.ROS2_KILTED).fielddefs)
    try:
        types.update(object_types())
    except LookupError:       # only writing needs them: a recorded bag carries its own definitions
        pass
    msg_dir = package_msg_dir()
    if msg_dir is not None:
        for path in sorted(msg_dir.glob("*.msg")):
            types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
    return types


def default_typestore():
    """A typestore with :func:`default_types` (for writing bags)."""
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.EMPTY)
    store.register(default_types())
    return store


def _types_from_connection(conn) -> dict[str, Any]:
    from rosbags.interfaces import MessageDefinitionFormat
    from rosbags.typesys import get_types_from_idl, get_types_from_msg

    fmt, data = conn.msgdef.format, conn.msgdef.data
    if fmt == MessageDefinitionFormat.MSG and data:
        return get_types_from_msg(data, conn.msgtype)
    if fmt == MessageDefinitionFormat.IDL and data:
        sep = "=" * 80 + "\n"
        types: dict[str, Any] = {}
        for part in (data.split(sep)[1:] if data.startswith(f"{sep}IDL: ") else [data]):
            types.update(get_types_from_idl(part.split("\n", 1)[1] if part.startswith("IDL: ") else part))
        return types
    return {}


# ----------------------------------------------------------------------------- reading
def resolve_bag_path(path: str | Path) -> Path:
    """A rosbag2 folder, a ``metadata.yaml`` in one, or a single ``.mcap`` / ``.db3`` file.

    A folder without ``metadata.yaml`` but with exactly one storage file is read as that file
    (a bag copied without its metadata).
    """
    p = Path(path)
    if not p.exists():
        raise BagError(f"{p}: no such file or folder")
    if p.is_file() and p.name == "metadata.yaml":
        p = p.parent
    if p.is_dir():
        if (p / "metadata.yaml").exists():
            return p
        files = sorted(x for x in p.iterdir() if x.suffix in STORAGE_SUFFIXES)
        if len(files) == 1:
            return files[0]
        raise BagError(f"{p}: not a rosbag2 folder (no metadata.yaml"
                       + (f", and {len(files)} storage files" if files else ", no .mcap or .db3 file") + ")")
    if p.suffix not in STORAGE_SUFFIXES:
        raise BagError(f"{p}: not a rosbag2 bag (expected a folder, a .mcap or a .db3 file)")
    return p


class Bag:
    """An open bag: topics, types, message counts, and a message iterator. Use :func:`open_bag`."""

    def __init__(self, path: str | Path):
        from rosbags.rosbag2 import Reader

        self.path = resolve_bag_path(path)
        try:
            self._reader = Reader(self.path)
            self._reader.open()
        except Exception as exc:  # rosbags raises ReaderError, sqlite/apsw errors, OSError, KeyError ...
            raise BagError(f"{self.path}: cannot open the bag ({_reason(exc)}){_recover_hint(self.path, exc)}") from None
        conns = self._reader.connections
        self.storage = _storage_of(self.path)
        self.topic_types: dict[str, str] = {}
        self.topic_counts: dict[str, int] = {}
        self.topic_qos: dict[str, list] = {}
        for c in conns:
            if c.topic in self.topic_types and self.topic_types[c.topic] != c.msgtype:
                self.topic_types[c.topic] = "<several types>"
            else:
                self.topic_types.setdefault(c.topic, c.msgtype)
            self.topic_counts[c.topic] = self.topic_counts.get(c.topic, 0) + c.msgcount
            self.topic_qos.setdefault(c.topic, list(getattr(c.ext, "offered_qos_profiles", []) or []))
        self.start_ns = self._reader.start_time if self._reader.message_count else 0
        self.end_ns = self._reader.end_time if self._reader.message_count else 0
        self.message_count = self._reader.message_count
        self._typestore = None
        self._undecodable: dict[str, str] = {}

    # -- types
    @property
    def typestore(self):
        """The bag's own definitions first, then Kilted's and this package's for what it lacks."""
        if self._typestore is None:
            from rosbags.typesys import Stores, TypesysError, get_typestore

            store = get_typestore(Stores.EMPTY)
            embedded: dict[str, Any] = {}
            for conn in self._reader.connections:
                try:
                    embedded.update(_types_from_connection(conn))
                except Exception as exc:  # a definition rosbags cannot parse: fall back to defaults
                    self._undecodable[conn.msgtype] = f"its stored definition does not parse ({_reason(exc)})"
            try:
                store.register(embedded)
            except TypesysError as exc:  # two topics disagree on one type
                raise BagError(f"{self.path}: inconsistent message definitions in the bag ({exc})") from None
            defaults = default_types()
            store.register({k: v for k, v in defaults.items() if k not in store.fielddefs})
            self._typestore = store
        return self._typestore

    def can_decode(self, msgtype: str) -> bool:
        return msgtype in self.typestore.fielddefs

    def require_topic(self, topic: str, expected_types: Sequence[str], role: str) -> str:
        """The topic's type; BagError naming what is there when it is absent, mistyped or undecodable."""
        if topic not in self.topic_types:
            present = ", ".join(f"{t} [{m}]" for t, m in sorted(self.topic_types.items())) or "none"
            raise BagError(f"{self.path}: no {role} topic {topic!r} in the bag (topics: {present}); "
                           f"name the right one with --{role.replace(' ', '-')}-topic")
        msgtype = self.topic_types[topic]
        if msgtype not in expected_types:
            raise BagError(f"{self.path}: {role} topic {topic!r} has type {msgtype}, expected "
                           f"{' or '.join(expected_types)}")
        if not self.can_decode(msgtype):
            why = self._undecodable.get(msgtype, "the bag stores no definition for it and it is not a known type")
            raise BagError(f"{self.path}: cannot decode {msgtype} on {topic!r}: {why}")
        return msgtype

    def has_topic(self, topic: str | None) -> bool:
        return topic is not None and topic in self.topic_types and self.topic_counts.get(topic, 0) > 0

    # -- messages
    def raw_messages(self, topics: Iterable[str] | None = None) -> Iterator[tuple[str, int, str, bytes]]:
        """(topic, bag time ns, msgtype, CDR bytes) in storage order (by bag time per file)."""
        wanted = None if topics is None else set(topics)
        conns = [c for c in self._reader.connections if wanted is None or c.topic in wanted]
        if not conns:
            return
        read = {c.topic: 0 for c in conns}
        try:
            for conn, bag_time_ns, data in self._reader.messages(connections=conns):
                read[conn.topic] += 1
                yield conn.topic, bag_time_ns, conn.msgtype, data
        except BagError:
            raise
        except Exception as exc:
            done = sum(read.values())
            raise BagError(f"{self.path}: the bag is truncated or corrupt: reading stopped after {done} messages "
                           f"({_reason(exc)}){_recover_hint(self.path, exc)}") from None
        short = {t: (n, self.topic_counts.get(t, 0)) for t, n in read.items() if n < self.topic_counts.get(t, 0)}
        if short:
            detail = ", ".join(f"{t}: {n} of {want}" for t, (n, want) in sorted(short.items()))
            raise BagError(f"{self.path}: the bag is truncated: fewer messages than its index lists ({detail})"
                           f"{_recover_hint(self.path, None)}")

    def deserialize(self, data: bytes, msgtype: str):
        return self.typestore.deserialize_cdr(data, msgtype)

    def messages(self, topics: Iterable[str]) -> Iterator[tuple[str, int, Any]]:
        """(topic, bag time ns, message or :class:`Undecodable`) in storage order."""
        for topic, bag_time_ns, msgtype, data in self.raw_messages(topics):
            try:
                msg = self.deserialize(data, msgtype)
            except Exception as exc:  # a message whose bytes do not match its type: a counted skip
                msg = Undecodable(f"{msgtype} does not deserialize ({_reason(exc)})")
            yield topic, bag_time_ns, msg

    def info(self) -> dict[str, Any]:
        return {"path": str(self.path), "storage": self.storage, "messages": self.message_count,
                "start_ns": self.start_ns, "duration_s": (self.end_ns - self.start_ns) / 1e9 if self.message_count else 0.0,
                "topics": {t: {"type": self.topic_types[t], "count": self.topic_counts[t]} for t in sorted(self.topic_types)}}

    def close(self) -> None:
        if self._reader is not None and self._reader.is_open:
            self._reader.close()

    def __enter__(self) -> "Bag":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a message whose bytes could not be deserialized."""

    reason: str


def open_bag(path: str | Path) -> Bag:
    return Bag(path)


def _storage_of(path: Path) -> str:
    if path.is_file():
        return STORAGE_SUFFIXES[path.suffix]
    try:
        from ruamel.yaml import YAML
        meta = YAML(typ="safe").load((path / "metadata.yaml").read_text())
        return str(meta["rosbag2_bagfile_information"]["storage_identifier"])
    except Exception:  # informational only
        return "unknown"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


def _recover_hint(path: Path, exc: BaseException | None) -> str:
    kind = _storage_of(path) if path.exists() else "unknown"
    if kind == "mcap":
        return "; an mcap file cut off by a killed recorder can be repaired with `mcap recover` or `ros2 bag reindex`"
    if kind == "sqlite3":
        return "; a damaged .db3 may be partly recovered with `sqlite3 FILE .recover` and `ros2 bag reindex`"
    return ""


# ----------------------------------------------------------------------------- writing
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
                raise BagError(f"{self.path}: writing failed ({_reason(self._error)})") from self._error
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
