"""The controller node over real DDS on scripted trajectories, with exact expectations.

Each test starts a fresh controller node (its own role name, so topics never mix) in this
process, and a probe node that plays the simulator and the planner: it publishes odometry
ticks, trajectories and the planner's status, and records controls, the leaderboard status
and commands. Expected controls come from a ``WaypointController`` fed the same inputs.
"""
from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np
import pytest

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from nav_msgs.msg import Odometry, Path  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from rosgraph_msgs.msg import Clock as ClockMsg  # noqa: E402
from std_msgs.msg import Bool, Header, String  # noqa: E402

from wam_diff2_core.control import ControllerGains, Plan, Pose2D, WaypointController  # noqa: E402
from wam_diff2_core.routes import RouteTrackerSettings  # noqa: E402
from wam_diff2_core.params import controller as cp  # noqa: E402
from wam_diff2_core.params.parameter_file import flatten  # noqa: E402
from wam_diff2_ros import controller_node as cn  # noqa: E402
from wam_diff2_ros.qos import LATCHED_QOS, LATEST_RELIABLE_QOS  # noqa: E402
from wam_diff2_ros.spinning import SpinThread  # noqa: E402
from wam_diff2_core.topics import controller_topics  # noqa: E402
from wam_diff2_ros.controller_node import ControllerNode  # noqa: E402
from wam_diff2_ros.conversions import ns_to_stamp, plan_from_trajectory  # noqa: E402
from wam_diff2_core.frame_inputs import stamp_ns  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus, Trajectory, TrajectoryPoint, VehicleControl  # noqa: E402
from test.support import ros_helpers  # noqa: E402
from test.support.ros_helpers import odometry_msg, ros_context, route_msg  # noqa: E402
from test.support.ros_packages import interface_module  # noqa: E402

