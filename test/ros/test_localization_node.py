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

from test.support import REPO_ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from geometry_msgs.msg import Pose  # noqa: E402
from sensor_msgs.msg import Imu, NavSatFix, NavSatStatus  # noqa: E402
from std_msgs.msg import Float32, Header  # noqa: E402

from wam_diff2_core.geometry import wrap_angle, yaw_from_quaternion  # noqa: E402
from wam_diff2_core.localization.georeference import GeoReference  # noqa: E402
from wam_diff2_core.localization.odometry_filter import LocalizationSettings  # noqa: E402
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun  # noqa: E402
from wam_diff2_core.sim.sensors import DEMO_NOISE, DemoSensors  # noqa: E402
from wam_diff2_core.params import localization as lp  # noqa: E402
from wam_diff2_ros import localization_node as ln  # noqa: E402
from wam_diff2_ros.qos import BRIDGE_QOS, DEEP_RELIABLE_QOS, LATCHED_QOS  # noqa: E402
from wam_diff2_ros.tools.simulator_bridge import sensor_messages  # noqa: E402
from wam_diff2_ros.conversions import UNOBSERVED_VARIANCE, ns_to_stamp  # noqa: E402
from wam_diff2_core.frame_inputs import NS_PER_S, stamp_ns  # noqa: E402
from test.support import ros_helpers  # noqa: E402
from test.support.ros_helpers import ros_context, spin_in_thread  # noqa: E402
from test.support.ros_packages import interface_module  # noqa: E402

pytestmark = pytest.mark.ros
WAIT_S = 10.0
ROLES = (f"loc{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def context():
    with ros_context(9) as ctx:
        yield ctx


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
        self.gnss_pub = self.create_publisher(NavSatFix, t["gnss"], BRIDGE_QOS)
        self.imu_pub = self.create_publisher(Imu, t["imu"], BRIDGE_QOS)
        self.speed_pub = self.create_publisher(speed_type or interface_module("carla_msgs").CarlaSpeedometer,
                                               t["speedometer"], BRIDGE_QOS)
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


@pytest.fixture
def rig(context):
    started = []

    def start(speed_type=None, match=True, **params):
        role = next(ROLES)
        node = ln.LocalizationNode(f"localization_{role}", context=context, parameter_overrides=[
            Parameter("role_name", value=role), *[Parameter(k, value=v) for k, v in params.items()]])
        bridge = Bridge(context, role, speed_type)
        executor, thread = spin_in_thread(context, node, bridge)
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



def publish_tick(bridge, fix, imu, speed, tick: int) -> None:
    """One tick's GNSS, speed and IMU to the node; waits for the odometry they bring."""
    count = len(bridge.odometry)
    bridge.gnss_pub.publish(fix)
    bridge.speed_pub.publish(speed)
    bridge.imu_pub.publish(imu)
    assert wait_for(lambda: len(bridge.odometry) > count), f"no odometry for tick {tick}"

def test_node_turns_the_demo_worlds_sensors_into_odometry_close_to_the_truth(rig):
    node, bridge = rig()                                       # every default: CarlaSpeedometer, 42.0 / 2.0
    assert (node.reference.lat_deg, node.reference.lon_deg) == (42.0, 2.0) == (GeoReference().lat_deg,
                                                                               GeoReference().lon_deg)
    run = RouteRun(1, ClosedLoopSettings(seed=2000, route_length_m=100.0, traffic=True))
    sensors = DemoSensors(DEMO_NOISE, GeoReference(), np.random.default_rng(3))
    truth = {}
    for _ in range(160):                                       # 8 s of the expert's drive
        stamp = ns_to_stamp(run.stamp_ns)
        header = Header(stamp=stamp, frame_id="hero/gnss")
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), header)
        truth[run.stamp_ns] = run.world.ego
        publish_tick(bridge, fix, imu, speed, run.tick)
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
    assert pose_cov[2, 2] == pose_cov[3, 3] == pose_cov[4, 4] == UNOBSERVED_VARIANCE
    assert np.allclose(pose_cov, pose_cov.T) and 0 < twist_cov[0, 0] < 0.1 and twist_cov[5, 5] > 0
    status = node.diagnostic_status()
    assert status.level == DiagnosticStatus.OK
    values = {kv.key: kv.value for kv in status.values}
    assert values["odometry_published"] == "160" and values["gnss_used"] == "160" and values["speed_used"] == "160"
    assert values["speedometer_type"] == "carla_msgs/CarlaSpeedometer" and "gnss_refused_no_fix" not in values


