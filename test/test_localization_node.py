"""The localization node over real DDS: the demo world's GNSS / IMU / speedometer in, nav_msgs/Odometry out.

A probe node plays the Leaderboard 2.0 bridge: for each tick of the demo world's expert drive it
publishes the tick's NavSatFix (status left unset, as the bridge does), the real
carla_msgs/CarlaSpeedometer and the Imu (the demo world's sensors with the leaderboard's noise,
around CARLA's georeference 42.0 / 2.0) on /carla/<role>/{gnss,speedometer,imu} and records
/carla/<role>/odometry.
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
from geometry_msgs.msg import Pose  # noqa: E402
from sensor_msgs.msg import Imu, NavSatFix, NavSatStatus  # noqa: E402
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
from ros_packages import interface_module  # noqa: E402

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


def bridge_messages(reading, header: Header, speed_type=None) -> tuple[NavSatFix, Imu, object]:
    """One tick as the Leaderboard 2.0 bridge publishes it (the demo world's bridge messages): the NavSatFix
    status never set (the message's default, STATUS_UNKNOWN on Kilted), the speed as carla_msgs/CarlaSpeedometer
    with the tick's stamp (``speed_type=Float32``: a bare Float32 instead)."""
    fix, imu, speed = sensor_messages(reading, header.stamp, ln.localization_topics())
    assert fix.status.status == NavSatStatus.STATUS_UNKNOWN
    assert isinstance(speed, interface_module("carla_msgs").CarlaSpeedometer)
    return (fix, imu, Float32(data=float(speed.speed))) if speed_type is Float32 else (fix, imu, speed)


class Bridge(Node):
    """The Leaderboard 2.0 bridge's side: sensors out (reliable, as the bridge), odometry and diagnostics in."""

    def __init__(self, context, role: str, speed_type=None):
        super().__init__(f"bridge_{role}", context=context)
        t = self.topics = ln.localization_topics(role)
        self.gnss_pub = self.create_publisher(NavSatFix, t["gnss"], STREAM_QOS)
        self.imu_pub = self.create_publisher(Imu, t["imu"], STREAM_QOS)
        self.speed_pub = self.create_publisher(speed_type or interface_module("carla_msgs").CarlaSpeedometer,
                                               t["speedometer"], STREAM_QOS)
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

    def start(speed_type=None, match=True, **params):
        role = next(ROLES)
        node = ln.LocalizationNode(f"localization_{role}", context=context, parameter_overrides=[
            Parameter("role_name", value=role), *[Parameter(k, value=v) for k, v in params.items()]])
        bridge = Bridge(context, role, speed_type)
        executor, thread = spin([node, bridge], context)
        started.append((executor, thread, node, bridge))
        if match:
            assert wait_for(bridge.matched), "the bridge probe and the node did not match"
        return node, bridge

    yield start
    for executor, thread, node, bridge in started:
        executor.shutdown()
        thread.join(5.0)
        node.destroy_node()
        bridge.destroy_node()


def test_node_turns_the_demo_worlds_sensors_into_odometry_close_to_the_truth(rig):
    node, bridge = rig()                                       # every default: CarlaSpeedometer, 42.0 / 2.0
    assert (node.reference.lat_deg, node.reference.lon_deg) == (42.0, 2.0) == (GeoReference().lat_deg,
                                                                               GeoReference().lon_deg)
    run = RouteRun(1, ClosedLoopSettings(seed=2000, route_length_m=100.0, traffic=True))
    sensors = DemoSensors(DEMO_NOISE, GeoReference(), np.random.default_rng(3))
    truth = {}
    for _ in range(160):                                       # 8 s of the expert's drive
        stamp = ns_stamp(run.stamp_ns)
        header = Header(stamp=stamp, frame_id="hero/gnss")
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), header)
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
    assert values["odometry_published"] == "160" and values["gnss_used"] == "160" and values["speed_used"] == "160"
    assert values["speedometer_type"] == "carla_msgs/CarlaSpeedometer" and "gnss_no_fix" not in values


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
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), Header(stamp=ns_stamp(run.stamp_ns)))
        bridge.imu_pub.publish(imu)                           # the IMU first: at tick 0 the filter has no fix yet
        assert wait_for(lambda: node.counts["imu_used"] >= k + 1)
        bridge.gnss_pub.publish(fix)
        bridge.speed_pub.publish(speed)
        assert wait_for(lambda: any(stamp_ns(m.header.stamp) == run.stamp_ns for m in list(bridge.odometry)))
        run.world.step()
    time.sleep(0.2)
    assert [stamp_ns(m.header.stamp) for m in bridge.odometry] == [run.start_ns + k * run.dt_ns for k in range(3)]


def drive(node, bridge, run, sensors, ticks: int, speed_type=None) -> None:
    """``ticks`` ticks of the expert's drive into the node, each answered with odometry."""
    for _ in range(ticks):
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), Header(stamp=ns_stamp(run.stamp_ns)),
                                          speed_type)
        count = len(bridge.odometry)
        bridge.gnss_pub.publish(fix)
        bridge.speed_pub.publish(speed)
        bridge.imu_pub.publish(imu)
        assert wait_for(lambda: len(bridge.odometry) > count), f"no odometry for tick {run.tick}"
        run.world.step()