pytestmark = pytest.mark.ros
NS = 1_000_000_000
T0_NS = 100 * NS             # sim time of the first tick in each test
DT_NS = 50_000_000           # CARLA's 20 Hz
WAIT_S = 10.0                # bounded waits (a busy 2-core machine)
ROLES = (f"role{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def context():
    with ros_context(5) as ctx:
        yield ctx


class SimProbe(Node):
    """The simulator and the planner, seen from the controller: ticks out, controls in."""

    def __init__(self, context, role: str):
        super().__init__(f"probe_{role}", context=context)
        self.topics = controller_topics(role)
        t = self.topics
        self.odometry_pub = self.create_publisher(Odometry, t["odometry"], qos_profile_sensor_data)
        self.trajectory_pub = self.create_publisher(Trajectory, t["trajectory"], LATEST_RELIABLE_QOS)
        self.status_pub = self.create_publisher(PlannerStatus, t["planner_status"], LATCHED_QOS)
        self.route_pub = self.create_publisher(Path, t["route"], LATCHED_QOS)
        self.clock_pub = self.create_publisher(ClockMsg, t["clock"], LATEST_RELIABLE_QOS)
        self.lock = threading.Lock()
        self.controls: list[VehicleControl] = []
        self.commands: list[str] = []
        self.ready: list[bool] = []
        self.create_subscription(VehicleControl, f"/wam_diff2_controller_{role}/output/control",
                                 self._keep(self.controls), LATEST_RELIABLE_QOS)
        self.create_subscription(String, t["command"], lambda m: self._keep(self.commands)(m.data), LATEST_RELIABLE_QOS)
        self.subscribe_ready()

    def _keep(self, into: list):
        def keep(msg):
            with self.lock:
                into.append(msg)
        return keep

    def subscribe_ready(self) -> None:
        self.create_subscription(Bool, self.topics["leaderboard_status"], lambda m: self._keep(self.ready)(m.data),
                                 LATCHED_QOS)

    def control_at(self, tick_ns: int, timeout_s: float = WAIT_S) -> VehicleControl:
        found = wait_for(lambda: [c for c in list(self.controls) if stamp_ns(c.header.stamp) == tick_ns], timeout_s)
        assert found, f"no control stamped {tick_ns}; got {[stamp_ns(c.header.stamp) for c in self.controls][-5:]}"
        assert len(found) == 1, "one control per tick"
        return found[0]


def wait_for(condition, timeout_s: float):
    return ros_helpers.wait_for(condition, timeout_s, poll_s=0.01)


@pytest.fixture
def rig(context):
    """(controller node, probe) with a fresh role; extra controller parameters via rig.start(**params)."""
    started = []

    class Rig:
        def start(self, **params):
            role = next(ROLES)
            # the probe is the simulator and applies ~/output/control (tests of CARLA's output say carla)
            overrides = [Parameter(k, value=v) for k, v in {"role_name": role, "diagnostics_period_s": 0.1,
                                                            "control_consumer": "vehicle_control",
                                                            **params}.items()]
            node = ControllerNode(f"wam_diff2_controller_{role}", context=context, parameter_overrides=overrides)
            probe = SimProbe(context, role)
            started.extend([SpinThread(node), SpinThread(probe)])
            t = probe.topics
            assert wait_for(lambda: probe.count_subscribers(t["odometry"]) and probe.count_subscribers(t["trajectory"])
                            and probe.count_publishers(f"/wam_diff2_controller_{role}/output/control")
                            and node.count_subscribers(f"/wam_diff2_controller_{role}/output/control"), WAIT_S)
            return node, probe

    yield Rig()
    for s in reversed(started):
        s.stop()


def trajectory(stamp: int, waypoints: np.ndarray | None, valid: bool = True, reason: str = "") -> Trajectory:
    msg = Trajectory(header=Header(stamp=ns_to_stamp(stamp), frame_id="ego"), valid=valid, invalid_reason=reason,
                     command="straight")
    if waypoints is not None:
        for k, (x, y) in enumerate(waypoints):
            point = TrajectoryPoint(x=float(x), y=float(y))
            point.time_from_start.sec, point.time_from_start.nanosec = divmod((k + 1) * NS // 2, NS)
            msg.points.append(point)
    return msg


def straight(speed_mps: float) -> np.ndarray:
    return np.array([[speed_mps * 0.5 * (k + 1), 0.0] for k in range(8)])


def curve(speed_mps: float, curvature: float) -> np.ndarray:
    """Waypoints on a circle of the given curvature (+ left), 0.5 s apart at ``speed_mps``."""
    s = speed_mps * 0.5 * np.arange(1, 9)
    return np.stack([np.sin(curvature * s) / curvature, (1 - np.cos(curvature * s)) / curvature], axis=1)


def send_plan(node: ControllerNode, probe: SimProbe, msg: Trajectory) -> None:
    before = node.counts["plans_received"]
    probe.trajectory_pub.publish(msg)
    assert wait_for(lambda: node.counts["plans_received"] > before, WAIT_S), "the controller never got the plan"


def run_ticks(node, probe, poses, speeds, reference: WaypointController, plans: dict[int, Plan | None],
              first_tick: int = 0):
    """Publish odometry ticks; before tick k, the plan plans[k] (if any) goes out. Returns (controls, expected)."""
    controls, expected, current = [], [], None
    for k, ((x, y, yaw), v) in enumerate(zip(poses, speeds), start=first_tick):
        if k in plans:
            current = plans[k]
            send_plan(node, probe, plans[k].message)
        tick = T0_NS + k * DT_NS
        probe.odometry_pub.publish(odometry_msg(tick, x=x, y=y, yaw=yaw, vx=v, child_frame_id="hero"))
        controls.append(probe.control_at(tick))
        expected.append(reference.step(None if current is None else current.plan, Pose2D(x, y, yaw), v,
                                       tick / NS))
    return controls, expected


class Sent:
    """A trajectory message and the plan the controller should see for it."""

    def __init__(self, stamp: int, waypoints, valid: bool = True, reason: str = ""):
        self.message = trajectory(stamp, waypoints, valid, reason)
        self.plan = plan_from_trajectory(self.message)


def assert_same(control: VehicleControl, expected) -> None:
    got = (control.throttle, control.steer, control.brake)
    want = (expected.throttle, expected.steer, expected.brake)
    assert got == pytest.approx(want, abs=1e-6), f"{got} != {want} ({expected.reason!r})"
    assert control.reason == expected.reason
    assert control.source == (VehicleControl.SOURCE_FALLBACK if expected.reason else VehicleControl.SOURCE_PLAN)


# ----------------------------------------------------------------------------- scripted plans
def test_straight_plan_matches_the_core_controller_tick_by_tick(rig):
    node, probe = rig.start()
    # ego at 6 m/s, plan at 8 m/s: it accelerates, wheels straight
    poses = [(6.0 * 0.05 * k, 0.0, 0.0) for k in range(12)]
    controls, expected = run_ticks(node, probe, poses, [6.0] * 12, WaypointController(),
                                   {0: Sent(T0_NS, straight(8.0))})
    for c, e in zip(controls, expected):
        assert_same(c, e)
    assert all(c.throttle > 0 and c.brake == 0 and c.steer == 0 for c in controls)
    assert max(c.throttle for c in controls) <= ControllerGains().max_throttle
    assert [stamp_ns(c.header.stamp) for c in controls] == [T0_NS + k * DT_NS for k in range(12)]
    assert controls[0].header.frame_id == "hero" and controls[0].speed_mps == pytest.approx(6.0)
    assert controls[-1].plan_age_s == pytest.approx(11 * 0.05, abs=1e-6)


@pytest.mark.parametrize("curvature,sign", [(1 / 30, -1.0), (-1 / 30, 1.0)])
def test_curve_steers_towards_it_and_follows_the_plan_as_the_ego_moves(rig, curvature, sign):
    node, probe = rig.start()
    speed = 8.0
    s = speed * 0.05 * np.arange(10)
    poses = [(math.sin(curvature * d) / curvature, (1 - math.cos(curvature * d)) / curvature, curvature * d)
             for d in s]                                  # the ego drives the planned circle
    plans = {0: Sent(T0_NS, curve(speed, curvature)), 5: Sent(T0_NS + 5 * DT_NS, curve(speed, curvature))}
    controls, expected = run_ticks(node, probe, poses, [speed] * 10, WaypointController(), plans)
    for c, e in zip(controls, expected):
        assert_same(c, e)
    assert all(np.sign(c.steer) == sign for c in controls)         # CARLA: + steers right


def test_stop_plan_brakes_as_a_plan_not_as_a_fallback(rig):
    node, probe = rig.start()
    controls, expected = run_ticks(node, probe, [(0.0, 0.0, 0.0)] * 5, [3.0] * 5, WaypointController(),
                                   {0: Sent(T0_NS, np.zeros((8, 2)))})
    for c, e in zip(controls, expected):
        assert_same(c, e)
        assert (c.throttle, c.brake, c.source, c.reason) == (0.0, 1.0, VehicleControl.SOURCE_PLAN, "")


def test_stale_plan_falls_back_to_a_full_brake_after_the_timeout(rig):
    node, probe = rig.start()
    timeout_ticks = int(ControllerGains().plan_timeout_s * NS / DT_NS)     # 20 ticks
    n = timeout_ticks + 4
    poses = [(5.0 * 0.05 * k, 0.0, 0.0) for k in range(n)]
    controls, expected = run_ticks(node, probe, poses, [5.0] * n, WaypointController(),
                                   {0: Sent(T0_NS, straight(8.0))})
    for c, e in zip(controls, expected):
        assert_same(c, e)
    assert all(c.reason == "" for c in controls[:timeout_ticks + 1])      # age <= timeout: following
    for c in controls[timeout_ticks + 1:]:
        assert c.reason.startswith("stale plan") and (c.throttle, c.steer, c.brake) == (0.0, 0.0, 1.0)
    wait_for(lambda: node.counts["fallback_stale_plan"] == 3, WAIT_S)
    assert node.counts["fallback_stale_plan"] == 3


def test_never_accelerates_without_a_valid_plan(rig):
    node, probe = rig.start()
    # standing still, where any valid forward plan would give throttle: no plan, then invalid plans
    plans = {4: Sent(T0_NS + 4 * DT_NS, None, valid=False, reason="parse error: 3 numbers"),
             8: Sent(T0_NS + 8 * DT_NS, straight(10.0), valid=False, reason="rejected"),       # points, but invalid
             12: Sent(T0_NS + 12 * DT_NS, np.full((8, 2), np.nan))}                           # "valid" NaNs
    controls, expected = run_ticks(node, probe, [(0.0, 0.0, 0.0)] * 16, [0.0] * 16, WaypointController(), plans)
    for c, e in zip(controls, expected):
        assert_same(c, e)
        assert (c.throttle, c.steer, c.brake, c.source) == (0.0, 0.0, 1.0, VehicleControl.SOURCE_FALLBACK)
    assert [c.reason for c in controls[:4]] == ["no plan"] * 4
    assert {c.reason for c in controls[4:]} == {"invalid plan"}
    assert math.isnan(controls[0].plan_age_s)


def test_unusable_odometry_brakes(rig):
    node, probe = rig.start()
    send_plan(node, probe, trajectory(T0_NS, straight(8.0)))
    probe.odometry_pub.publish(odometry_msg(T0_NS, vx=math.nan, child_frame_id="hero"))
    c = probe.control_at(T0_NS)
    assert (c.throttle, c.brake, c.reason) == (0.0, 1.0, "invalid odometry")


def test_carla_control_is_published_on_the_bridge_topic_when_carla_msgs_exists(rig):
    carla_msgs = interface_module("carla_msgs")               # the Leaderboard 2.0 bridge's own type
    assert cn.carla_msgs is carla_msgs
    node, probe = rig.start(control_consumer="carla")
    got = []
    probe.create_subscription(carla_msgs.CarlaEgoVehicleControl, probe.topics["carla_control"], got.append,
                              LATEST_RELIABLE_QOS)
    assert wait_for(lambda: node.count_subscribers(probe.topics["carla_control"]) > 0, WAIT_S)
    send_plan(node, probe, trajectory(T0_NS, straight(8.0)))
    probe.odometry_pub.publish(odometry_msg(T0_NS, vx=6.0, child_frame_id="hero"))
    ours = probe.control_at(T0_NS)
    assert wait_for(lambda: got, WAIT_S)
    carla = got[0]
    assert stamp_ns(carla.header.stamp) == T0_NS and carla.header.frame_id == "hero"
    assert (carla.throttle, carla.steer, carla.brake) == (ours.throttle, ours.steer, ours.brake) and carla.throttle > 0
    assert (carla.hand_brake, carla.reverse, carla.gear, carla.manual_gear_shift) == (False, False, 0, False)


# ----------------------------------------------------------------------------- timing and handshake
def test_one_control_per_tick_stamped_with_the_tick(rig):
    node, probe = rig.start()
    for k in (0, 1, 1, 2):                                   # tick 1's odometry arrives twice
        probe.odometry_pub.publish(odometry_msg(T0_NS + k * DT_NS, vx=0.0))
        time.sleep(0.05)
    for k in (0, 1, 2):
        probe.control_at(T0_NS + k * DT_NS)                  # exactly one each (asserted inside)
    assert wait_for(lambda: node.counts["ticks_repeated"] == 1, WAIT_S)
    # a simulator restart (time back by more than a second) is a new run, answered again
    probe.odometry_pub.publish(odometry_msg(T0_NS - 10 * NS, vx=0.0))
    probe.control_at(T0_NS - 10 * NS)
    assert node.counts["time_resets"] == 1


def test_clock_ticks_answer_each_clock_message_with_the_newest_odometry(rig):
    node, probe = rig.start(tick_source="clock")
    assert wait_for(lambda: probe.count_subscribers("/clock") > 0, WAIT_S)
    send_plan(node, probe, trajectory(T0_NS, straight(8.0)))
    probe.odometry_pub.publish(odometry_msg(T0_NS, vx=8.0, child_frame_id="hero"))
    assert wait_for(lambda: node._odometry is not None, WAIT_S)
    assert probe.controls == []                              # odometry does not tick in clock mode
    reference = WaypointController()
    plan = plan_from_trajectory(trajectory(T0_NS, straight(8.0)))
    for k in range(4):
        tick = T0_NS + k * DT_NS
        probe.clock_pub.publish(ClockMsg(clock=ns_to_stamp(tick)))
        assert_same(probe.control_at(tick), reference.step(plan, Pose2D(0.0, 0.0, 0.0), 8.0, tick / NS))
    tick = T0_NS + 10 * DT_NS                                # 0.5 s after the newest odometry: stale
    probe.clock_pub.publish(ClockMsg(clock=ns_to_stamp(tick)))
    assert probe.control_at(tick).reason.startswith("stale odometry")


def test_leaderboard_status_is_latched_true_only_after_the_planner_is_ready(rig, context):
    node, probe = rig.start()                      # vehicle_control: the probe applies ~/output/control
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.LOADING))
    assert wait_for(lambda: node.state.planner_state == PlannerStatus.LOADING, WAIT_S)
    probe.odometry_pub.publish(odometry_msg(T0_NS, vx=0.0))
    assert probe.control_at(T0_NS).reason == "no plan"      # controls flow, the handshake does not
    time.sleep(0.5)
    assert probe.ready == []
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.READY))
    assert wait_for(lambda: probe.ready, WAIT_S) == [True]
    # latched: a subscriber that joins later (the leaderboard's agent starting) still gets it
    late = Node("late_leaderboard", context=context)
    got = []
    late.create_subscription(Bool, probe.topics["leaderboard_status"], lambda m: got.append(m.data), LATCHED_QOS)
    spinning = SpinThread(late)
    try:
        assert wait_for(lambda: got, WAIT_S) == [True]
    finally:
        spinning.stop()
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.ERROR))   # never un-announced (never False)
    time.sleep(0.3)
    assert probe.ready == [True]


