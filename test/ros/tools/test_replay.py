"""``wam-diff2-ros replay``: a bag published over real DDS (rclpy + Fast DDS) with its timing and /clock."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from nav_msgs.msg import Odometry, Path  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from wam_diff2_ros.tools.cli import main  # noqa: E402
from wam_diff2_core.evaluation.bag_types import default_typestore  # noqa: E402
from wam_diff2_core.evaluation.bag_writer import write_bag  # noqa: E402
from wam_diff2_core.frame_inputs import stamp_ns  # noqa: E402
from test.support.scenes import scene_messages, scene_topic_types, straight_scene, \
    write_scene_bag  # noqa: E402
from test.support.ros_helpers import unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
DOMAIN = unique_domain_id(3)
IMAGE, ODOM, ROUTE = ("/carla/ego_vehicle/rgb_front/image", "/carla/ego_vehicle/odometry",
                      "/carla/ego_vehicle/waypoints")
RELIABLE = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class Listener:
    """A node in its own context and thread that records what arrives, with the wall time."""

    def __init__(self, domain_id: int):
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("replay_listener", context=self.context)
        self.lock = threading.Lock()
        self.got: dict[str, list] = {"image": [], "odometry": [], "clock": [], "route": []}
        self.subscribe("image", Image, IMAGE, RELIABLE)
        self.subscribe("odometry", Odometry, ODOM, RELIABLE)
        self.subscribe("clock", Clock, "/clock", RELIABLE)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def subscribe(self, key, kind, topic, qos):
        def record(msg):
            with self.lock:
                self.got[key].append((time.monotonic(), msg))
        self.node.create_subscription(kind, topic, record, qos)

    def items(self, key):
        with self.lock:
            return list(self.got[key])

    def close(self):
        self.executor.shutdown()
        self.thread.join(5)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def test_replay_publishes_recorded_stamps_in_order_with_timing_clock_and_latched_route(tmp_path):
    scene = straight_scene(8.0, duration_s=2.0, camera_hz=10.0, odometry_hz=20.0)
    bag = write_scene_bag(tmp_path / "bag", scene, storage="mcap")
    listener = Listener(DOMAIN)
    try:
        env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN))
        proc = subprocess.Popen([sys.executable, "-m", "wam_diff2_ros.tools", "replay", str(bag), "--clock", "--rate",
                                 "2.0", "--delay-s", "0.5", "--wait-for-subscribers", IMAGE, ODOM, "/clock"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not listener.items("image") and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        # a subscriber that joins during playback still gets the (latched) route
        listener.subscribe("route", Path, ROUTE, LATCHED)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        time.sleep(0.5)
        images, odometry = listener.items("image"), listener.items("odometry")
        clock, route = listener.items("clock"), listener.items("route")
    finally:
        listener.close()

    assert [stamp_ns(m.header.stamp) for _, m in images] == scene.camera_times_ns()
    assert [stamp_ns(m.header.stamp) for _, m in odometry] == scene.odometry_times_ns()
    assert images[5][1].encoding == "bgra8" and bytes(images[5][1].data[:8]) != bytes(8)
    span = images[-1][0] - images[0][0]                     # 2 s of bag at rate 2
    assert 0.7 < span < 1.6, span
    gaps = [b[0] - a[0] for a, b in zip(images, images[1:])]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.05, abs=0.03)
    clock_ns = [stamp_ns(m.clock) for _, m in clock]
    assert clock_ns == sorted(clock_ns) and len(clock_ns) > 50
    assert clock_ns[0] >= 1000 * 10**9 - 10**8 and clock_ns[-1] == scene.camera_times_ns()[-1]
    # the clock is set to each message's time as it goes out (the arrival order across two topics is
    # DDS's and the listener's business, so the test checks the values, not which callback ran first)
    assert set(scene.camera_times_ns()) | set(scene.odometry_times_ns()) <= set(clock_ns)
    assert len(route) == 1 and len(route[0][1].poses) == len(scene.route)
    assert "published" in out and "/carla/ego_vehicle/rgb_front/image 21" in out


def replay_and_receive(bag, topic: str, msg_type, expected: int, rate: float) -> tuple[subprocess.CompletedProcess, list]:
    """``wam-diff2-ros replay BAG`` in a subprocess while a listener here takes ``topic`` (reliable): the
    finished replay and what arrived (waiting up to 10 s after it for ``expected`` messages)."""
    listener = Listener(DOMAIN)
    received = []
    listener.node.create_subscription(msg_type, topic, received.append,
                                      QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    try:
        env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN))
        proc = subprocess.run([sys.executable, "-m", "wam_diff2_ros.tools", "replay", str(bag), "--rate", str(rate),
                               "--delay-s", "0.5", "--wait-for-subscribers", topic], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + 10
        while len(received) < expected and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        listener.close()
    return proc, received


def test_a_bags_tf_is_replayed_as_the_real_tf2_msgs_type(tmp_path):
    """/tf (the demo bags' map -> hero -> camera, carla-ros-bridge's) is published, not skipped, where tf2_msgs
    imports (scripts/build_ros_interfaces.sh builds it here): every message, its frames and stamps as recorded."""
    from test.support.ros_packages import interface_module
    tf2_msgs = interface_module("tf2_msgs")
    store = default_typestore()
    types = store.types
    stamps = [1000 * 10**9 + k * 50_000_000 for k in range(5)]
    messages = []
    for k, t in enumerate(stamps):
        header = types["std_msgs/msg/Header"](stamp=types["builtin_interfaces/msg/Time"](sec=t // 10**9,
                                                                                       nanosec=t % 10**9),
                                              frame_id="map")
        transform = types["geometry_msgs/msg/Transform"](
            translation=types["geometry_msgs/msg/Vector3"](x=float(k), y=2.0, z=0.0),
            rotation=types["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0))
        stamped = types["geometry_msgs/msg/TransformStamped"](header=header, child_frame_id="hero",
                                                              transform=transform)
        messages.append(("/tf", t, types["tf2_msgs/msg/TFMessage"](transforms=[stamped])))
    bag = write_bag(tmp_path / "bag", {"/tf": "tf2_msgs/msg/TFMessage"}, messages, typestore=store)
    proc, received = replay_and_receive(bag, "/tf", tf2_msgs.TFMessage, len(stamps), rate=5)
    assert "skipped /tf" not in proc.stderr
    assert [stamp_ns(m.transforms[0].header.stamp) for m in received] == stamps
    assert [(m.transforms[0].header.frame_id, m.transforms[0].child_frame_id, m.transforms[0].transform.translation.x)
            for m in received] == [("map", "hero", float(k)) for k in range(5)]


def test_replay_refuses_what_it_cannot_play(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", str(DOMAIN))
    s = straight_scene(8.0, duration_s=0.3, camera_hz=10.0, odometry_hz=20.0, route=None)
    store = default_typestore()
    from rosbags.typesys import get_types_from_msg
    store.register(get_types_from_msg("float64 x", "acme_msgs/msg/Thing"))
    topics = dict(scene_topic_types(s), **{"/acme/thing": "acme_msgs/msg/Thing"})
    messages = list(scene_messages(s, store.types)) + [("/acme/thing", 1000 * 10**9, store.types["acme_msgs/msg/Thing"](x=1.0))]
    bag = write_bag(tmp_path / "bag", topics, sorted(messages, key=lambda m: m[1]), typestore=store)

    assert main(["replay", str(bag), "--topics", "/nope"]) == 2
    assert "no topic(s) /nope in the bag" in capsys.readouterr().err
    assert main(["replay", str(bag), "--rate", "0"]) == 2
    assert "--rate must be > 0" in capsys.readouterr().err
    assert main(["replay", str(bag), "--wait-for-subscribers", IMAGE, "--wait-timeout-s", "0.5"]) == 2
    assert f"no subscriber on {IMAGE} within 0.5 s" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["replay", str(bag), "--topics", "/acme/thing"]) == 2          # asked for, cannot be published
    assert "acme_msgs/msg/Thing" in capsys.readouterr().err
    assert main(["replay", str(bag), "--delay-s", "0", "--rate", "10"]) == 0  # otherwise skipped with a note
    captured = capsys.readouterr()
    assert "skipped /acme/thing" in captured.err and "Traceback" not in captured.err
    assert "published 15 messages" in captured.out                            # 4 images + 4 infos + 7 odometry


def test_a_demo_bags_objects_are_replayed_as_the_real_derived_object_msgs_type(tmp_path):
    """The demo bag's other vehicles (carla-ros-bridge's ``/carla/<role>/objects``) are published, not skipped,
    where derived_object_msgs imports (scripts/build_ros_interfaces.sh builds it; scripts/env.sh puts it on
    the path): the planner's ~/input/objects sees them as behind the bridge."""
    from test.support.ros_packages import interface_module
    from wam_diff2_core.evaluation.bags import Bag
    derived_object_msgs = interface_module("derived_object_msgs")
    objects = "/carla/ego_vehicle/objects"
    subprocess.run([sys.executable, "-m", "wam_diff2_core.cli", "synth", str(tmp_path / "drive"), "--episodes", "1",
                    "--frames", "4", "--frame-stride", "5", "--seed", "1000", "--formats", "mcap",
                    "--val-fraction", "0", "--no-progress"], check=True, capture_output=True, timeout=300)
    bag = tmp_path / "drive" / "bags" / "mcap" / "e0000"
    with Bag(bag) as reader:
        recorded = [(t, msg) for topic, t, msg in reader.messages([objects])]
    assert recorded and any(len(m.objects) for _, m in recorded)
    proc, received = replay_and_receive(bag, objects, derived_object_msgs.ObjectArray, len(recorded), rate=4)
    assert f"skipped {objects}" not in proc.stderr and "not importable" not in proc.stderr
    assert [stamp_ns(m.header.stamp) for m in received] == [stamp_ns(m.header.stamp) for _, m in recorded]
    first = next(k for k, (_, m) in enumerate(recorded) if len(m.objects))
    got, want = received[first].objects[0], recorded[first][1].objects[0]
    assert (got.id, got.pose.position.x, got.twist.linear.x, list(got.shape.dimensions)) == \
        (want.id, want.pose.position.x, want.twist.linear.x, list(want.shape.dimensions))