def test_no_odometry_before_a_fix_and_a_heading(rig):
    node, bridge = rig()
    header = Header(stamp=ns_to_stamp(5_000_000_000))
    imu = Imu(header=header)
    imu.orientation_covariance[0] = -1.0                      # "no orientation" (REP-145)
    bridge.imu_pub.publish(imu)
    assert wait_for(lambda: node.counts["imu_used"] == 1)
    fix = NavSatFix(header=header)
    fix.status.status = -1                                    # STATUS_NO_FIX
    bridge.gnss_pub.publish(fix)
    assert wait_for(lambda: node.counts["gnss_refused_no_fix"] == 1)
    assert not bridge.odometry and node.diagnostic_status().level == DiagnosticStatus.WARN


def test_the_first_tick_is_answered_when_its_imu_comes_before_its_gnss_and_speed(rig):
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    sensors = DemoSensors(rng=np.random.default_rng(2))
    for k in range(3):
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), Header(stamp=ns_to_stamp(run.stamp_ns)))
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
        fix, imu, speed = bridge_messages(sensors.read(run.world.ego), Header(stamp=ns_to_stamp(run.stamp_ns)),
                                          speed_type)
        publish_tick(bridge, fix, imu, speed, run.tick)
        run.world.step()


def send_tick(node, bridge, run, sensors, hostile=None, sensors_sent=("gnss", "speed", "imu")) -> Odometry | None:
    """One tick of the expert's drive; ``hostile(fix, imu, speed)`` may spoil the messages first. Waits until
    the node has handled every message sent; returns the tick's odometry (None: none came) and steps the world."""
    fix, imu, speed = bridge_messages(sensors.read(run.world.ego), Header(stamp=ns_to_stamp(run.stamp_ns)))
    if hostile is not None:
        hostile(fix, imu, speed)
    handled = sum(v for k, v in node.counts.items() if k.endswith(("_used", "_refused")))
    for kind in sensors_sent:
        {"gnss": bridge.gnss_pub, "speed": bridge.speed_pub, "imu": bridge.imu_pub}[kind].publish(
            {"gnss": fix, "speed": speed, "imu": imu}[kind])
    assert wait_for(lambda: sum(v for k, v in node.counts.items() if k.endswith(("_used", "_refused")))
                    == handled + len(sensors_sent)), f"tick {run.tick} not handled: {dict(node.counts)}"
    stamp = run.stamp_ns
    run.world.step()
    if "imu" not in sensors_sent:
        return None
    time.sleep(0.02)
    with bridge.lock:
        return next((m for m in bridge.odometry if stamp_ns(m.header.stamp) == stamp), None)


def finite_odometry(msg: Odometry) -> bool:
    p, o, v, w = msg.pose.pose.position, msg.pose.pose.orientation, msg.twist.twist.linear, msg.twist.twist.angular
    return bool(np.isfinite([p.x, p.y, p.z, o.x, o.y, o.z, o.w, v.x, v.y, v.z, w.x, w.y, w.z, *msg.pose.covariance,
                             *msg.twist.covariance]).all())


def status_values(node) -> tuple[int, str, dict[str, str]]:
    status = node.diagnostic_status()
    return status.level, status.message, {kv.key: kv.value for kv in status.values}


def _set(name: str, value):
    """A spoiler setting one field (dotted path) of one of the tick's messages."""
    kind, path = name.split(":")

    def spoil(fix, imu, speed):
        target = {"gnss": fix, "imu": imu, "speed": speed}[kind]
        *parents, leaf = path.split(".")
        for part in parents:
            target = getattr(target, part)
        if leaf.isdigit():
            target[int(leaf)] = value
        else:
            setattr(target, leaf, value)
    return spoil