def _controller_diagnostics(probe, node) -> list:
    """The controller's statuses on /diagnostics, as they arrive over DDS."""
    got = []
    probe.create_subscription(DiagnosticArray, "/diagnostics",
                              lambda m: got.extend(s for s in m.status if s.name.startswith(node.get_name() + ":")), 10)
    return got


def test_without_carla_msgs_the_carla_consumer_gets_no_ready_but_an_error(rig, context, monkeypatch):
    monkeypatch.setattr(cn, "carla_msgs", None)               # as on a machine without carla_msgs
    assert cp.SPECS_BY_NAME["control_consumer"].default == "carla"
    node, probe = rig.start(control_consumer="carla")
    diagnostics = _controller_diagnostics(probe, node)
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.READY))
    assert wait_for(lambda: node.state.planner_state == PlannerStatus.READY, WAIT_S)
    errors = wait_for(lambda: [d for d in list(diagnostics) if d.level == DiagnosticStatus.ERROR], WAIT_S)
    assert errors, [d.message for d in diagnostics]
    assert "carla_msgs is not importable" in errors[-1].message
    assert probe.topics["carla_control"] in errors[-1].message and "no READY" in errors[-1].message
    values = {kv.key: kv.value for kv in errors[-1].values}
    assert values["planner_state"] == "READY" and values["leaderboard_status_sent"] == "false"
    assert values["control_consumer"] == "carla"
    # the leaderboard (joining late, as it does) gets nothing: no True is latched
    late = Node("late_leaderboard_no_carla", context=context)
    got = []
    late.create_subscription(Bool, probe.topics["leaderboard_status"], lambda m: got.append(m.data), LATCHED_QOS)
    spinning = SpinThread(late)
    try:
        assert wait_for(lambda: late.count_publishers(probe.topics["leaderboard_status"]) > 0, WAIT_S)
        time.sleep(1.0)
        assert got == [] and probe.ready == []
    finally:
        spinning.stop()
    # controls still flow on the package's own topic, and nothing on CARLA's
    assert probe.count_publishers(probe.topics["carla_control"]) == 0
    probe.odometry_pub.publish(odometry_msg(T0_NS, vx=0.0))
    assert probe.control_at(T0_NS).reason == "no plan"


