"""How many raw camera frames reach the planner's image subscription, per image QoS (real Fast DDS).

    python scripts/image_qos.py                                  # 1600x900 bgra8, 10 and 20 Hz, both QoS
    python scripts/image_qos.py --frames 200 --rate-hz 20 --reliability best_effort --publisher best_effort

For each ``image_reliability`` setting of the planner node (``best_effort``: sensor-data QoS; ``reliable``:
keep all) a subscriber process subscribes to ``/image_qos/image`` with exactly the node's profile
(``wam_diff2_ros.planner.interface.IMAGE_QOS``) and counts what arrives; this process publishes
``--frames`` frames at ``--rate-hz`` with a publisher QoS like carla-ros-bridge's camera (reliable,
keep last 10; ``--publisher best_effort``: sensor-data QoS, like most camera drivers), then tells the
subscriber it is done. Prints one line per run and a table. Use a DDS domain of your own
(``--domain-id`` or ROS_DOMAIN_ID) so other ROS processes do not join in.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DONE_TOPIC = "/image_qos/done"
IMAGE_TOPIC = "/image_qos/image"
READY = "ready"


def _qos():
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

    publishers = {"reliable": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,   # carla-ros-bridge's
                                         durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST),
                  "best_effort": qos_profile_sensor_data}
    done = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                      history=HistoryPolicy.KEEP_LAST)
    return publishers, done


def subscribe(reliability: str, domain_id: int, timeout_s: float) -> int:
    """The subscriber process: count images until the publisher says it is done; print a JSON line."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image
    from std_msgs.msg import Int64

    from wam_diff2_ros.planner.interface import IMAGE_QOS

    _, done_qos = _qos()
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain_id)
    node = rclpy.create_node("image_qos_subscriber", context=ctx)
    state = {"received": 0, "bytes_ok": 0, "sent": None}

    def on_image(msg):
        state["received"] += 1
        state["bytes_ok"] += len(msg.data) == msg.step * msg.height

    node.create_subscription(Image, IMAGE_TOPIC, on_image, IMAGE_QOS[reliability])
    node.create_subscription(Int64, DONE_TOPIC, lambda m: state.update(sent=m.data), done_qos)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    print(READY, flush=True)
    deadline = time.monotonic() + timeout_s
    while state["sent"] is None and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    end = time.monotonic() + 1.0            # frames still in flight behind the done message
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.05)
    print(json.dumps(state), flush=True)
    node.destroy_node()
    rclpy.shutdown(context=ctx)
    return 0


def measure(reliability: str, publisher: str, rate_hz: float, frames: int, width: int, height: int,
            domain_id: int) -> dict:
    """One run: a subscriber process with the node's ``reliability`` profile, frames published from here."""
    import rclpy
    from sensor_msgs.msg import Image
    from std_msgs.msg import Int64

    publishers, done_qos = _qos()
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id))
    sub = subprocess.Popen([sys.executable, __file__, "--subscriber", reliability, "--domain-id", str(domain_id),
                            "--timeout-s", str(frames / rate_hz + 60.0)],
                           stdout=subprocess.PIPE, text=True, env=env)
    assert sub.stdout.readline().strip() == READY, "the subscriber did not start"
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain_id)
    node = rclpy.create_node("image_qos_publisher", context=ctx)
    try:
        pub = node.create_publisher(Image, IMAGE_TOPIC, publishers[publisher])
        done = node.create_publisher(Int64, DONE_TOPIC, done_qos)
        deadline = time.monotonic() + 30.0
        while pub.get_subscription_count() == 0 or done.get_subscription_count() == 0:
            assert time.monotonic() < deadline, "the subscriber never matched"
            time.sleep(0.05)
        time.sleep(0.5)                      # discovery settles on both sides
        step = width * 4
        msg = Image(height=height, width=width, encoding="bgra8", step=step, data=bytes(step * height))
        period = 1.0 / rate_hz
        start = time.monotonic()
        for i in range(frames):
            wait = start + i * period - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(i * int(period * 1e9), 1_000_000_000)
            pub.publish(msg)
        took = time.monotonic() - start
        done.publish(Int64(data=frames))
        out, _ = sub.communicate(timeout=120)
    finally:
        if sub.poll() is None:
            sub.kill()
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    result = json.loads(out.strip().splitlines()[-1])
    return {"reliability": reliability, "publisher": publisher, "rate_hz": rate_hz, "frames": frames,
            "received": result["received"], "whole": result["bytes_ok"], "publish_s": round(took, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=100, help="frames per run (default 100)")
    p.add_argument("--rate-hz", type=float, nargs="+", default=[10.0, 20.0])
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--reliability", nargs="+", default=["best_effort", "reliable"],
                   choices=("best_effort", "reliable"), help="the planner's image_reliability settings to measure")
    p.add_argument("--publisher", default="reliable", choices=("reliable", "best_effort"),
                   help="publisher QoS: reliable, keep last 10 (carla-ros-bridge) or sensor data")
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0") or 0))
    p.add_argument("--subscriber", default=None, help=argparse.SUPPRESS)
    p.add_argument("--timeout-s", type=float, default=120.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.subscriber:
        return subscribe(args.subscriber, args.domain_id, args.timeout_s)
    rows = []
    for reliability in args.reliability:
        if reliability == "reliable" and args.publisher == "best_effort":
            print("skipping reliable: a reliable subscription does not match a best-effort publisher")
            continue
        for rate in args.rate_hz:
            row = measure(reliability, args.publisher, rate, args.frames, args.width, args.height, args.domain_id)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\n{args.width}x{args.height} bgra8 ({args.width * args.height * 4 / 1e6:.2f} MB per frame), "
          f"{args.publisher} publisher, domain {args.domain_id}")
    print("| image_reliability | rate | received |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['reliability']} | {r['rate_hz']:g} Hz | {r['received']} of {r['frames']} "
              f"({100.0 * r['received'] / r['frames']:.0f} %) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
