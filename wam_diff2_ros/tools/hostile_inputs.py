"""Hostile inputs for the localization node and the controller node, over real DDS: a fuzz.

    ctx = rclpy.Context(); rclpy.init(context=ctx, domain_id=42)
    report = fuzz_localization(ctx, messages=400, seed=0)     # or fuzz_controller(...)
    report.problems()                                         # [] when nothing broke

Each run starts the real node in this process (its own executor thread, so a callback that raises
is caught and reported, not lost) and a probe node that plays the bridge, the simulator and the
planner. The probe drives the demo world's expert (the true values) and publishes, phase after
phase, good ticks and hostile ones, where every field of every input message may be replaced:
NaN, +-inf, +-1e308, -0.0, the smallest subnormal, random magnitudes from 1e-30 to 1e308, zero /
non-unit quaternions, negative and huge covariances, out-of-range enums, junk strings; stamps
going backwards (a little, or by hours), repeated, ahead, at the ends of ``int32`` and with
``nanosec`` beyond a second; bursts (a message sent 3 to 15 times without waiting) and silence (an
input left out for a whole phase). After each message it waits until the node has handled it (the
node's own counters); ``handled`` counts what arrived (a burst loses some to the sensor QoS depth).
Run it with ROS_PYTHON_CHECK_FIELDS=1 (scripts/hostile_inputs.py sets it) so that building an
output from a hostile value raises, as it does on Humble.

What it checks (``FuzzReport.problems``): the node's callbacks never raised; every output was
finite and in range (odometry: pose, twist, covariances; control: throttle / brake in [0, 1],
steer in [-1, 1], no throttle on a fallback); ``/diagnostics`` never said OK with a non-finite
standard deviation; and after the hostile phases, good inputs bring correct output back
(odometry within ``RECOVERY_POSITION_M`` of the truth, controls following a fresh plan) for the
last ``RECOVERY_CHECKED_TICKS`` of ``RECOVERY_TICKS`` good ticks. test/ros/tools/test_hostile_inputs.py runs
a few hundred messages per node; ``scripts/hostile_inputs.py`` runs 10,000 and prints the figures.
"""
from __future__ import annotations

import math
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import Pose, PoseStamped
from nav_msgs.msg import Odometry, Path
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Imu, NavSatFix
from std_msgs.msg import Header

from wam_diff2_core.frame_inputs import NS_PER_S, stamp_ns
from wam_diff2_core.geometry import quaternion_from_yaw, wrap_angle, yaw_from_quaternion
from wam_diff2_core.outputs.prompts import WAYPOINT_DT_S
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun
from wam_diff2_core.sim.sensors import DemoSensors

from wam_diff2_core.topics import controller_topics, localization_topics

from ..controller_node import ControllerNode
from ..optional_msgs import carla_msgs
from ..qos import BRIDGE_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS
from ..conversions import ns_to_stamp
from ..localization_node import LocalizationNode
from ..msg import PlannerStatus, Trajectory, TrajectoryPoint, VehicleControl
from .dds_closed_loop import sensor_messages

INT32_MIN, INT32_MAX, UINT32_MAX = -2 ** 31, 2 ** 31 - 1, 2 ** 32 - 1
SPECIAL_F64 = (math.nan, math.inf, -math.inf, 1e308, -1e308, -0.0, 0.0, 5e-324, -1e-300, 1e15, -1e15)
WAIT_S = 2.0                       # longest wait for the node to handle one message (a loaded machine)
RECOVERY_TICKS = 60                # good ticks after the hostile phases (3 s at CARLA's 20 Hz) ...
RECOVERY_CHECKED_TICKS = 20        # ... of which the last ones must all be answered right
RECOVERY_POSITION_M = 2.0          # odometry this close to the truth counts as recovered
ROUTE_LENGTH_M = 300.0             # each demo route; the next one starts when the expert reaches its end
FUZZ_SETTINGS = ClosedLoopSettings(seed=3000, route_length_m=ROUTE_LENGTH_M, traffic=False)