def test_with_carla_msgs_the_carla_consumer_gets_ready_after_the_planner(rig):
    assert cn.carla_msgs is interface_module("carla_msgs")
    node, probe = rig.start(control_consumer="carla")
    diagnostics = _controller_diagnostics(probe, node)
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.LOADING))
    assert wait_for(lambda: node.state.planner_state == PlannerStatus.LOADING, WAIT_S)
    time.sleep(0.3)
    assert probe.ready == []
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.READY))
    assert wait_for(lambda: probe.ready, WAIT_S) == [True]
    assert wait_for(lambda: [d for d in list(diagnostics)
                             if {kv.key: kv.value for kv in d.values}.get("leaderboard_status_sent") == "true"], WAIT_S)
    assert all(d.level != DiagnosticStatus.ERROR for d in diagnostics)


def test_late_plans_and_fallbacks_are_counted_in_diagnostics(rig):
    node, probe = rig.start(plan_deadline_s=0.5)
    for k in range(17):
        probe.odometry_pub.publish(odometry_msg(T0_NS + k * DT_NS, vx=0.0))
        probe.control_at(T0_NS + k * DT_NS)
    send_plan(node, probe, trajectory(T0_NS, straight(8.0)))               # 0.8 s after its image: late
    send_plan(node, probe, trajectory(T0_NS + 12 * DT_NS, straight(8.0)))  # 0.2 s: on time
    status = node.diagnostic_status()
    values = {kv.key: kv.value for kv in status.values}
    assert values["plans_late"] == "1" and values["plans_received"] == "2"
    assert values["fallback_no_plan"] == "17" and values["ticks"] == "17"
    assert float(values["plan_age_at_arrival_max_s"]) == pytest.approx(0.8)
    assert status.level == DiagnosticStatus.WARN