def _known_covariance(fix, imu, speed):
    fix.position_covariance_type = NavSatFix.COVARIANCE_TYPE_DIAGONAL_KNOWN
    fix.position_covariance[0] = fix.position_covariance[4] = math.inf


# (spoiler, counter it must raise) — the messages that killed the node or poisoned the filter, and more
HOSTILE_MESSAGES = [
    (_set("gnss:latitude", math.inf), "gnss_refused_position"),
    (_set("gnss:latitude", 100.0), "gnss_refused_position"),
    (_set("gnss:latitude", -90.0), "gnss_refused_position"),
    (_set("gnss:longitude", math.nan), "gnss_refused_position"),
    (_known_covariance, "gnss_refused_covariance"),
    (_set("imu:orientation_covariance.8", math.inf), "imu_refused_covariance"),
    (_set("imu:angular_velocity.z", 1e308), "imu_refused_rate"),
    (_set("imu:linear_acceleration.x", 1e308), "imu_refused_acceleration"),
    (_set("imu:linear_acceleration.x", -math.inf), "imu_refused_acceleration"),
    (_set("imu:orientation.w", 3.0), "imu_refused_orientation"),
    (_set("imu:orientation.z", math.nan), "imu_refused_orientation"),
    (_set("speed:speed", math.inf), "speed_refused_speed"),
    (_set("speed:speed", -1e308), "speed_refused_speed"),
]


def test_hostile_sensor_messages_are_refused_per_reason_and_the_odometry_stays_finite_and_right(rig):
    """Issue 30: a latitude of inf / 100 / -90 killed the node (math domain error); an infinite GNSS or IMU
    orientation covariance or a rate / acceleration of 1e308 gave NaN odometry for ever under an OK. Each
    now is refused and counted by its reason, the node keeps answering every tick with finite odometry
    near the truth, and /diagnostics stays OK with finite standard deviations."""
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=100.0))
    sensors = DemoSensors(rng=np.random.default_rng(8))
    for _ in range(20):
        assert send_tick(node, bridge, run, sensors) is not None
    for spoil, counter in HOSTILE_MESSAGES:
        before = node.counts[counter]
        ego = run.world.ego
        odometry = send_tick(node, bridge, run, sensors, spoil)
        assert node.counts[counter] == before + 1, (counter, dict(node.counts))
        if counter.startswith("imu"):
            assert odometry is None                           # the IMU drives the output: none for its tick
        else:
            assert finite_odometry(odometry)
            assert math.hypot(odometry.pose.pose.position.x - ego.x, odometry.pose.pose.position.y - ego.y) < 1.0
        assert send_tick(node, bridge, run, sensors) is not None                    # the next good tick
    with bridge.lock:
        assert all(finite_odometry(m) for m in bridge.odometry)
    level, message, values = status_values(node)
    assert level == DiagnosticStatus.OK, message
    assert all(math.isfinite(float(values[k])) for k in ("position_stddev_m", "heading_stddev_deg",
                                                         "speed_stddev_mps"))
    assert values["gnss_refused"] == "5" and values["imu_refused"] == "6" and values["speed_refused"] == "2"
    assert values["imu_refused_rate"] == "1" and values["filter_restarts_non_finite"] == "0"