# ----------------------------------------------------------------------------- values
class Spoiler:
    """Random and adversarial replacements for message fields, from one seeded generator."""

    def __init__(self, rng: np.random.Generator, field_p: float = 0.3):
        self.rng, self.field_p = rng, field_p

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def f64(self, good: float) -> float:
        if not self.chance(self.field_p):
            return float(good)
        if self.chance(0.6):
            return float(SPECIAL_F64[self.rng.integers(len(SPECIAL_F64))])
        return float(self.rng.choice([-1.0, 1.0]) * 10.0 ** self.rng.uniform(-30.0, 308.0))

    def integer(self, good: int, low: int, high: int) -> int:
        if not self.chance(self.field_p):
            return good
        return int(self.rng.choice([low, high, self.rng.integers(low, high, endpoint=True)]))

    def stamp(self, good_ns: int, previous_ns: int):
        """A builtin_interfaces/Time: mostly ``good_ns``; else back a little or by hours, repeated, ahead,
        zero, an end of int32, or nanosec beyond a second."""
        if not self.chance(self.field_p / 2):
            return ns_to_stamp(good_ns)
        kind = self.rng.integers(8)
        stamp = ns_to_stamp(good_ns)
        if kind == 0:
            return ns_to_stamp(max(0, good_ns - int(self.rng.uniform(0.01, 0.9) * NS_PER_S)))
        if kind == 1:
            return ns_to_stamp(max(0, good_ns - int(self.rng.uniform(10.0, 1e4) * NS_PER_S)))
        if kind == 2:
            return ns_to_stamp(previous_ns)
        if kind == 3:
            return ns_to_stamp(good_ns + int(self.rng.uniform(0.01, 0.9) * NS_PER_S))
        if kind == 4:
            stamp.sec, stamp.nanosec = 0, 0
        elif kind == 5:
            stamp.sec = int(self.rng.choice([INT32_MIN, INT32_MAX]))
        elif kind == 6:
            stamp.nanosec = int(self.rng.integers(NS_PER_S, UINT32_MAX, endpoint=True))
        else:
            stamp.sec, stamp.nanosec = INT32_MAX, UINT32_MAX
        return stamp

    def text(self, good: str) -> str:
        if not self.chance(self.field_p / 3):
            return good
        return str(self.rng.choice(["", " ", "\x00", "ü" * 300, "../../etc", "x" * 10000, "left", "STRAIGHT"]))

    def array(self, values, spoil: Callable[[float], float]) -> list[float]:
        return [spoil(v) for v in values]


def _spoil_point(s: Spoiler, p) -> None:
    p.x, p.y, p.z = s.f64(p.x), s.f64(p.y), s.f64(p.z)


def _spoil_quaternion(s: Spoiler, q) -> None:
    if s.chance(s.field_p / 3):
        q.x = q.y = q.z = q.w = 0.0 if s.chance(0.5) else -0.0          # the zero quaternion
        return
    q.x, q.y, q.z, q.w = s.f64(q.x), s.f64(q.y), s.f64(q.z), s.f64(q.w)
    if s.chance(s.field_p / 3):
        factor = float(s.rng.choice([2.0, 0.5, -1.0, 1.05]))              # finite, not unit (or flipped)
        q.x, q.y, q.z, q.w = (factor * v for v in (q.x, q.y, q.z, q.w))


def route_points(s: Spoiler, start_xy: tuple[float, float], yaw: float) -> list[tuple[float, float]]:
    n = int(s.rng.choice([0, 1, 2, 5, 50]))
    c, sn = math.cos(yaw), math.sin(yaw)
    return [(s.f64(start_xy[0] + 10.0 * k * c), s.f64(start_xy[1] + 10.0 * k * sn)) for k in range(n)]


def path_msg(points: list[tuple[float, float]], frame_id: str = "map") -> Path:
    path = Path(header=Header(frame_id=frame_id))
    for x, y in points:
        pose = PoseStamped(header=path.header)
        pose.pose.position.x, pose.pose.position.y, pose.pose.orientation.w = x, y, 1.0
        path.poses.append(pose)
    return path


def carla_route_msg(s: Spoiler, points: list[tuple[float, float]]):
    poses = []
    for x, y in points:
        pose = Pose()
        pose.position.x, pose.position.y = x, y
        poses.append(pose)
    options = [s.integer(4, -128, 127) for _ in points]
    if s.chance(0.2):
        options = options[:-1]                                             # one option short
    return carla_msgs.CarlaRoute(header=Header(frame_id="map"), poses=poses, road_options=options)