# ----------------------------------------------------------------------------- route -> command

def drive_straight_then_left(probe, turn_xs) -> None:
    """Three ticks at x = 0, 1, 2 (the turn beyond the lookahead: "straight"), then ticks at ``turn_xs``
    until the route's command reads "left"."""
    for k, x in enumerate((0.0, 1.0, 2.0)):
        probe.odometry_pub.publish(odometry_msg(T0_NS + k * DT_NS, x=x, vx=0.0))
        probe.control_at(T0_NS + k * DT_NS)
    assert wait_for(lambda: len(probe.commands) == 3, WAIT_S) and set(probe.commands) == {"straight"}
    for k, x in enumerate(turn_xs, start=3):
        probe.odometry_pub.publish(odometry_msg(T0_NS + k * DT_NS, x=float(x), vx=0.0))
        probe.control_at(T0_NS + k * DT_NS)
    assert wait_for(lambda: probe.commands[-1] == "left", WAIT_S), probe.commands


def test_route_command_is_published_to_the_planner_every_tick(rig):
    node, probe = rig.start()
    # a left turn 40 m ahead on a Path route (geometric rule: heading change within 30 m)
    points = [(x, 0.0) for x in range(0, 60, 2)] + [(60.0 + 10 * math.sin(a), 10 * (1 - math.cos(a)))
                                                    for a in np.linspace(0.1, math.pi / 2, 8)] + [(70.0, 40.0)]
    probe.route_pub.publish(route_msg(points))
    assert wait_for(lambda: node.counts["routes_received"] == 1, WAIT_S)
    drive_straight_then_left(probe, np.arange(20.0, 40.0, 1.0))


