"""``wam-diff2-ros replay`` (options: :mod:`.cli`): a rosbag2 bag played over DDS with its recorded timing.

Like ``ros2 bag play [--clock]``: every message is published as recorded (the CDR
bytes) at ``start + (t_log - t_first) / rate`` wall time; ``--clock`` publishes the bag's time on
``/clock`` (at ``--clock-hz`` and right before each message) in place of a recorded ``/clock``. QoS per
topic: the reliability and durability the bag recorded, else reliable keep last 100, latched for routes,
``/tf_static``, camera info and status topics (and ``--latched``). Topics whose type has no Python
message package here are skipped with a warning (an error when named in ``--topics``). Messages published
before a subscriber is matched are lost, hence ``--wait-for-subscribers`` and ``--wait-for-planner``;
``--record`` (:mod:`.recorder`): README, replaying a bag. An error or Ctrl-C leaves nothing at ``--record``.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rosgraph_msgs.msg import Clock

from wam_diff2_core import topics
from wam_diff2_core.evaluation.bags import Bag, BagError

from ..conversions import ns_to_stamp
from ..msg import PlannerStatus
from ..optional_msgs import message_class
from ..planner.interface import OUTPUT_TOPICS
from ..qos import DEEP_RELIABLE_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS, keep_last_qos
from ..spinning import SpinThread
from .cli import RECORD_GRACE_S, RECORD_STORAGE
from .recorder import RecordError, TopicRecorder

log = logging.getLogger("wam_diff2.replay")

LATCHED_SUFFIXES = ("/waypoints", "/route", "/tf_static", "/camera_info", "/status", "/input/route")
DRAIN_TIMEOUT_S = 5.0   # how long the end of playback waits for reliable readers to acknowledge
PLANNER_NODE = f"/{topics.PLANNER_NODE}"


def planner_record_topics(node: str = PLANNER_NODE) -> tuple[str, ...]:
    """The planner outputs --record takes by default (its trajectory, detections and status), for the planner
    node ``node`` (full name)."""
    return tuple(OUTPUT_TOPICS[key].replace("~", node.rstrip("/"), 1) for key in ("trajectory", "detections", "status"))


DEFAULT_RECORD_TOPICS = planner_record_topics()


class ReplayError(Exception):
    """The bag or the options cannot be played; the message says why."""


def qos_for(topic: str, recorded: Sequence[Any], latched: Sequence[str]) -> QoSProfile:
    """The recorded offered QoS (reliability, durability) when the bag has one; otherwise by topic name."""
    from rosbags.interfaces import QosDurability, QosReliability

    if topic in latched:
        return LATCHED_QOS
    if recorded:
        q = recorded[0]
        transient = q.durability == QosDurability.TRANSIENT_LOCAL
        best_effort = q.reliability == QosReliability.BEST_EFFORT
        return keep_last_qos(1 if transient else DEEP_RELIABLE_QOS.depth, reliable=not best_effort, latched=transient)
    return LATCHED_QOS if topic.endswith(LATCHED_SUFFIXES) else DEEP_RELIABLE_QOS


def check_options(o) -> None:
    """Raises ReplayError for a ``replay`` option (:func:`.cli.add_replay_arguments`) out of its range."""
    if not o.rate > 0:
        raise ReplayError(f"--rate must be > 0, got {o.rate}")
    if not o.clock_hz > 0:
        raise ReplayError(f"--clock-hz must be > 0, got {o.clock_hz}")
    if o.delay_s < 0 or o.start_offset_s < 0:
        raise ReplayError("--delay-s and --start-offset must be >= 0")
    if o.playback_duration_s is not None and o.playback_duration_s <= 0:
        raise ReplayError(f"--playback-duration must be > 0, got {o.playback_duration_s}")
    if o.wait_timeout_s <= 0:
        raise ReplayError(f"--wait-timeout-s must be > 0, got {o.wait_timeout_s}")
    if o.record is None:
        return
    if not o.record_grace_s >= 0:
        raise ReplayError(f"--record-grace-s must be >= 0, got {o.record_grace_s}")
    if not o.record_topics:
        raise ReplayError("--record-topics: name at least one topic")
    bad = [t for t in o.record_topics if not t.startswith("/")]
    if bad:
        raise ReplayError(f"--record-topics: {', '.join(bad)} is not an absolute topic name (/...)")
    if Path(o.record).exists() and not o.overwrite:
        raise ReplayError(f"--record {o.record} already exists (use --overwrite to replace it)")


@dataclass
class ReplaySummary:
    published: dict[str, int] = field(default_factory=dict)
    skipped_topics: dict[str, str] = field(default_factory=dict)
    unacknowledged_topics: list[str] = field(default_factory=list)   # reliable readers that did not ack in time
    bag_seconds: float = 0.0
    wall_seconds: float = 0.0
    recorded: dict[str, int] = field(default_factory=dict)       # --record: messages per recorded topic
    record_path: str | None = None


class BagPlayer:
    """Publishes one bag's messages from ``node`` with their recorded timing; ``options``: the ``replay`` command's
    arguments (:func:`.cli.add_replay_arguments`), the ``--record`` ones completed by :func:`run`."""

    def __init__(self, node: Node, bag_path, options: argparse.Namespace):
        self.node, self.options = node, options
        self.bag = Bag(bag_path)
        self.summary = ReplaySummary()
        wanted = list(options.topics) or sorted(self.bag.topic_types)
        missing = [t for t in wanted if t not in self.bag.topic_types]
        if missing:
            raise ReplayError(f"{self.bag.path}: no topic(s) {', '.join(missing)} in the bag "
                              f"(it has: {', '.join(sorted(self.bag.topic_types)) or 'none'})")
        self.publishers: dict[str, Any] = {}
        for topic in wanted:
            msgtype = self.bag.topic_types[topic]
            if options.clock and topic == "/clock":
                self.summary.skipped_topics[topic] = "replaced by --clock"
                continue
            cls = message_class(msgtype)
            if cls is None:
                if options.topics:
                    raise ReplayError(f"{topic}: no Python message package for {msgtype} is importable here")
                self.summary.skipped_topics[topic] = f"{msgtype} is not importable here"
                log.warning("skipping %s: %s is not importable here", topic, msgtype)
                continue
            qos = qos_for(topic, self.bag.topic_qos.get(topic, []), options.latched)
            self.publishers[topic] = node.create_publisher(cls, topic, qos)
            self.summary.published[topic] = 0
        self.clock_publisher = node.create_publisher(Clock, "/clock", LATEST_RELIABLE_QOS) if options.clock else None
        unknown = [t for t in options.wait_for_subscribers
                   if t not in self.publishers and not (t == "/clock" and self.clock_publisher is not None)]
        if unknown:
            raise ReplayError(f"--wait-for-subscribers: {', '.join(unknown)} is not played")
        self.recorder: TopicRecorder | None = None
        if options.record is not None:
            record = Path(options.record).resolve()
            if record == self.bag.path.resolve() or record in self.bag.path.resolve().parents:
                raise ReplayError(f"--record {options.record} is the bag being played")
            try:
                self.recorder = TopicRecorder(node, options.record, options.record_topics,
                                              storage=options.record_storage, overwrite=options.overwrite,
                                              clock_ns=self.playback_ns)
            except BagError as exc:
                raise ReplayError(f"--record: {exc}") from None
        # playback time: the bag's time base, advancing at `rate` once the first message is due
        self.start_ns = self.bag.start_ns + int(options.start_offset_s * 1e9)
        self._wall0: float | None = None
        self.planner_status: tuple[int, str] | None = None
        if options.wait_for_planner:
            self.status_topic = options.planner_node.rstrip("/") + "/status"
            node.create_subscription(PlannerStatus, self.status_topic, self._on_planner_status, LATCHED_QOS)
        self._spinner: SpinThread | None = None

    def playback_ns(self) -> int:
        """The playback clock: the bag's start until playback begins, then start + elapsed wall x rate."""
        if self._wall0 is None:
            return self.start_ns
        return self.start_ns + int((time.monotonic() - self._wall0) * self.options.rate * 1e9)

    def _on_planner_status(self, msg) -> None:
        self.planner_status = (int(msg.state), str(msg.message))

    def _stop_spinning(self) -> None:
        if self._spinner is not None:
            self._spinner.stop(destroy_node=False, timeout_s=DRAIN_TIMEOUT_S)
            self._spinner = None

    def _wait_for_subscribers(self, start_ns: int) -> None:
        """Publish the start time on /clock until every --wait-for-subscribers topic has a subscriber,
        every recorded topic has a publisher matched by its subscription and the planner is READY."""
        o = self.options
        publishers = {t: (self.clock_publisher if t == "/clock" else self.publishers[t]) for t in o.wait_for_subscribers}
        deadline = time.monotonic() + o.wait_timeout_s
        if self._spinner is None and (self.recorder is not None or o.wait_for_planner):
            self._spinner = SpinThread(self.node)     # subscriptions (recording, planner status) need an executor
        while True:
            waiting = []
            no_subscriber = [t for t, p in publishers.items() if p.get_subscription_count() == 0]
            if no_subscriber:
                waiting.append(f"no subscriber on {', '.join(no_subscriber)}")
            if self.recorder is not None:
                no_publisher = self.recorder.discover()
                if no_publisher:
                    waiting.append(f"no publisher of --record-topics {', '.join(no_publisher)} (is the node "
                                   "running, in this ROS_DOMAIN_ID?)")
                unmatched = self.recorder.unmatched()
                if unmatched:
                    waiting.append(f"the recording subscription has not matched {', '.join(unmatched)}")
            if o.wait_for_planner:
                status = self.planner_status
                if status is not None and status[0] == PlannerStatus.ERROR:
                    raise ReplayError(f"--wait-for-planner: {self.status_topic} reports ERROR: {status[1]}")
                if status is None or status[0] != PlannerStatus.READY:
                    waiting.append(f"no READY on {self.status_topic}"
                                   + (f" (last: {status[1]})" if status else " (no status received)"))
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ReplayError(f"{'; '.join(waiting)} within {o.wait_timeout_s} s")
            self._publish_clock(start_ns)
            time.sleep(1.0 / o.clock_hz)

    def _publish_clock(self, t_ns: int) -> None:
        if self.clock_publisher is not None:
            self.clock_publisher.publish(Clock(clock=ns_to_stamp(t_ns)))

    def play(self) -> ReplaySummary:
        try:
            summary = self._play()
            if self.recorder is not None:
                self._stop_spinning()
                summary.recorded = self.recorder.counts
                summary.record_path = str(self.recorder.finish())
            return summary
        finally:
            self._stop_spinning()

    def _play(self) -> ReplaySummary:
        o = self.options
        start_ns = self.start_ns
        stop_ns = None if o.playback_duration_s is None else start_ns + int(o.playback_duration_s * 1e9)
        clock_period_s = 1.0 / o.clock_hz
        # the clock stands at the bag's start while subscribers discover us
        self._wait_for_subscribers(start_ns)
        wall_end = time.monotonic() + o.delay_s
        while True:
            self._publish_clock(start_ns)
            left = wall_end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, clock_period_s))
        wall0 = self._wall0 = time.monotonic()
        next_clock = wall0
        last_ns = start_ns

        for topic, t_ns, _, data in self.bag.raw_messages(list(self.publishers)):
            if t_ns < start_ns:
                continue
            if stop_ns is not None and t_ns >= stop_ns:
                break
            due = wall0 + (t_ns - start_ns) / 1e9 / o.rate
            while True:                    # sleep until due, ticking the clock meanwhile
                now = time.monotonic()
                if self.clock_publisher is not None and now >= next_clock:
                    self._publish_clock(min(self.playback_ns(), t_ns))
                    next_clock = now + clock_period_s
                if now >= due:
                    break
                time.sleep(max(0.0, min(due, next_clock if self.clock_publisher else due) - now))
            self._publish_clock(t_ns)      # the clock is never behind a message it comes with
            self.publishers[topic].publish(bytes(data))
            self.summary.published[topic] += 1
            last_ns = t_ns
        last_played = time.monotonic()
        self._publish_clock(last_ns)
        # Reliable subscribers still receiving must get the tail too: exiting right after the last
        # publish can drop it, so wait (bounded) until every reliable message is acknowledged.
        for publisher in [*self.publishers.values(), self.clock_publisher]:
            if publisher is not None and not publisher.wait_for_all_acked(Duration(seconds=DRAIN_TIMEOUT_S)):
                self.summary.unacknowledged_topics.append(publisher.topic_name)
        self.summary.bag_seconds = (last_ns - start_ns) / 1e9
        self.summary.wall_seconds = time.monotonic() - wall0
        if self.recorder is not None:      # the planner's answers to the last frames are still coming
            left = last_played + o.record_grace_s - time.monotonic()
            if left > 0:
                time.sleep(left)
        return self.summary

    def close(self) -> None:
        """Stop spinning, drop an unfinished recording (nothing appears at --record) and close the bag."""
        self._stop_spinning()
        if self.recorder is not None:
            self.recorder.abort()
        self.bag.close()