# ----------------------------------------------------------------------------- running a node
class _Spinner:
    """An executor thread that keeps what a callback raised (rclpy's spin re-raises it)."""

    def __init__(self, node: Node):
        self.node, self.error = node, ""
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:                       # reported, never swallowed: FuzzReport.crash
            self.error = traceback.format_exc()

    def stop(self) -> None:
        self.executor.shutdown()
        self.thread.join(5.0)
        self.node.destroy_node()


@dataclass
class FuzzReport:
    node: str
    seed: int
    messages: int = 0                           # hostile-phase messages published (bursts included)
    handled: int = 0                            # of them, handled by the node (the rest: lost in a burst)
    outputs: int = 0                            # odometry or controls received
    wall_s: float = 0.0
    crash: str = ""                             # the traceback of a callback that raised
    bad_outputs: int = 0                        # non-finite or out of range
    first_bad_output: str = ""
    bad_diagnostics: int = 0                    # OK with a non-finite standard deviation
    diagnostics: int = 0
    recovered: bool = False
    recovery_ticks: int | None = None           # good ticks until every later output was right
    recovery_detail: str = ""
    refused: dict[str, int] = field(default_factory=dict)    # the node's counters (refusals, fallbacks)

    def problems(self) -> list[str]:
        found = []
        if self.crash:
            found.append(f"a callback raised:\n{self.crash}")
        if self.bad_outputs:
            found.append(f"{self.bad_outputs} bad outputs, the first: {self.first_bad_output}")
        if self.bad_diagnostics:
            found.append(f"{self.bad_diagnostics} /diagnostics OK with a non-finite standard deviation")
        if not self.recovered:
            found.append(f"no recovery after good inputs resumed: {self.recovery_detail}")
        if self.handled < 0.5 * self.messages:
            found.append(f"only {self.handled} of {self.messages} messages reached the node")
        return found

    def summary(self) -> str:
        rate = self.messages / self.wall_s if self.wall_s else 0.0
        return (f"{self.node}: {self.messages} hostile messages (seed {self.seed}, {self.handled} handled) in "
                f"{self.wall_s:.1f} s ({rate:.0f}/s); {self.outputs} outputs, {self.bad_outputs} bad; "
                f"{self.diagnostics} diagnostics, {self.bad_diagnostics} OK with a non-finite stddev; crash: "
                f"{'yes' if self.crash else 'no'}; recovered: {self.recovered} (after {self.recovery_ticks} good "
                f"ticks)")


class _Probe(Node):
    """Publishers for the node's inputs; its outputs and /diagnostics checked as they arrive."""

    def __init__(self, context, name: str, report: FuzzReport, check_output: Callable[[Any], str],
                 status_name: str):
        super().__init__(name, context=context)
        self.report, self.check_output, self.status_name = report, check_output, status_name
        self.lock = threading.Lock()
        self.outputs: list[Any] = []
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def watch(self, msg_type, topic: str, qos) -> None:
        self.create_subscription(msg_type, topic, self._on_output, qos)

    def _on_output(self, msg) -> None:
        bad = self.check_output(msg)
        with self.lock:
            self.outputs.append(msg)
            self.report.outputs += 1
            if bad:
                self.report.bad_outputs += 1
                self.report.first_bad_output = self.report.first_bad_output or bad

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name != self.status_name:
                continue
            self.report.diagnostics += 1
            values = {kv.key: kv.value for kv in status.values}
            stddev = [values[k] for k in values if "stddev" in k]
            if status.level == DiagnosticStatus.OK and not all(math.isfinite(float(v)) for v in stddev):
                self.report.bad_diagnostics += 1

    def outputs_since(self, count: int) -> list[Any]:
        with self.lock:
            return self.outputs[count:]