def test_the_leaderboards_carla_route_drives_the_command_by_its_road_options(rig):
    """The real carla_msgs/CarlaRoute (int8 road options, VOID = -1) as the leaderboard latches it on
    global_plan: a straight road whose LEFT stretch (a junction) starts 200 m in reads left there."""
    carla_msgs = interface_module("carla_msgs")
    from geometry_msgs.msg import Pose
    node, probe = rig.start()
    route = carla_msgs.CarlaRoute(header=Header(frame_id="map"))
    options = [carla_msgs.CarlaRoute.LANEFOLLOW] * 31
    options[20], options[-1] = carla_msgs.CarlaRoute.LEFT, carla_msgs.CarlaRoute.VOID
    route.road_options = options
    for x in range(0, 310, 10):                               # a point every 10 m, as the leaderboard's plan
        pose = Pose()
        pose.position.x = float(x)
        route.poses.append(pose)
    publisher = probe.create_publisher(carla_msgs.CarlaRoute, probe.topics["carla_route"], LATCHED_QOS)
    publisher.publish(route)
    assert wait_for(lambda: node.counts["routes_received"] == 1, WAIT_S)
    assert node.route.options[20] == "LEFT" and node.route.options[-1] == "VOID"
    drive_straight_then_left(probe, np.arange(195.0, 210.0, 1.0))   # the LEFT point is 200 m ahead at first


# ----------------------------------------------------------------------------- parameters
def test_parameters_derive_from_the_core_settings_and_the_yaml_lists_them_all():
    gains = {s.name: s.default for s in cp.SPECS if s.name.startswith(cp.GAINS_PREFIX)}
    assert cp.gains_from({**{s.name: s.default for s in cp.SPECS}}) == ControllerGains()
    assert len(gains) == len(ControllerGains.__dataclass_fields__)
    assert cp.route_settings_from({s.name: s.default for s in cp.SPECS}) == RouteTrackerSettings()
    import yaml
    config = ROOT / "config" / "controller.yaml"
    params = yaml.safe_load(config.read_text())["/**"]["ros__parameters"]
    assert flatten(params) == {s.name: s.default for s in cp.SPECS}


