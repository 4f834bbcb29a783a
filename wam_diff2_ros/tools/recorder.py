"""``wam-diff2-ros replay --record``: topics that come back recorded into a new rosbag2 bag, as received (CDR);
:meth:`TopicRecorder.finish` renames the bag into place, :meth:`TopicRecorder.abort` leaves nothing there."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

from wam_diff2_core.evaluation.bag_writer import BagStreamWriter
from wam_diff2_core.evaluation.bags import BagError

from ..optional_msgs import message_class
from ..qos import keep_last_qos

# a reader subscription keeps this many messages while the executor is busy
RECORD_DEPTH = 1000


class RecordError(Exception):
    """A topic cannot be recorded; the message says why."""


def _publishers_qos(topic: str, infos) -> tuple[str, bool, bool]:
    """(type, reliable, transient local) for the publishers of ``topic``; RecordError where they disagree on the type.

    A reliable subscription does not match a best-effort publisher and a transient-local one does
    not match a volatile publisher, so either is chosen only when every publisher offers it
    (what ``ros2 bag record`` does).
    """
    types = sorted({i.topic_type for i in infos})
    if len(types) > 1:
        raise RecordError(f"--record-topics {topic}: publishers disagree on the type ({', '.join(types)})")
    reliable = all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE for i in infos)
    latched = all(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in infos)
    return types[0], reliable, latched


class TopicRecorder:
    """Subscribes (raw: the CDR bytes) to topics once their publishers are discovered and writes
    every message received into a :class:`BagStreamWriter`, logged at ``clock_ns()``."""

    def __init__(self, node: Node, path: str | Path, topics: Sequence[str], *, storage: str = "mcap",
                 overwrite: bool = False, clock_ns: Callable[[], int] = time.time_ns):
        self.node, self.clock_ns = node, clock_ns
        self.pending = list(dict.fromkeys(topics))
        self.subscriptions: dict[str, Any] = {}
        self.publishers_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.writer = BagStreamWriter(path, storage=storage, overwrite=overwrite)

    def discover(self) -> list[str]:
        """Subscribe to every pending topic that has a publisher now; returns those still pending."""
        for topic in list(self.pending):
            infos = self.node.get_publishers_info_by_topic(topic)
            if not infos:
                continue
            msgtype, reliable, latched = _publishers_qos(topic, infos)
            cls = message_class(msgtype)
            if cls is None:
                raise RecordError(f"--record-topics {topic}: no Python message package for {msgtype} is "
                                  "importable here")
            try:
                with self._lock:
                    self.writer.add_topic(topic, msgtype, reliable=reliable, latched=latched)
            except BagError as exc:
                raise RecordError(f"--record-topics {exc}") from None
            self.subscriptions[topic] = self.node.create_subscription(
                cls, topic, self._recorder(topic), keep_last_qos(RECORD_DEPTH, reliable=reliable, latched=latched),
                raw=True)
            self.publishers_seen[topic] = len(infos)
            self.pending.remove(topic)
        return list(self.pending)

    def unmatched(self) -> list[str]:
        """Subscribed topics whose subscription has not matched every publisher discovered yet."""
        return [t for t, sub in self.subscriptions.items() if sub.get_publisher_count() < self.publishers_seen[t]]

    def _recorder(self, topic: str) -> Callable[[bytes], None]:
        def record(data: bytes) -> None:
            with self._lock:
                if not self._closed:
                    self.writer.write(topic, self.clock_ns(), data)
        return record

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.writer.counts)

    def finish(self) -> Path:
        with self._lock:
            self._closed = True
            return self.writer.close()

    def abort(self) -> None:
        with self._lock:
            self._closed = True
            self.writer.abort()
