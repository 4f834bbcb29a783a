"""The localization node over real DDS: the demo world's GNSS / IMU / speedometer in, nav_msgs/Odometry out.

A probe node plays carla-ros-bridge: for each tick of the demo world's expert drive it publishes
the tick's NavSatFix, speedometer Float32 and Imu (the demo world's sensors with the leaderboard's
noise) on /carla/<role>/{gnss,speedometer,imu} and records /carla/<role>/odometry.
"""
from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Imu, NavSatFix  # noqa: E402
from std_msgs.msg import Float32, Header  # noqa: E402

from wam_diff2_core.geometry import wrap_angle, yaw_from_quaternion  # noqa: E402
from wam_diff2_core.localization import GeoReference, LocalizationSettings  # noqa: E402
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun  # noqa: E402
from wam_diff2_core.sim.sensors import DEMO_NOISE, DemoSensors  # noqa: E402
from wam_diff2_core.params import localization as lp  # noqa: E402
from wam_diff2_ros import localization_node as ln  # noqa: E402
from wam_diff2_ros.tools.dds_closed_loop import STREAM_QOS, sensor_messages  # noqa: E402
from wam_diff2_ros.controller_node import ns_stamp, stamp_ns  # noqa: E402
import ros_helpers  # noqa: E402
from ros_helpers import unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
WAIT_S = 10.0
ROLES = (f"loc{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=unique_domain_id(9))
    yield ctx
    rclpy.shutdown(context=ctx)


def wait_for(condition, timeout_s: float = WAIT_S):
    return ros_helpers.wait_for(condition, timeout_s, poll_s=0.005)


class Bridge(Node):
    """carla-ros-bridge's side: sensors out (reliable, as the bridge), odometry and diagnostics in."""

    def __init__(self, context, role: str):
        super().__init__(f"bridge_{role}", context=context)
        t = ln.localization_topics(role)
        self.gnss_pub = self.create_publisher(NavSatFix, t["gnss"], STREAM_QOS)
        self.imu_pub = self.create_publisher(Imu, t["imu"], STREAM_QOS)
        self.speed_pub = self.create_publisher(Float32, t["speedometer"], STREAM_QOS)
        self.lock = threading.Lock()
        self.odometry: list[Odometry] = []
        self.odometry_sub = self.create_subscription(Odometry, t["odometry"], self._on_odometry,
                                                     qos_profile_sensor_data)

    def _on_odometry(self, msg: Odometry) -> None:
        with self.lock:
            self.odometry.append(msg)

    def matched(self) -> bool:
        return all(p.get_subscription_count() > 0 for p in (self.gnss_pub, self.imu_pub, self.speed_pub)) \
            and self.odometry_sub.get_publisher_count() > 0


def spin(nodes, context):
    executor = SingleThreadedExecutor(context=context)
    for n in nodes:
        executor.add_node(n)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return executor, thread


@pytest.fixture
def rig(context):
    started = []

    def start(**params):
        role = next(ROLES)
        node = ln.LocalizationNode(f"localization_{role}", context=context, parameter_overrides=[
            Parameter("role_name", value=role), *[Parameter(k, value=v) for k, v in params.items()]])
        bridge = Bridge(context, role)
        executor, thread = spin([node, bridge], context)
        started.append((executor, thread, node, bridge))
        assert wait_for(bridge.matched), "the bridge probe and the node did not match"
        return node, bridge

    yield start
    for executor, thread, node, bridge in started:
        executor.shutdown()
        thread.join(5.0)
        node.destroy_node()
        bridge.destroy_node()


def test_node_turns_the_demo_worlds_sensors_into_odometry_close_to_the_truth(rig):
    node, bridge = rig()
    run = RouteRun(1, ClosedLoopSettings(seed=2000, route_length_m=100.0, traffic=True))
    sensors = DemoSensors(DEMO_NOISE, GeoReference(), np.random.default_rng(3))
    truth = {}
    for _ in range(160):                                       # 8 s of the expert's drive
        stamp = ns_stamp(run.stamp_ns)
        header = Header(stamp=stamp, frame_id="hero/gnss")
        fix, imu, speed = sensor_messages(sensors.read(run.world.ego), header)
        truth[run.stamp_ns] = run.world.ego
        count = len(bridge.odometry)
        bridge.gnss_pub.publish(fix)
        bridge.speed_pub.publish(speed)
        bridge.imu_pub.publish(imu)
        assert wait_for(lambda: len(bridge.odometry) > count), f"no odometry for tick {run.tick}"
        run.world.step()
    with bridge.lock:
        received = list(bridge.odometry)
    # one odometry per IMU message, stamped like it, in the map frame with the role as child
    assert [stamp_ns(m.header.stamp) for m in received] == sorted(truth)
    assert {m.header.frame_id for m in received} == {"map"}
    assert {m.child_frame_id for m in received} == {node.child_frame_id} and node.child_frame_id.startswith("loc")
    position, heading, speed = [], [], []
    for m in received[20:]:                                   # after a second of settling
        ego = truth[stamp_ns(m.header.stamp)]
        p, o = m.pose.pose.position, m.pose.pose.orientation
        position.append(math.hypot(p.x - ego.x, p.y - ego.y))
        heading.append(abs(wrap_angle(yaw_from_quaternion(o.x, o.y, o.z, o.w) - ego.yaw)))
        speed.append(abs(m.twist.twist.linear.x - ego.speed))
    assert np.median(position) < 0.3 and np.percentile(position, 95) < 0.6
    assert math.degrees(np.median(heading)) < 0.5 and np.median(speed) < 0.1
    # covariances filled: x, y, yaw and speed from the filter, the rest marked unobserved
    pose_cov, twist_cov = np.reshape(received[-1].pose.covariance, (6, 6)), np.reshape(received[-1].twist.covariance,
                                                                                      (6, 6))
    assert 0 < pose_cov[0, 0] < 1.0 and 0 < pose_cov[1, 1] < 1.0 and 0 < pose_cov[5, 5] < 1e-3
    assert pose_cov[2, 2] == pose_cov[3, 3] == pose_cov[4, 4] == ln.UNOBSERVED_VARIANCE
    assert np.allclose(pose_cov, pose_cov.T) and 0 < twist_cov[0, 0] < 0.1 and twist_cov[5, 5] > 0
    status = node.diagnostic_status()
    assert status.level == DiagnosticStatus.OK
    values = {kv.key: kv.value for kv in status.values}
    assert values["odometry_published"] == "160" and values["gnss_used"] == "160"


def test_no_odometry_before_a_fix_and_a_heading(rig):
    node, bridge = rig()
    header = Header(stamp=ns_stamp(5_000_000_000))
    imu = Imu(header=header)
    imu.orientation_covariance[0] = -1.0                      # "no orientation" (REP-145)
    bridge.imu_pub.publish(imu)
    assert wait_for(lambda: node.counts["imu_used"] == 1)
    fix = NavSatFix(header=header)
    fix.status.status = -1                                    # STATUS_NO_FIX
    bridge.gnss_pub.publish(fix)
    assert wait_for(lambda: node.counts["gnss_no_fix"] == 1)
    assert not bridge.odometry and node.diagnostic_status().level == DiagnosticStatus.WARN


def test_the_first_tick_is_answered_when_its_imu_comes_before_its_gnss_and_speed(rig):
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    sensors = DemoSensors(rng=np.random.default_rng(2))
    for k in range(3):
        fix, imu, speed = sensor_messages(sensors.read(run.world.ego), Header(stamp=ns_stamp(run.stamp_ns)))
        bridge.imu_pub.publish(imu)                           # the IMU first: at tick 0 the filter has no fix yet
        assert wait_for(lambda: node.counts["imu_used"] >= k + 1)
        bridge.gnss_pub.publish(fix)
        bridge.speed_pub.publish(speed)
        assert wait_for(lambda: any(stamp_ns(m.header.stamp) == run.stamp_ns for m in list(bridge.odometry)))
        run.world.step()
    time.sleep(0.2)
    assert [stamp_ns(m.header.stamp) for m in bridge.odometry] == [run.start_ns + k * run.dt_ns for k in range(3)]


def test_a_refused_parameter_keeps_the_node_up_reporting_and_silent(rig):
    node, bridge = rig(**{"filter.gnss_stddev_m": -1.0})
    assert node.diagnostic_status().level == DiagnosticStatus.ERROR
    assert "filter.gnss_stddev_m" in node.diagnostic_status().message
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    fix, imu, speed = sensor_messages(DemoSensors().read(run.world.ego), Header(stamp=ns_stamp(run.stamp_ns)))
    bridge.gnss_pub.publish(fix)
    bridge.imu_pub.publish(imu)
    assert wait_for(lambda: node.counts["imu_used"] == 1)
    time.sleep(0.2)
    assert not bridge.odometry


def test_filter_parameters_are_live_and_come_from_the_core_settings(rig):
    assert {s.name[len(lp.FILTER_PREFIX):]: s.default for s in lp.SPECS if s.name.startswith(lp.FILTER_PREFIX)} \
        == vars(LocalizationSettings())
    node, _ = rig()
    assert node.set_parameters([Parameter("filter.speed_stddev_mps", value=0.2)])[0].successful
    assert node.ekf.settings.speed_stddev_mps == 0.2
    assert not node.set_parameters([Parameter("filter.speed_stddev_mps", value=0.0)])[0].successful


def test_docs_parameter_table_is_the_generated_one():
    from pathlib import Path

    from wam_diff2_core.params.spec import markdown_table
    docs = Path(__file__).resolve().parents[1] / "docs" / "carla.md"
    assert markdown_table(lp.SPECS) in docs.read_text()