def test_a_1_km_gnss_jump_is_gated_with_a_warn_then_followed(rig):
    """The issue's jump moved the estimate 348 m in a second. Now the fixes are refused (a WARN on
    /diagnostics while they keep coming), the odometry stays on the IMU and speedometer, and after
    filter.gnss_reacquire_s of them the position follows the GNSS (a real jump must not lock it out)."""
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=100.0))
    sensors = DemoSensors(rng=np.random.default_rng(9))
    for _ in range(20):
        send_tick(node, bridge, run, sensors)
    reference = GeoReference()

    def jump(fix, imu, speed):
        x, y = reference.to_local(fix.latitude, fix.longitude)
        fix.latitude, fix.longitude = reference.to_geo(x + 1000.0, y)

    reacquire_ticks = int(round(LocalizationSettings().gnss_reacquire_s / (run.dt_ns / NS_PER_S)))
    for k in range(reacquire_ticks):
        ego = run.world.ego
        odometry = send_tick(node, bridge, run, sensors, jump)
        assert math.hypot(odometry.pose.pose.position.x - ego.x, odometry.pose.pose.position.y - ego.y) < 1.0
        if k == 2:
            level, message, values = status_values(node)
            assert level == DiagnosticStatus.WARN and "3 GNSS fixes in a row refused by the gate" in message
    assert node.counts["gnss_refused_gate"] == reacquire_ticks and node.ekf.counts["gnss_reacquired"] == 0
    ego = run.world.ego
    odometry = send_tick(node, bridge, run, sensors, jump)
    assert node.ekf.counts["gnss_reacquired"] == 1
    assert abs(odometry.pose.pose.position.x - (ego.x + 1000.0)) < 2.0      # following the GNSS
    level, message, values = status_values(node)
    assert level == DiagnosticStatus.OK and values["gnss_reacquired"] == "1", message


def test_a_silent_speedometer_or_imu_is_reported_stale(rig):
    node, bridge = rig(sensor_timeout_s=0.32)
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=100.0))
    sensors = DemoSensors(rng=np.random.default_rng(10))
    for _ in range(10):
        send_tick(node, bridge, run, sensors)
    assert status_values(node)[0] == DiagnosticStatus.OK
    for k in range(10):                                        # 0.5 s without a speed: the IMU keeps ticking
        send_tick(node, bridge, run, sensors, sensors_sent=("gnss", "imu"))
        level, message, values = status_values(node)
        assert values["imu_age_s"] == "0.000" and float(values["speed_age_s"]) == pytest.approx(0.05 * (k + 1))
        if k >= 6:                                              # more than 0.32 s behind
            assert level == DiagnosticStatus.WARN, message
            assert f"stale (sensor_timeout_s 0.32): speed ({0.05 * (k + 1):.2f} s behind)" in message
        else:
            assert level == DiagnosticStatus.OK, message
    send_tick(node, bridge, run, sensors)
    assert status_values(node)[0] == DiagnosticStatus.OK
    for _ in range(8):                                         # the IMU silent: no odometry, and said so
        send_tick(node, bridge, run, sensors, sensors_sent=("gnss", "speed"))
    level, message, _ = status_values(node)
    assert level == DiagnosticStatus.WARN and "stale (sensor_timeout_s 0.32): imu (0.40 s behind)" in message


def test_a_non_finite_state_is_never_published_and_diagnostics_never_say_ok_with_it(rig):
    """The inputs are checked, so only a filter bug could make the state non-finite: planted here."""
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=100.0))
    sensors = DemoSensors(rng=np.random.default_rng(11))
    for _ in range(5):
        send_tick(node, bridge, run, sensors)
    node.ekf.covariance = node.ekf.covariance.copy()
    node.ekf.covariance[1, 1] = math.nan                      # north only: the position's figure is the larger
    level, message, values = status_values(node)
    assert level == DiagnosticStatus.ERROR and "non-finite standard deviation" in message
    assert values["position_stddev_m"] == "nan"
    node.ekf.covariance[1, 1] = node.ekf.covariance[0, 0]
    node.ekf.covariance[0, 0] = math.nan
    assert send_tick(node, bridge, run, sensors, sensors_sent=("imu",)) is None      # the prediction meets it
    level, message, values = status_values(node)
    assert level == DiagnosticStatus.WARN and "filter restarted: the prediction gave a non-finite state" in message
    assert values["filter_restarts_non_finite"] == "1" and values["imu_refused_non_finite"] == "1"
    for _ in range(3):
        odometry = send_tick(node, bridge, run, sensors)
    assert finite_odometry(odometry) and status_values(node)[0] == DiagnosticStatus.OK
    with bridge.lock:
        assert all(finite_odometry(m) for m in bridge.odometry)