def test_bad_parameters_keep_the_node_up_braking_and_reporting(context):
    node = ControllerNode("wam_diff2_controller_bad", context=context,
                          parameter_overrides=[Parameter("control.max_throttle", value=3.0),
                                               Parameter("role_name", value="bad_role")])
    try:
        assert any(e.startswith("control.max_throttle") for e in node._config_errors)
        assert node.diagnostic_status().level == DiagnosticStatus.ERROR
        published = []
        node._control_pub.publish = published.append
        node._on_trajectory(trajectory(T0_NS, straight(8.0)))
        node._on_odometry(odometry_msg(T0_NS, vx=0.0))
        assert (published[0].throttle, published[0].brake, published[0].reason) == (0.0, 1.0, "bad parameters")
        # a valid value set at run time clears the error; the new gains apply from the next tick
        assert node.set_parameters([Parameter("control.max_throttle", value=0.5)])[0].successful
        assert not node._config_errors and node.controller.gains.max_throttle == 0.5
        assert not node.set_parameters([Parameter("control.brake_ratio", value=0.5)])[0].successful
    finally:
        node.destroy_node()


# ----------------------------------------------------------------------------- pacing
def diagnostics_of(node: ControllerNode) -> dict[str, str]:
    return {kv.key: kv.value for kv in node.diagnostic_status().values}


def test_pacing_holds_the_tick_after_a_planning_frame_until_its_plan_arrives(rig):
    """pacing hold (the default), planning every 3rd tick: tick 1 (after planning frame 0) is answered only
    when frame 0's plan arrives, with that plan; tick 4 (after frame 3) waits pacing_max_hold_wall_s for a plan
    that never comes, then brakes and counts; ticks that follow no planning frame are answered at once."""
    assert cp.DEFAULTS["pacing"] == "hold"
    node, probe = rig.start(pacing_every_n_ticks=3, pacing_max_hold_wall_s=0.6)
    probe.status_pub.publish(PlannerStatus(state=PlannerStatus.READY))
    assert wait_for(lambda: node.state.planner_state == PlannerStatus.READY, WAIT_S)
    tick = [T0_NS + k * DT_NS for k in range(6)]
    probe.odometry_pub.publish(odometry_msg(tick[0], vx=5.0, child_frame_id="hero"))
    assert probe.control_at(tick[0]).reason == "no plan"                 # frame 0: its plan cannot exist yet
    probe.odometry_pub.publish(odometry_msg(tick[1], x=0.25, vx=5.0, child_frame_id="hero"))
    assert wait_for(lambda: node.counts["pacing_holds"] == 1, WAIT_S)
    time.sleep(0.3)
    assert not [c for c in probe.controls if stamp_ns(c.header.stamp) == tick[1]], "tick 1 answered without its plan"
    probe.trajectory_pub.publish(trajectory(tick[0], straight(8.0)))     # 0.3 s of "decoding" later
    held = probe.control_at(tick[1])
    assert held.reason == "" and held.throttle > 0.0 and stamp_ns(held.plan_stamp) == tick[0]
    for k in (2, 3):                                                      # not after a planning frame: at once
        probe.odometry_pub.publish(odometry_msg(tick[k], x=0.25 * k, vx=5.0, child_frame_id="hero"))
        assert probe.control_at(tick[k], timeout_s=2.0).reason == ""
    t = time.monotonic()
    probe.odometry_pub.publish(odometry_msg(tick[4], x=1.0, vx=5.0, child_frame_id="hero"))
    late = probe.control_at(tick[4])
    assert time.monotonic() - t >= 0.55 and late.brake == 1.0 and late.throttle == 0.0
    assert late.reason.startswith("plan late")
    assert (node.counts["pacing_holds"], node.counts["pacing_timeouts"], node.counts["fallback_plan_late"]) == (2, 1, 1)
    values = diagnostics_of(node)
    assert values["pacing"] == "hold" and values["pacing_timeouts"] == "1"
    assert float(values["pacing_hold_wall_ms_max"]) >= 550.0