def test_fixes_with_status_unknown_or_zero_are_used_and_no_fix_or_nan_refused(rig):
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    fix, imu, speed = bridge_messages(DemoSensors().read(run.world.ego), Header(stamp=ns_stamp(run.stamp_ns)))
    statuses = (NavSatStatus.STATUS_UNKNOWN, NavSatStatus.STATUS_FIX, NavSatStatus.STATUS_NO_FIX)
    assert statuses == (-2, 0, -1)
    for k, status in enumerate(statuses):
        fix.status.status = status
        bridge.gnss_pub.publish(fix)
        assert wait_for(lambda: node.counts["gnss_used"] + node.counts["gnss_no_fix"] == k + 1)
    assert (node.counts["gnss_used"], node.counts["gnss_no_fix"]) == (2, 1)
    fix.status.status, fix.latitude = NavSatStatus.STATUS_UNKNOWN, math.nan
    bridge.gnss_pub.publish(fix)
    assert wait_for(lambda: node.counts["gnss_invalid"] == 1) and node.counts["gnss_used"] == 2


def test_a_float32_speedometer_is_read_when_the_parameter_says_so(rig):
    node, bridge = rig(speed_type=Float32, speedometer_type="std_msgs/Float32")
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    drive(node, bridge, run, DemoSensors(rng=np.random.default_rng(4)), 20, speed_type=Float32)
    assert node.counts["speed_used"] == 20 and bridge.odometry[-1].twist.twist.linear.x > 0.0
    assert node.diagnostic_status().level == DiagnosticStatus.OK


def test_a_speedometer_of_another_type_is_an_error_naming_it(rig):
    """The failure that kept the car standing: the node subscribed to one type, the bridge published
    another, nothing arrived and nothing said so. Now /diagnostics names the advertised type."""
    node, bridge = rig()                                       # the node expects CarlaSpeedometer (the default)
    topic = bridge.topics["speedometer"]
    assert node.diagnostic_status().level != DiagnosticStatus.ERROR
    # another process (its own DDS participant: one participant cannot hold two types on one topic)
    other = rclpy.Context()
    rclpy.init(context=other, domain_id=node.context.get_domain_id())
    try:
        float_bridge = Node("float32_bridge", context=other)
        float_pub = float_bridge.create_publisher(Float32, topic, STREAM_QOS)
        assert wait_for(lambda: len(node.get_publishers_info_by_topic(topic)) == 2)
        status = node.diagnostic_status()
        assert status.level == DiagnosticStatus.ERROR, status.message
        assert f"{topic} is published as std_msgs/msg/Float32" in status.message
        assert "speedometer_type:=std_msgs/Float32" in status.message
        assert float_pub.get_subscription_count() == 0         # the types do not match: no speed would arrive
        float_bridge.destroy_node()
    finally:
        rclpy.shutdown(context=other)


def test_without_carla_msgs_the_default_speedometer_type_is_a_config_error(rig, monkeypatch):
    monkeypatch.setattr(ln, "carla_msgs", None)              # as on a machine without carla_msgs
    node, _ = rig(match=False)
    status = node.diagnostic_status()
    assert status.level == DiagnosticStatus.ERROR
    assert "carla_msgs is not importable" in status.message and "speedometer_type" in status.message


def carla_route(start_xy, length_m: float = 100.0):
    """The leaderboard's route (carla_msgs/CarlaRoute, map frame) from ``start_xy`` eastwards."""
    carla_msgs = interface_module("carla_msgs")
    poses = []
    for k in range(int(length_m // 10) + 1):
        pose = Pose()
        pose.position.x, pose.position.y = start_xy[0] + 10.0 * k, start_xy[1]
        poses.append(pose)
    return carla_msgs.CarlaRoute(header=Header(frame_id="map"), poses=poses,
                                 road_options=[carla_msgs.CarlaRoute.LANEFOLLOW] * len(poses))


@pytest.mark.parametrize("georeference, far", [((42.0, 2.0), False), ((0.0, 0.0), True)])
def test_a_first_fix_far_from_the_route_start_is_an_error_with_the_distance(rig, georeference, far):
    """GNSS from CARLA's 42.0 / 2.0; the node right (the default) or left at the old 0 / 0, which puts
    the ego about 5,000 km from the route: an ERROR naming the distance, not a silent "off route"."""
    node, bridge = rig(**{"geo.lat_ref_deg": georeference[0], "geo.lon_ref_deg": georeference[1]})
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    route_pub = bridge.create_publisher(interface_module("carla_msgs").CarlaRoute, bridge.topics["carla_route"],
                                        ln.LATCHED_QOS)
    route_pub.publish(carla_route((run.world.ego.x, run.world.ego.y)))   # leaderboard routes start at the ego
    assert wait_for(lambda: node.counts["routes_received"] == 1)
    drive(node, bridge, run, DemoSensors(rng=np.random.default_rng(6)), 3)
    status = node.diagnostic_status()
    distance = float({kv.key: kv.value for kv in status.values}["first_fix_to_route_start_m"])
    if far:
        assert status.level == DiagnosticStatus.ERROR and distance > 1e6
        assert f"{distance:.0f} m from the route's start" in status.message and "geo.lat_ref_deg" in status.message
    else:
        assert status.level == DiagnosticStatus.OK and distance < 3.0, status.message


def test_a_refused_parameter_keeps_the_node_up_reporting_and_silent(rig):
    node, bridge = rig(**{"filter.gnss_stddev_m": -1.0})
    assert node.diagnostic_status().level == DiagnosticStatus.ERROR
    assert "filter.gnss_stddev_m" in node.diagnostic_status().message
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    fix, imu, speed = sensor_messages(DemoSensors().read(run.world.ego), ns_stamp(run.stamp_ns), ln.localization_topics())
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