def run(args) -> int:
    """Play ``args.bag``; 0 when done, 2 with a one-line error for a bag or option that cannot be played."""
    from rclpy.signals import SignalHandlerOptions

    node = player = None
    try:
        if args.record is None and (args.record_topics or args.record_grace_s is not None
                                    or args.record_storage is not None):
            raise ReplayError("--record-topics, --record-grace-s and --record-storage need --record OUT_BAG")
        # the --record options are None unless given: their defaults, on a copy (the caller's args stay as given)
        args = argparse.Namespace(**vars(args))
        args.record_topics = args.record_topics or planner_record_topics(args.planner_node)
        args.record_storage = args.record_storage or RECORD_STORAGE
        args.record_grace_s = RECORD_GRACE_S if args.record_grace_s is None else args.record_grace_s
        check_options(args)
        # No rclpy signal handler: Ctrl-C is a KeyboardInterrupt in the playing loop (which sleeps in Python),
        # and the context stays valid until the finally below, instead of being shut down from the signal
        # while a publish is under way (which raised RCLError "publisher's context is invalid").
        rclpy.init(args=None if args.ros_args is None else ["--ros-args", *args.ros_args],
                   signal_handler_options=SignalHandlerOptions.NO)
        node = Node("wam_diff2_replay")
        player = BagPlayer(node, args.bag, args)
        counts = sum(player.bag.topic_counts.get(t, 0) for t in player.publishers)
        print(f"replay: {player.bag.path} ({player.bag.storage}), {counts} messages on {len(player.publishers)} "
              f"topics at rate {args.rate}" + (", publishing /clock" if args.clock else ""), flush=True)
        if args.record is not None:
            print(f"replay: recording {', '.join(args.record_topics)} into {args.record} "
                  f"(playback starts once each has a publisher)", flush=True)
        summary = player.play()
        for topic, reason in summary.skipped_topics.items():
            print(f"replay: skipped {topic}: {reason}", file=sys.stderr)
        for topic in summary.unacknowledged_topics:
            print(f"replay: {topic}: not every message was acknowledged within {DRAIN_TIMEOUT_S} s", file=sys.stderr)
        print(f"replay: published {sum(summary.published.values())} messages "
              f"({', '.join(f'{t} {n}' for t, n in sorted(summary.published.items()))}) covering "
              f"{summary.bag_seconds:.2f} s of bag time in {summary.wall_seconds:.2f} s", flush=True)
        if summary.record_path is not None:
            print(f"replay: recorded {sum(summary.recorded.values())} messages "
                  f"({', '.join(f'{t} {n}' for t, n in sorted(summary.recorded.items()))}) into "
                  f"{summary.record_path} ({args.record_storage}; logged at playback time)", flush=True)
            for topic, n in sorted(summary.recorded.items()):
                if n == 0:
                    print(f"replay: note: nothing was received on {topic}", file=sys.stderr)
        return 0
    except (BagError, ReplayError, RecordError) as exc:
        print(f"wam-diff2-ros replay: error: {exc}", file=sys.stderr)
        return 2
    finally:                            # Ctrl-C: after this, run_reporting_errors says "interrupted" (130)
        if player is not None:
            player.close()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()