def test_fixes_with_status_unknown_or_zero_are_used_and_no_fix_or_nan_refused(rig):
    node, bridge = rig()
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    fix, imu, speed = bridge_messages(DemoSensors().read(run.world.ego), Header(stamp=ns_to_stamp(run.stamp_ns)))
    statuses = (NavSatStatus.STATUS_UNKNOWN, NavSatStatus.STATUS_FIX, NavSatStatus.STATUS_NO_FIX)
    assert statuses == (-2, 0, -1)
    for k, status in enumerate(statuses):
        fix.status.status = status
        bridge.gnss_pub.publish(fix)
        assert wait_for(lambda: node.counts["gnss_used"] + node.counts["gnss_refused_no_fix"] == k + 1)
    assert (node.counts["gnss_used"], node.counts["gnss_refused_no_fix"]) == (2, 1)
    fix.status.status, fix.latitude = NavSatStatus.STATUS_UNKNOWN, math.nan
    bridge.gnss_pub.publish(fix)
    assert wait_for(lambda: node.counts["gnss_refused_position"] == 1) and node.counts["gnss_used"] == 2


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
        float_pub = float_bridge.create_publisher(Float32, topic, BRIDGE_QOS)
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


def test_publish_tf_sends_each_odometrys_pose_as_map_to_role_on_tf(rig, context):
    """publish_tf (the leaderboard launch file's setting): one tf2_msgs/TFMessage per odometry on /tf, the real
    type, as tf2_ros's broadcaster sends it (reliable, keep last 100): map -> role at the odometry's stamp and pose."""
    tf2_msgs = interface_module("tf2_msgs")
    node, bridge = rig(publish_tf=True)
    received = []
    probe = Node("tf_probe", context=context)
    probe.create_subscription(tf2_msgs.TFMessage, "/tf", received.append, DEEP_RELIABLE_QOS)
    executor, thread = spin_in_thread(context, probe)
    try:
        assert wait_for(lambda: node._tf_pub.get_subscription_count() > 0)
        run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
        drive(node, bridge, run, DemoSensors(rng=np.random.default_rng(4)), 10)
        assert wait_for(lambda: len(received) == len(bridge.odometry) == 10)
    finally:
        executor.shutdown()
        thread.join(5.0)
        probe.destroy_node()
    for odometry, tf in zip(bridge.odometry, received):
        (t,) = tf.transforms
        assert (t.header.frame_id, t.child_frame_id) == ("map", node.child_frame_id)
        assert stamp_ns(t.header.stamp) == stamp_ns(odometry.header.stamp)
        p, q = odometry.pose.pose.position, odometry.pose.pose.orientation
        assert (t.transform.translation.x, t.transform.translation.y) == (p.x, p.y)
        assert (t.transform.rotation.z, t.transform.rotation.w) == (q.z, q.w)
    assert node.counts["tf_published"] == 10
    from wam_diff2_core.params.leaderboard import NODES
    assert next(n for n in NODES if n.name == ln.LOCALIZATION_NODE).parameters["publish_tf"] is True
    assert lp.DEFAULTS["publish_tf"] is False                 # carla-ros-bridge publishes its own /tf


def test_publish_tf_without_tf2_msgs_is_a_config_error(rig, monkeypatch):
    monkeypatch.setattr(ln, "TFMessage", None)
    node, _ = rig(match=False, publish_tf=True)
    status = node.diagnostic_status()
    assert status.level == DiagnosticStatus.ERROR and "publish_tf: tf2_msgs is not importable" in status.message


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
                                        LATCHED_QOS)
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
    fix, imu, speed = sensor_messages(DemoSensors().read(run.world.ego), ns_to_stamp(run.stamp_ns), ln.localization_topics())
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
    from wam_diff2_core.params.spec import markdown_table
    docs = REPO_ROOT / "docs" / "carla.md"
    assert markdown_table(lp.SPECS) in docs.read_text()
