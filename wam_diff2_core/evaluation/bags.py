"""rosbag2 bags without ROS: open (sqlite3 or mcap, a folder or a single file), know the types, read.
Types come from the bag's stored definitions first, then :mod:`.bag_types`; every failure a bag can cause
is a :class:`BagError` naming the bag and the reason.

    with Bag("run.mcap") as bag:
        print(bag.topic_types)                              # {topic: msgtype}
        for topic, bag_time_ns, msg in bag.messages([carla_topics()["odometry"]]):    # wam_diff2_core.topics
            ...
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..frame_inputs import stamp_ns
from ..topics import DEFAULT_CAMERA, DEFAULT_COMMAND_TOPIC, DEFAULT_ROLE, carla_topics
from .bag_types import default_types, types_from_connection

STORAGE_SUFFIXES = {".mcap": "mcap", ".db3": "sqlite3"}
RECOVER_HINTS = {   # storage -> how a damaged bag may be recovered (the end of its error messages)
    "mcap": "; an mcap file cut off by a killed recorder can be repaired with `mcap recover` or `ros2 bag reindex`",
    "sqlite3": "; a damaged .db3 may be partly recovered with `sqlite3 FILE .recover` and `ros2 bag reindex`"}


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
    """An open bag (a context manager): topics, types, message counts, and a message iterator."""

    def __init__(self, path: str | Path):
        from rosbags.rosbag2 import Reader

        self.path = resolve_bag_path(path)
        self.storage = _storage_of(self.path)
        self._recover_hint = RECOVER_HINTS.get(self.storage, "")
        try:
            self._reader = Reader(self.path)
            self._reader.open()
        except Exception as exc:  # rosbags raises ReaderError, sqlite/apsw errors, OSError, KeyError ...
            raise BagError(f"{self.path}: cannot open the bag ({error_text(exc)}){self._recover_hint}") from None
        self.topic_types: dict[str, str] = {}
        self.topic_counts: dict[str, int] = {}
        self.topic_qos: dict[str, list] = {}
        for c in self._reader.connections:
            known = self.topic_types.get(c.topic, c.msgtype)
            self.topic_types[c.topic] = c.msgtype if known == c.msgtype else "<several types>"
            self.topic_counts[c.topic] = self.topic_counts.get(c.topic, 0) + c.msgcount
            self.topic_qos.setdefault(c.topic, list(getattr(c.ext, "offered_qos_profiles", []) or []))
        self.start_ns = self._reader.start_time if self._reader.message_count else 0
        self.end_ns = self._reader.end_time if self._reader.message_count else 0
        self.message_count = self._reader.message_count
        self._typestore = None
        self._undecodable: dict[str, str] = {}

    @property
    def typestore(self):
        """The bag's own definitions first, then Kilted's and this package's for what it lacks."""
        if self._typestore is None:
            from rosbags.typesys import Stores, TypesysError, get_typestore

            store = get_typestore(Stores.EMPTY)
            embedded: dict[str, Any] = {}
            for conn in self._reader.connections:
                try:
                    embedded.update(types_from_connection(conn))
                except Exception as exc:  # a definition rosbags cannot parse: fall back to defaults
                    self._undecodable[conn.msgtype] = f"its stored definition does not parse ({error_text(exc)})"
            try:
                store.register(embedded)
            except TypesysError as exc:  # two topics disagree on one type
                raise BagError(f"{self.path}: inconsistent message definitions in the bag ({exc})") from None
            defaults = default_types()
            store.register({k: v for k, v in defaults.items() if k not in store.fielddefs})
            self._typestore = store
        return self._typestore

    def topic_of_type(self, msgtype: str, default: str) -> str | None:
        """``default`` when it is a ``msgtype`` topic here, else the bag's only ``msgtype`` topic; None: neither."""
        candidates = sorted(t for t, m in self.topic_types.items() if m == msgtype)
        return default if default in candidates else (candidates[0] if len(candidates) == 1 else None)

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
        if msgtype not in self.typestore.fielddefs:
            why = self._undecodable.get(msgtype, "the bag stores no definition for it and it is not a known type")
            raise BagError(f"{self.path}: cannot decode {msgtype} on {topic!r}: {why}")
        return msgtype

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
        except Exception as exc:
            done = sum(read.values())
            raise BagError(f"{self.path}: the bag is truncated or corrupt: reading stopped after {done} messages "
                           f"({error_text(exc)}){self._recover_hint}") from None
        short = {t: (n, self.topic_counts.get(t, 0)) for t, n in read.items() if n < self.topic_counts.get(t, 0)}
        if short:
            detail = ", ".join(f"{t}: {n} of {want}" for t, (n, want) in sorted(short.items()))
            raise BagError(f"{self.path}: the bag is truncated: fewer messages than its index lists ({detail})"
                           f"{self._recover_hint}")

    def deserialize(self, data: bytes, msgtype: str):
        return self.typestore.deserialize_cdr(data, msgtype)

    def messages(self, topics: Iterable[str]) -> Iterator[tuple[str, int, Any]]:
        """(topic, bag time ns, message or :class:`Undecodable`) in storage order."""
        for topic, bag_time_ns, msgtype, data in self.raw_messages(topics):
            try:
                msg = self.deserialize(data, msgtype)
            except Exception as exc:  # a message whose bytes do not match its type: a counted skip
                msg = Undecodable(f"{msgtype} does not deserialize ({error_text(exc)})")
            yield topic, bag_time_ns, msg

    def by_stamp(self, topic: str, counts: Counter) -> dict[int, Any]:
        """``topic``'s messages by header stamp, the first of each; ``counts`` gets ``messages``, ``undecodable``
        and ``duplicate`` (a later message of a stamp already seen)."""
        found: dict[int, Any] = {}
        for _, _, msg in self.messages([topic]):
            counts["messages"] += 1
            if isinstance(msg, Undecodable):
                counts["undecodable"] += 1
            elif stamp_ns(msg.header.stamp) in found:
                counts["duplicate"] += 1
            else:
                found[stamp_ns(msg.header.stamp)] = msg
        return found

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


def _storage_of(path: Path) -> str:
    if path.is_file():
        return STORAGE_SUFFIXES[path.suffix]
    try:
        from ruamel.yaml import YAML
        meta = YAML(typ="safe").load((path / "metadata.yaml").read_text())
        return str(meta["rosbag2_bagfile_information"]["storage_identifier"])
    except Exception:  # informational only
        return "unknown"


def error_text(exc: BaseException) -> str:
    """The exception's text (its type's name when it has none), cut to 300 characters for an error message."""
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."
