"""Play a rosbag2 bag over DDS with its recorded timing, for machines without ``ros2 bag``.

    wam-diff2 replay BAG [--rate 1.0] [--clock] [--topics T ...] [--delay-s 1.0]
    python -m wam_diff2_ros.replay BAG --clock              # the same

Like ``ros2 bag play [--clock]``: every message is published, as recorded (the CDR bytes, no
re-encoding), at ``start + (t_log - t_first) / rate`` wall time; with ``--clock``,
``rosgraph_msgs/Clock`` on ``/clock`` carries the bag's time (at ``--clock-hz`` and right before
each message), so nodes under ``use_sim_time`` run on the recording's clock. A ``/clock``
recorded in the bag is not replayed when ``--clock`` makes one.

QoS per topic: the reliability and durability the bag recorded when it has them; otherwise
reliable, keep last 100, and transient local (latched, depth 1) for routes, ``/tf_static``,
camera info and status topics (``--latched`` adds more). Reliable publishers match
best-effort and reliable subscribers alike. Topics whose type has no Python message package
here are skipped with a warning (an error when named in ``--topics``).

DDS discovery takes a moment (seconds on a busy machine) and messages published before a
subscriber is matched are lost: ``--wait-for-subscribers TOPIC ...`` holds the start until
each named topic has a subscriber, then waits ``--delay-s`` more.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock

from wam_diff2_core.evaluation.bag import Bag, BagError

log = logging.getLogger("wam_diff2.replay")

LATCHED_SUFFIXES = ("/waypoints", "/route", "/tf_static", "/camera_info", "/status", "/input/route")
LATCHED_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
# a deep history lets a slow reliable reader (a Python node on a busy machine) catch up
STREAM_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.VOLATILE)
# reliable matches the best-effort /clock subscription of rclpy's and rclcpp's time sources and
# reliable subscribers too
CLOCK_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.VOLATILE)


DRAIN_TIMEOUT_S = 5.0   # how long the end of playback waits for reliable readers to acknowledge


class ReplayError(Exception):
    """The bag or the options cannot be played; the message says why."""


def message_class(msgtype: str):
    """``pkg/msg/Type`` -> the rclpy message class, or None when the package is not importable here."""
    try:
        package, kind, name = msgtype.split("/")
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    except (ValueError, ImportError, AttributeError):
        return None


def qos_for(topic: str, recorded: Sequence[Any], latched: Sequence[str] = ()) -> QoSProfile:
    """The recorded offered QoS (reliability, durability) when the bag has one; otherwise by topic name."""
    from rosbags.interfaces import QosDurability, QosReliability

    if topic in latched:
        return LATCHED_QOS
    if recorded:
        q = recorded[0]
        transient = q.durability == QosDurability.TRANSIENT_LOCAL
        best_effort = q.reliability == QosReliability.BEST_EFFORT
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1 if transient else STREAM_QOS.depth,
                          reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL if transient else DurabilityPolicy.VOLATILE)
    return LATCHED_QOS if topic.endswith(LATCHED_SUFFIXES) else STREAM_QOS


@dataclass
class ReplayOptions:
    rate: float = 1.0
    clock: bool = False
    clock_hz: float = 100.0
    topics: Sequence[str] = ()            # empty: every topic the bag has
    latched: Sequence[str] = ()
    delay_s: float = 1.0                  # wall time between creating the publishers and the first message
    start_offset_s: float = 0.0           # skip this much of the bag's beginning
    playback_duration_s: float | None = None   # stop after this much bag time
    wait_for_subscribers: Sequence[str] = ()   # start once each of these topics has a subscriber
    wait_timeout_s: float = 60.0

    def check(self) -> None:
        if not self.rate > 0:
            raise ReplayError(f"--rate must be > 0, got {self.rate}")
        if not self.clock_hz > 0:
            raise ReplayError(f"--clock-hz must be > 0, got {self.clock_hz}")
        if self.delay_s < 0 or self.start_offset_s < 0:
            raise ReplayError("--delay-s and --start-offset must be >= 0")
        if self.playback_duration_s is not None and self.playback_duration_s <= 0:
            raise ReplayError(f"--playback-duration must be > 0, got {self.playback_duration_s}")
        if self.wait_timeout_s <= 0:
            raise ReplayError(f"--wait-timeout-s must be > 0, got {self.wait_timeout_s}")


@dataclass
class ReplaySummary:
    published: dict[str, int] = field(default_factory=dict)
    skipped_topics: dict[str, str] = field(default_factory=dict)
    unacknowledged_topics: list[str] = field(default_factory=list)   # reliable readers that did not ack in time
    clock_messages: int = 0
    bag_seconds: float = 0.0
    wall_seconds: float = 0.0


class BagPlayer:
    """Publishes one bag's messages from ``node`` with their recorded timing."""

    def __init__(self, node: Node, bag_path, options: ReplayOptions):
        options.check()
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
        self.clock_publisher = node.create_publisher(Clock, "/clock", CLOCK_QOS) if options.clock else None
        unknown = [t for t in options.wait_for_subscribers
                   if t not in self.publishers and not (t == "/clock" and self.clock_publisher is not None)]
        if unknown:
            raise ReplayError(f"--wait-for-subscribers: {', '.join(unknown)} is not played")

    def _wait_for_subscribers(self, start_ns: int) -> None:
        """Publish the start time on /clock until every --wait-for-subscribers topic has a subscriber."""
        o = self.options
        publishers = {t: (self.clock_publisher if t == "/clock" else self.publishers[t]) for t in o.wait_for_subscribers}
        deadline = time.monotonic() + o.wait_timeout_s
        while True:
            waiting = [t for t, p in publishers.items() if p.get_subscription_count() == 0]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ReplayError(f"no subscriber on {', '.join(waiting)} within {o.wait_timeout_s} s")
            self._publish_clock(start_ns)
            time.sleep(1.0 / o.clock_hz)

    def _publish_clock(self, t_ns: int) -> None:
        if self.clock_publisher is not None:
            msg = Clock()
            msg.clock.sec, msg.clock.nanosec = int(t_ns // 1_000_000_000), int(t_ns % 1_000_000_000)
            self.clock_publisher.publish(msg)
            self.summary.clock_messages += 1

    def play(self) -> ReplaySummary:
        o = self.options
        start_ns = self.bag.start_ns + int(o.start_offset_s * 1e9)
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
        wall0 = time.monotonic()
        next_clock = wall0
        last_ns = start_ns

        def bag_now_ns() -> int:
            return start_ns + int((time.monotonic() - wall0) * o.rate * 1e9)

        for topic, t_ns, _, data in self.bag.raw_messages(list(self.publishers)):
            if t_ns < start_ns:
                continue
            if stop_ns is not None and t_ns >= stop_ns:
                break
            due = wall0 + (t_ns - start_ns) / 1e9 / o.rate
            while True:                    # sleep until due, ticking the clock meanwhile
                now = time.monotonic()
                if self.clock_publisher is not None and now >= next_clock:
                    self._publish_clock(min(bag_now_ns(), t_ns))
                    next_clock = now + clock_period_s
                if now >= due:
                    break
                time.sleep(max(0.0, min(due, next_clock if self.clock_publisher else due) - now))
            self._publish_clock(t_ns)      # the clock is never behind a message it comes with
            self.publishers[topic].publish(bytes(data))
            self.summary.published[topic] += 1
            last_ns = t_ns
        self._publish_clock(last_ns)
        # Reliable subscribers still receiving must get the tail too: exiting right after the last
        # publish can drop it, so wait (bounded) until every reliable message is acknowledged.
        for publisher in [*self.publishers.values(), self.clock_publisher]:
            if publisher is not None and not publisher.wait_for_all_acked(Duration(seconds=DRAIN_TIMEOUT_S)):
                self.summary.unacknowledged_topics.append(publisher.topic_name)
        self.summary.bag_seconds = (last_ns - start_ns) / 1e9
        self.summary.wall_seconds = time.monotonic() - wall0
        return self.summary

    def close(self) -> None:
        self.bag.close()


# ----------------------------------------------------------------------------- command line
def options_from_args(args) -> ReplayOptions:
    return ReplayOptions(rate=args.rate, clock=args.clock, clock_hz=args.clock_hz, topics=tuple(args.topics),
                         latched=tuple(args.latched), delay_s=args.delay_s, start_offset_s=args.start_offset,
                         playback_duration_s=args.playback_duration,
                         wait_for_subscribers=tuple(args.wait_for_subscribers), wait_timeout_s=args.wait_timeout_s)


def run(args, ros_args: Sequence[str] | None = None) -> int:
    """Play ``args.bag``; 0 when done, 2 with a one-line error for a bag or option that cannot be played."""
    options = options_from_args(args)
    rclpy.init(args=list(ros_args) if ros_args else None)
    node = None
    player = None
    try:
        node = Node("wam_diff2_replay")
        player = BagPlayer(node, args.bag, options)
        counts = sum(player.bag.topic_counts.get(t, 0) for t in player.publishers)
        print(f"replay: {player.bag.path} ({player.bag.storage}), {counts} messages on {len(player.publishers)} "
              f"topics at rate {options.rate}" + (", publishing /clock" if options.clock else ""), flush=True)
        summary = player.play()
        for topic, reason in summary.skipped_topics.items():
            print(f"replay: skipped {topic}: {reason}", file=sys.stderr)
        for topic in summary.unacknowledged_topics:
            print(f"replay: {topic}: not every message was acknowledged within {DRAIN_TIMEOUT_S} s", file=sys.stderr)
        print(f"replay: published {sum(summary.published.values())} messages "
              f"({', '.join(f'{t} {n}' for t, n in sorted(summary.published.items()))}) covering "
              f"{summary.bag_seconds:.2f} s of bag time in {summary.wall_seconds:.2f} s", flush=True)
        return 0
    except (BagError, ReplayError) as exc:
        print(f"wam-diff2 replay: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wam-diff2 replay: interrupted", file=sys.stderr)
        return 130
    finally:
        if player is not None:
            player.close()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ros_args = []
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        argv, ros_args = argv[:i], argv[i:]
    from wam_diff2_core.cli.replay import add_arguments   # the options live with the `wam-diff2 replay` CLI

    parser = argparse.ArgumentParser(prog="python -m wam_diff2_ros.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, ros_args=False)
    return run(parser.parse_args(argv), ros_args)


if __name__ == "__main__":
    sys.exit(main())