def test_pacing_newest_and_a_planner_not_ready_never_hold(rig):
    # not ready: a planner no test publishes a status for (the module's other planners' READY is latched)
    for params, ready in (({"pacing": "newest"}, True), ({"planner_name": "planner_never_ready"}, False)):
        node, probe = rig.start(pacing_every_n_ticks=2, **params)
        if ready:
            probe.status_pub.publish(PlannerStatus(state=PlannerStatus.READY))
            assert wait_for(lambda: node.state.planner_state == PlannerStatus.READY, WAIT_S)
        for k in range(3):
            probe.odometry_pub.publish(odometry_msg(T0_NS + k * DT_NS, vx=5.0, child_frame_id="hero"))
            assert probe.control_at(T0_NS + k * DT_NS, timeout_s=2.0).reason == "no plan"
        assert node.counts["pacing_holds"] == 0


# ----------------------------------------------------------------------------- launch and entry points


def test_leaderboard_launch_runs_planner_in_lockstep_and_the_controller_with_declared_parameters():
    """The leaderboard stack's table (wam_diff2_core.params.leaderboard, which launch/leaderboard.launch.py and the
    --bridge closed loop start): each node sets only parameters its own table declares, typed as declared."""
    from wam_diff2_core.params import leaderboard as lb, localization as lp, planner as pp
    from wam_diff2_ros.planner.interface import INPUT_TOPICS
    values = lb.launch_values({"model_path": "/m", "lockstep_n": "5"}, share="/share")
    nodes = {n.spec.executable: n for n in lb.resolve_nodes(values)}
    assert set(nodes) == {"wam-diff2-planner", "wam-diff2-controller", "wam-diff2-localization"}
    tables = {"wam-diff2-planner": pp.SPECS_BY_NAME, "wam-diff2-controller": cp.SPECS_BY_NAME,
              "wam-diff2-localization": lp.SPECS_BY_NAME}
    for executable, node in nodes.items():
        specs = tables[executable]
        assert set(node.parameters) - {"use_sim_time"} <= set(specs), executable
        for name, value in node.parameters.items():
            assert name == "use_sim_time" or isinstance(value, specs[name].kind), (executable, name, value)
    controller, planner = nodes["wam-diff2-controller"], nodes["wam-diff2-planner"]
    assert controller.parameters["use_sim_time"] and controller.parameters["planner_name"] == planner.spec.name
    assert controller.parameters["plan_deadline_s"] == pytest.approx(5 * 0.05)       # lockstep_n x the tick
    assert controller.params_file == "/share/config/controller.yaml"
    assert planner.parameters["mode"] == "lockstep" and planner.parameters["lockstep_every_n_images"] == 5
    assert dict(planner.remappings)["~/input/odometry"] == "/carla/hero/odometry"
    assert {source for source, _ in planner.remappings} <= set(INPUT_TOPICS.values())
    with pytest.raises(ValueError, match="lockstep_n: 'five' is not a int"):
        lb.resolve_nodes({**values, "lockstep_n": "five"})
    with pytest.raises(ValueError, match="model_path: a required launch argument"):
        lb.launch_values({}, share="/share")
    with pytest.raises(ValueError, match=r"unknown launch argument\(s\) \['lockstep'\]"):
        lb.launch_values({"model_path": "/m", "lockstep": "5"}, share="/share")


def test_console_script_and_ros2_run_entry_point():
    script = ROOT / "scripts" / "ros2_run" / "wam-diff2-controller"
    assert script.stat().st_mode & 0o111 and "from wam_diff2_ros.entry_point import controller" in script.read_text()
    assert '"wam-diff2-controller=wam_diff2_ros.entry_point:controller"' in (ROOT / "setup.py").read_text()
    assert "scripts/ros2_run/wam-diff2-controller" in (ROOT / "CMakeLists.txt").read_text()
    assert '"msg/VehicleControl.msg"' in (ROOT / "CMakeLists.txt").read_text()


def test_docs_parameter_table_is_the_generated_one():
    from wam_diff2_core.params.spec import markdown_table
    assert markdown_table(cp.SPECS) in (ROOT / "docs" / "carla.md").read_text()
