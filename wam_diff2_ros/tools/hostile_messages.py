"""What the fuzz of :mod:`.hostile_inputs` sends: good and hostile phases over the demo world's expert drive,
its good messages, and those messages spoiled, from one seeded generator (the same seed, the same messages).

A spoiled field may be NaN, +-inf, +-1e308, -0.0, the smallest subnormal, a random magnitude from 1e-30 to
1e308; quaternions zero or not unit, covariances negative or huge, enums out of range, strings junk; stamps
back (a little, or by hours), repeated, ahead, at the ends of ``int32`` or with ``nanosec`` beyond a second.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry, Path
from sensor_msgs.msg import NavSatFix
from std_msgs.msg import Header

from wam_diff2_core.frame_inputs import NS_PER_S
from wam_diff2_core.outputs.prompts import WAYPOINT_DT_S
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun
from wam_diff2_core.sim.sensors import DemoSensors

from ..conversions import ns_to_stamp, pose_msg
from ..msg import Trajectory, TrajectoryPoint
from ..optional_msgs import carla_msgs
from .simulator_bridge import plan_message, sensor_messages

ROUTE_LENGTH_M = 300.0             # each demo route; the next one starts when the expert reaches its end
FUZZ_SETTINGS = ClosedLoopSettings(seed=3000, route_length_m=ROUTE_LENGTH_M, traffic=False)
INT32_MIN, INT32_MAX, UINT32_MAX = -2 ** 31, 2 ** 31 - 1, 2 ** 32 - 1
SPECIAL_F64 = (math.nan, math.inf, -math.inf, 1e308, -1e308, -0.0, 0.0, 5e-324, -1e-300, 1e15, -1e15)


class Phases:
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

    @property
    def stamps(self) -> tuple[int, int]:
        return self.tick_ns, self.previous_ns

    def plan(self):
        """(ticks, hostile) until the caller stops: good phases of 5..30 ticks, hostile ones of 5..40."""
        while True:
            yield int(self.rng.integers(5, 31)), False
            yield int(self.rng.integers(5, 41)), True


def sensor_tick(phases: Phases, sensors: DemoSensors, topics: dict[str, str]) -> dict[str, Any]:
    """One tick of the demo world's sensors as the Leaderboard 2.0 bridge publishes them (status unset)."""
    fix, imu, speed = sensor_messages(sensors.read(phases.run.world.ego), ns_to_stamp(phases.tick_ns), topics)
    return {"gnss": fix, "imu": imu, "speed": speed}


def expert_plan(run: RouteRun, stamp_ns_: int) -> Trajectory:
    """The expert's next 4 s as a valid plan (ego frame, 0.5 s apart), as the planner would publish it."""
    return plan_message(stamp_ns_, run.world.expert_future(8, WAYPOINT_DT_S), "ego", "straight")


def route_ahead(run: RouteRun) -> Path:
    """A good route: 40 m straight ahead of the ego."""
    ego = run.world.ego
    return path_msg([(ego.x + 10.0 * k * math.cos(ego.yaw), ego.y + 10.0 * k * math.sin(ego.yaw)) for k in range(5)])


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


def spoil_point(s: Spoiler, p) -> None:
    p.x, p.y, p.z = s.f64(p.x), s.f64(p.y), s.f64(p.z)


def spoil_quaternion(s: Spoiler, q) -> None:
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


def path_msg(points: list[tuple[float, float]]) -> Path:
    header = Header(frame_id="map")
    return Path(header=header, poses=[PoseStamped(header=header, pose=pose_msg(x, y, 0.0)) for x, y in points])


def carla_route_msg(s: Spoiler, points: list[tuple[float, float]]):
    poses = [pose_msg(x, y, 0.0) for x, y in points]
    options = [s.integer(4, -128, 127) for _ in points]
    if s.chance(0.2):
        options = options[:-1]                                             # one option short
    return carla_msgs.CarlaRoute(header=Header(frame_id="map"), poses=poses, road_options=options)


def spoil_sensor(s: Spoiler, kind: str, good, tick_ns: int, previous_ns: int):
    header = Header(stamp=s.stamp(tick_ns, previous_ns), frame_id=s.text(good.header.frame_id))
    if kind == "speed":
        return carla_msgs.CarlaSpeedometer(header=header, speed=s.f64(good.speed))
    if kind == "gnss":
        fix = NavSatFix(header=header, latitude=s.f64(good.latitude), longitude=s.f64(good.longitude),
                        altitude=s.f64(good.altitude), position_covariance_type=s.integer(0, 0, 255))
        fix.status.status, fix.status.service = s.integer(-2, -128, 127), s.integer(1, 0, 65535)
        fix.position_covariance = [s.f64(0.3 if i in (0, 4, 8) else 0.0) for i in range(9)]
        if s.chance(0.1):                                        # a fix 1 km off: the gate's case
            fix.latitude, fix.longitude = good.latitude + 0.009, good.longitude
        return fix
    imu = copy.deepcopy(good)
    imu.header = header
    spoil_quaternion(s, imu.orientation)
    spoil_point(s, imu.angular_velocity)
    spoil_point(s, imu.linear_acceleration)
    for name in ("orientation_covariance", "angular_velocity_covariance", "linear_acceleration_covariance"):
        setattr(imu, name, [s.f64(1e-4 if i in (0, 4, 8) else 0.0) for i in range(9)])
    if s.chance(0.1):
        imu.orientation_covariance[0] = -1.0                     # "no orientation" (REP-145)
    return imu


def spoil_odometry(s: Spoiler, good: Odometry, tick_ns: int, previous_ns: int) -> Odometry:
    msg = copy.deepcopy(good)
    msg.header = Header(stamp=s.stamp(tick_ns, previous_ns), frame_id=s.text(good.header.frame_id))
    msg.child_frame_id = s.text(good.child_frame_id)
    spoil_point(s, msg.pose.pose.position)
    spoil_quaternion(s, msg.pose.pose.orientation)
    spoil_point(s, msg.twist.twist.linear)
    spoil_point(s, msg.twist.twist.angular)
    msg.pose.covariance = [s.f64(0.0) for _ in range(36)]
    msg.twist.covariance = [s.f64(0.0) for _ in range(36)]
    return msg


def spoil_plan(s: Spoiler, good: Trajectory, tick_ns: int, previous_ns: int) -> Trajectory:
    msg = Trajectory(header=Header(stamp=s.stamp(tick_ns, previous_ns), frame_id="ego"),
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