def _wait(condition: Callable[[], bool], spinner: _Spinner, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if spinner.error or time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


class _Phases:
    """Alternating good and hostile phases over the demo world's expert drive, one timeline of ticks."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.index = rng, 0
        self.run = RouteRun(self.index, FUZZ_SETTINGS)
        self.tick_ns = self.run.start_ns
        self.previous_ns = self.tick_ns

    def step(self) -> None:
        self.run.world.step()
        self.previous_ns, self.tick_ns = self.tick_ns, self.tick_ns + self.run.dt_ns
        if self.run.world.lane_s >= self.run.end_s:        # the route's end: the next route, the clock going on
            self.index += 1
            self.run = RouteRun(self.index, FUZZ_SETTINGS)

    def plan(self):
        """(ticks, hostile) until the caller stops: good phases of 5..30 ticks, hostile ones of 5..40."""
        while True:
            yield int(self.rng.integers(5, 31)), False
            yield int(self.rng.integers(5, 41)), True


class _Sender:
    """Publishes a group of messages (one, or a burst sent without waiting) and waits until the node has
    handled at least one, by its own counters; counts what the hostile phases sent and the node handled."""

    def __init__(self, report: FuzzReport, spinner: _Spinner, handled: Callable[[], int]):
        self.report, self.spinner, self.handled = report, spinner, handled

    def __call__(self, publisher, msgs: list, hostile: bool, counted: bool = True) -> bool:
        before = self.handled()
        for msg in msgs:
            publisher.publish(msg)
        arrived = not counted or _wait(lambda: self.handled() > before, self.spinner)
        if len(msgs) > 1:
            time.sleep(0.005)                                   # the rest of the burst, or what is left of it
        if hostile:
            self.report.messages += len(msgs)
            self.report.handled += len(msgs) if not counted else self.handled() - before
        return arrived


# ----------------------------------------------------------------------------- localization
def _odometry_problem(msg: Odometry) -> str:
    p, o = msg.pose.pose.position, msg.pose.pose.orientation
    v, w = msg.twist.twist.linear, msg.twist.twist.angular
    values = [p.x, p.y, p.z, o.x, o.y, o.z, o.w, v.x, v.y, v.z, w.x, w.y, w.z, *msg.pose.covariance,
              *msg.twist.covariance]
    if not np.isfinite(values).all():
        return f"odometry stamped {stamp_ns(msg.header.stamp)} has non-finite values: {values[:13]}"
    if abs(math.hypot(o.x, o.y, o.z, o.w) - 1.0) > 1e-6 or v.x < 0.0:
        return f"odometry stamped {stamp_ns(msg.header.stamp)}: orientation not unit or speed negative"
    return ""


def fuzz_localization(context, messages: int, seed: int, role: str = "fuzz_loc") -> FuzzReport:
    """``messages`` hostile sensor messages into a LocalizationNode, then RECOVERY_TICKS good ticks."""
    report = FuzzReport("localization", seed)
    rng = np.random.default_rng(seed)
    s = Spoiler(rng)
    node = LocalizationNode(f"localization_{role}", context=context, parameter_overrides=[
        Parameter("role_name", value=role), Parameter("diagnostics_period_s", value=0.05)])
    topics = localization_topics(role)
    probe = _Probe(context, f"fuzz_bridge_{role}", report, _odometry_problem, f"{node.get_name()}: localization")
    probe.watch(Odometry, topics["odometry"], qos_profile_sensor_data)
    pubs = {"gnss": probe.create_publisher(NavSatFix, topics["gnss"], BRIDGE_QOS),
            "imu": probe.create_publisher(Imu, topics["imu"], BRIDGE_QOS),
            "speed": probe.create_publisher(carla_msgs.CarlaSpeedometer, topics["speedometer"], BRIDGE_QOS),
            "route": probe.create_publisher(Path, topics["route"], LATCHED_QOS),
            "carla_route": probe.create_publisher(carla_msgs.CarlaRoute, topics["carla_route"], LATCHED_QOS)}
    spinners = [_Spinner(node), _Spinner(probe)]
    try:
        if not _wait(lambda: all(p.get_subscription_count() for p in pubs.values()), spinners[0], 10.0):
            raise RuntimeError(f"the probe and the node did not match: {report.crash or 'timeout'}")
        sensors = DemoSensors(rng=np.random.default_rng([seed, 1]))
        phases = _Phases(rng)
        send = _Sender(report, spinners[0], lambda: sum(v for k, v in node.counts.items()
                                                        if k.endswith(("_used", "_refused")) or k.startswith("routes_")))
        start = time.perf_counter()
        for ticks, hostile in phases.plan():
            silent = {k for k in ("gnss", "imu", "speed") if hostile and s.chance(0.15)}   # the whole phase
            for _ in range(ticks):
                if report.messages >= messages or spinners[0].error:
                    break
                good = _sensor_tick(phases, sensors, topics)
                for kind in rng.permutation(["gnss", "speed", "imu"]) if hostile else ("gnss", "speed", "imu"):
                    if kind in silent:
                        continue
                    if not hostile:
                        send(pubs[kind], [good[kind]], False)
                        continue
                    copies = int(rng.integers(3, 16)) if s.chance(0.05) else 1              # a burst
                    send(pubs[kind], [_spoil_sensor(s, kind, good[kind], phases) for _ in range(copies)], True)
                if hostile and s.chance(0.02):
                    ego = phases.run.world.ego
                    points = route_points(s, (ego.x, ego.y), ego.yaw)
                    kind = "carla_route" if s.chance(0.5) else "route"
                    send(pubs[kind], [carla_route_msg(s, points) if kind == "carla_route" else path_msg(points)], True)
                phases.step()
            if report.messages >= messages or spinners[0].error:
                break
        _localization_recovery(report, node, probe, pubs, phases, sensors, topics, spinners[0], send)
        report.wall_s = time.perf_counter() - start
        time.sleep(0.1)                                              # the last diagnostics
    finally:
        report.crash = spinners[0].error or spinners[1].error
        report.refused = {k: v for k, v in sorted(node.counts.items()) if "refused" in k}
        report.refused.update({f"filter_{k}": v for k, v in node.ekf.counts.items()
                               if k.startswith(("restarts", "gnss_reacquired"))})
        for spinner in spinners:
            spinner.stop()
    return report


def _sensor_tick(phases: _Phases, sensors: DemoSensors, topics: dict[str, str]) -> dict[str, Any]:
    """One tick of the demo world's sensors as the Leaderboard 2.0 bridge publishes them (status unset)."""
    fix, imu, speed = sensor_messages(sensors.read(phases.run.world.ego), ns_to_stamp(phases.tick_ns), topics)
    return {"gnss": fix, "imu": imu, "speed": speed}


def _spoil_sensor(s: Spoiler, kind: str, good, phases: _Phases):
    header = Header(stamp=s.stamp(phases.tick_ns, phases.previous_ns), frame_id=s.text(good.header.frame_id))
    if kind == "speed":
        return carla_msgs.CarlaSpeedometer(header=header, speed=s.f64(good.speed))
    if kind == "gnss":
        fix = NavSatFix(header=header, latitude=s.f64(good.latitude), longitude=s.f64(good.longitude),
                        altitude=s.f64(good.altitude), position_covariance_type=s.integer(0, 0, 255))
        fix.status.status, fix.status.service = s.integer(-2, -128, 127), s.integer(1, 0, 65535)
        fix.position_covariance = s.array([0.3 if i in (0, 4, 8) else 0.0 for i in range(9)], s.f64)
        if s.chance(0.1):                                        # a fix 1 km off: the gate's case
            fix.latitude, fix.longitude = good.latitude + 0.009, good.longitude
        return fix
    imu = Imu(header=header)
    imu.orientation.x, imu.orientation.y, imu.orientation.z, imu.orientation.w = (
        good.orientation.x, good.orientation.y, good.orientation.z, good.orientation.w)
    _spoil_quaternion(s, imu.orientation)
    imu.angular_velocity.x, imu.angular_velocity.y, imu.angular_velocity.z = (
        good.angular_velocity.x, good.angular_velocity.y, good.angular_velocity.z)
    imu.linear_acceleration.x, imu.linear_acceleration.y, imu.linear_acceleration.z = (
        good.linear_acceleration.x, good.linear_acceleration.y, good.linear_acceleration.z)
    _spoil_point(s, imu.angular_velocity)
    _spoil_point(s, imu.linear_acceleration)
    for name in ("orientation_covariance", "angular_velocity_covariance", "linear_acceleration_covariance"):
        setattr(imu, name, s.array([1e-4 if i in (0, 4, 8) else 0.0 for i in range(9)], s.f64))
    if s.chance(0.1):
        imu.orientation_covariance[0] = -1.0                     # "no orientation" (REP-145)
    return imu


def _localization_recovery(report, node, probe, pubs, phases, sensors, topics, spinner, send) -> None:
    """Good ticks again (after a good route from the ego); the last RECOVERY_CHECKED_TICKS must each give finite
    odometry stamped with the tick within RECOVERY_POSITION_M of the truth, and /diagnostics OK at the end."""
    send(pubs["route"], [_route_ahead(phases.run)], False)
    errors: list[float] = []
    for _ in range(RECOVERY_TICKS):
        if spinner.error:
            break
        good, ego, stamp = _sensor_tick(phases, sensors, topics), phases.run.world.ego, phases.tick_ns
        seen = len(probe.outputs)
        for kind in ("gnss", "speed", "imu"):
            send(pubs[kind], [good[kind]], False)
        answer = _wait(lambda: any(stamp_ns(m.header.stamp) == stamp for m in probe.outputs_since(seen)), spinner,
                       0.5)
        odometry = next((m for m in probe.outputs_since(seen) if stamp_ns(m.header.stamp) == stamp), None)
        right = answer and odometry is not None and not _odometry_problem(odometry) and math.hypot(
            odometry.pose.pose.position.x - ego.x, odometry.pose.pose.position.y - ego.y) < RECOVERY_POSITION_M \
            and abs(wrap_angle(yaw_from_quaternion(*_xyzw(odometry.pose.pose.orientation)) - ego.yaw)) < 0.1
        errors.append(0.0 if right else math.inf if odometry is None else math.hypot(
            odometry.pose.pose.position.x - ego.x, odometry.pose.pose.position.y - ego.y))
        phases.step()
    status = node.diagnostic_status()
    _recovery_verdict(report, [e == 0.0 for e in errors], status.level == DiagnosticStatus.OK,
                      f"position errors (m, inf: no odometry) of the good ticks: {np.round(errors, 2).tolist()}; "
                      f"/diagnostics at the end: {status.message}")


def _route_ahead(run: RouteRun) -> Path:
    ego = run.world.ego
    return path_msg([(ego.x + 10.0 * k * math.cos(ego.yaw), ego.y + 10.0 * k * math.sin(ego.yaw)) for k in range(5)])


def _xyzw(q) -> tuple[float, float, float, float]:
    return q.x, q.y, q.z, q.w


def _recovery_verdict(report: FuzzReport, right: list[bool], final_ok: bool, detail: str) -> None:
    first = next((i for i in range(len(right)) if all(right[i:])), None) if right else None
    report.recovery_ticks = first
    report.recovered = (len(right) == RECOVERY_TICKS and first is not None
                        and first <= RECOVERY_TICKS - RECOVERY_CHECKED_TICKS and final_ok)
    report.recovery_detail = detail


# ----------------------------------------------------------------------------- controller
def _control_problem(msg) -> str:
    values = (msg.throttle, msg.steer, msg.brake)
    if not (np.isfinite(values).all() and 0.0 <= msg.throttle <= 1.0 and -1.0 <= msg.steer <= 1.0
            and 0.0 <= msg.brake <= 1.0):
        return f"{type(msg).__name__} stamped {stamp_ns(msg.header.stamp)}: {values} out of range"
    if isinstance(msg, VehicleControl) and msg.source == VehicleControl.SOURCE_FALLBACK and msg.throttle > 0.0:
        return f"throttle {msg.throttle} on a fallback ({msg.reason})"
    return ""


def _odometry_from(run: RouteRun, stamp_ns_: int, role: str) -> Odometry:
    ego = run.world.ego
    msg = Odometry(header=Header(stamp=ns_to_stamp(stamp_ns_), frame_id="map"), child_frame_id=role)
    msg.pose.pose.position.x, msg.pose.pose.position.y = ego.x, ego.y
    o = msg.pose.pose.orientation
    o.x, o.y, o.z, o.w = quaternion_from_yaw(ego.yaw)
    msg.twist.twist.linear.x, msg.twist.twist.angular.z = ego.speed, ego.yaw_rate
    return msg


def _plan_from(run: RouteRun, stamp_ns_: int) -> Trajectory:
    """The expert's next 4 s as a valid plan (ego frame, 0.5 s apart), as the planner would publish it."""
    msg = Trajectory(header=Header(stamp=ns_to_stamp(stamp_ns_), frame_id="ego"), valid=True, command="straight")
    for k, (x, y) in enumerate(run.world.expert_future(8, WAYPOINT_DT_S)):
        point = TrajectoryPoint(x=float(x), y=float(y))
        point.time_from_start.sec, point.time_from_start.nanosec = divmod(int((k + 1) * WAYPOINT_DT_S * NS_PER_S),
                                                                          NS_PER_S)
        msg.points.append(point)
    return msg


def _spoil_odometry(s: Spoiler, good: Odometry, phases: _Phases) -> Odometry:
    msg = Odometry(header=Header(stamp=s.stamp(phases.tick_ns, phases.previous_ns),
                                 frame_id=s.text(good.header.frame_id)), child_frame_id=s.text(good.child_frame_id))
    p, g = msg.pose.pose, good.pose.pose
    p.position.x, p.position.y, p.position.z = g.position.x, g.position.y, g.position.z
    p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w = _xyzw(g.orientation)
    _spoil_point(s, p.position)
    _spoil_quaternion(s, p.orientation)
    t, gt = msg.twist.twist, good.twist.twist
    t.linear.x, t.linear.y, t.angular.z = gt.linear.x, gt.linear.y, gt.angular.z
    _spoil_point(s, t.linear)
    _spoil_point(s, t.angular)
    msg.pose.covariance = s.array([0.0] * 36, s.f64)
    msg.twist.covariance = s.array([0.0] * 36, s.f64)
    return msg


def _spoil_plan(s: Spoiler, good: Trajectory, phases: _Phases) -> Trajectory:
    msg = Trajectory(header=Header(stamp=s.stamp(phases.tick_ns, phases.previous_ns), frame_id="ego"),
                     valid=bool(s.rng.random() < 0.8), command=s.text(good.command),
                     invalid_reason=s.text(""), raw_text=s.text(""))
    count = int(s.rng.choice([len(good.points)] * 6 + [0, 1, 2, 3, 20, 500]))
    for k in range(count):
        src = good.points[k % len(good.points)]
        point = TrajectoryPoint(x=s.f64(src.x), y=s.f64(src.y))
        point.time_from_start.sec = s.integer(src.time_from_start.sec, INT32_MIN, INT32_MAX)
        point.time_from_start.nanosec = s.integer(src.time_from_start.nanosec, 0, UINT32_MAX)
        msg.points.append(point)
    return msg


def fuzz_controller(context, messages: int, seed: int, role: str = "fuzz_ctl") -> FuzzReport:
    """``messages`` hostile odometry / plan / planner-status / route messages into a ControllerNode (ticking on
    odometry, CARLA's control out), then RECOVERY_TICKS good ticks with fresh plans."""
    report = FuzzReport("controller", seed)
    rng = np.random.default_rng(seed)
    s = Spoiler(rng)
    name = f"wam_diff2_controller_{role}"
    node = ControllerNode(name, context=context, parameter_overrides=[
        Parameter("role_name", value=role), Parameter("diagnostics_period_s", value=0.05),
        Parameter("control_consumer", value="carla" if carla_msgs is not None else "vehicle_control")])
    topics = controller_topics(role)
    probe = _Probe(context, f"fuzz_sim_{role}", report, _control_problem, f"{name}: controller")
    probe.watch(VehicleControl, f"/{name}/output/control", LATEST_RELIABLE_QOS)
    if carla_msgs is not None:
        probe.watch(carla_msgs.CarlaEgoVehicleControl, topics["carla_control"], LATEST_RELIABLE_QOS)
    pubs = {"odometry": probe.create_publisher(Odometry, topics["odometry"], qos_profile_sensor_data),
            "trajectory": probe.create_publisher(Trajectory, topics["trajectory"], LATEST_RELIABLE_QOS),
            "status": probe.create_publisher(PlannerStatus, topics["planner_status"], LATCHED_QOS),
            "route": probe.create_publisher(Path, topics["route"], LATCHED_QOS)}
    if carla_msgs is not None:
        pubs["carla_route"] = probe.create_publisher(carla_msgs.CarlaRoute, topics["carla_route"], LATCHED_QOS)
    spinners = [_Spinner(node), _Spinner(probe)]
    handled_keys = ("ticks", "ticks_repeated", "odometry_bad_stamp", "plans_received", "routes_received",
                    "routes_refused")
    send = _Sender(report, spinners[0], lambda: sum(node.counts[k] for k in handled_keys))
    try:
        if not _wait(lambda: all(p.get_subscription_count() for k, p in pubs.items() if k != "status"), spinners[0],
                     10.0):
            raise RuntimeError(f"the probe and the node did not match: {report.crash or 'timeout'}")
        phases = _Phases(rng)
        start = time.perf_counter()
        for ticks, hostile in phases.plan():
            silent = {k for k in ("odometry", "trajectory") if hostile and s.chance(0.15)}   # the whole phase
            for tick in range(ticks):
                if report.messages >= messages or spinners[0].error:
                    break
                run = phases.run
                inputs = []
                if tick % 5 == 0 or hostile and s.chance(0.3):
                    inputs.append(("trajectory", _plan_from(run, phases.tick_ns)))
                inputs.append(("odometry", _odometry_from(run, phases.tick_ns, role)))
                if hostile and s.chance(0.05):
                    inputs.append(("status", PlannerStatus(state=s.integer(PlannerStatus.READY, 0, 255))))
                if hostile and s.chance(0.02):
                    points = route_points(s, (run.world.ego.x, run.world.ego.y), run.world.ego.yaw)
                    kind = "carla_route" if "carla_route" in pubs and s.chance(0.5) else "route"
                    inputs.append((kind, carla_route_msg(s, points) if kind == "carla_route" else path_msg(points)))
                for kind, good in inputs:
                    if kind in silent:
                        continue
                    spoil = {"odometry": _spoil_odometry, "trajectory": _spoil_plan}.get(kind)
                    if not hostile or spoil is None:
                        send(pubs[kind], [good], hostile, counted=kind != "status")
                        continue
                    copies = int(rng.integers(3, 16)) if s.chance(0.05) else 1              # a burst
                    send(pubs[kind], [spoil(s, good, phases) for _ in range(copies)], True)
                phases.step()
            if report.messages >= messages or spinners[0].error:
                break
        _controller_recovery(probe, pubs, phases, spinners[0], send, report, role)
        report.wall_s = time.perf_counter() - start
        time.sleep(0.1)
    finally:
        report.crash = spinners[0].error or spinners[1].error
        report.refused = {k: v for k, v in sorted(node.counts.items())
                          if k.startswith(("fallback_", "plans_", "routes_", "ticks_", "time_resets", "odometry_"))}
        for spinner in spinners:
            spinner.stop()
    return report


def _controller_recovery(probe, pubs, phases, spinner, send, report, role) -> None:
    """Good inputs again: a good route from the ego, the planner READY, a fresh plan every 5 ticks; the last
    RECOVERY_CHECKED_TICKS ticks must each be answered by a control that follows the plan."""
    send(pubs["route"], [_route_ahead(phases.run)], False)
    send(pubs["status"], [PlannerStatus(state=PlannerStatus.READY)], False, counted=False)
    right, reasons = [], []
    for tick in range(RECOVERY_TICKS):
        if spinner.error:
            break
        run, stamp = phases.run, phases.tick_ns
        if tick % 5 == 0:
            send(pubs["trajectory"], [_plan_from(run, stamp)], False)
        seen = len(probe.outputs)
        send(pubs["odometry"], [_odometry_from(run, stamp, role)], False)
        _wait(lambda: any(isinstance(m, VehicleControl) and stamp_ns(m.header.stamp) == stamp
                          for m in probe.outputs_since(seen)), spinner, 0.5)
        control = next((m for m in probe.outputs_since(seen)
                        if isinstance(m, VehicleControl) and stamp_ns(m.header.stamp) == stamp), None)
        reasons.append("no control" if control is None else control.reason or "plan")
        right.append(control is not None and control.source == VehicleControl.SOURCE_PLAN
                     and not _control_problem(control))
        phases.step()
    _recovery_verdict(report, right, True, f"controls of the good ticks: {reasons}")

