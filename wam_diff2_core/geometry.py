"""Ego-frame geometry for the driving stack: commands from routes, ego state, projections.

Frames follow REP-103: the ego frame has x forward, y left, z up; yaw is counter-clockwise.

    >>> route = np.array([[0.0, 0.0], [10.0, 0.0], [20.0, 0.0], [20.0, 10.0], [20.0, 20.0]])
    >>> command_from_route(route, ego_xy=(0.0, 0.0), ego_yaw=0.0, settings=RouteCommandSettings())
    'left'
    >>> command_from_road_option("CHANGELANERIGHT"), command_from_road_option("3")
    ('right', 'straight')
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

import numpy as np

from .outputs.prompts import COMMANDS
from .utils.fields import setting

# CARLA's RoadOption (agents.navigation.local_planner) as the leaderboard publishes it, mapped onto the three
# NAVSIM commands: lane following and VOID drive straight on, lane changes count as turns to that side.
ROAD_OPTIONS = {"VOID": -1, "LEFT": 1, "RIGHT": 2, "STRAIGHT": 3, "LANEFOLLOW": 4,
                "CHANGELANELEFT": 5, "CHANGELANERIGHT": 6}
ROAD_OPTION_COMMANDS = {"VOID": "straight", "LEFT": "left", "RIGHT": "right", "STRAIGHT": "straight",
                        "LANEFOLLOW": "straight", "CHANGELANELEFT": "left", "CHANGELANERIGHT": "right"}
_OPTION_BY_CODE = {code: name for name, code in ROAD_OPTIONS.items()}


def road_option_name(value) -> str:
    """A RoadOption as its name: an int (-1..6; 255 is VOID sent as uint8), a name
    (``LEFT``, ``RoadOption.LEFT``) or an enum member. Raises ValueError naming the forms."""
    name = getattr(value, "name", None)          # an enum member (agents.navigation RoadOption)
    if isinstance(name, str) and name.upper() in ROAD_OPTIONS:
        return name.upper()
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        code = -1 if int(value) == 255 else int(value)
        if code in _OPTION_BY_CODE:
            return _OPTION_BY_CODE[code]
    text = str(value).strip().upper().removeprefix("ROADOPTION.")
    if text in ROAD_OPTIONS:
        return text
    raise ValueError(f"road option {value!r} is not a RoadOption name ({', '.join(ROAD_OPTIONS)}) or number "
                     f"({', '.join(str(v) for v in ROAD_OPTIONS.values())}, 255 = VOID as uint8)")


def command_from_road_option(value: str) -> str:
    """``left|straight|right``, a RoadOption name (``LEFT``, ``RoadOption.LANEFOLLOW``) or number; ValueError
    naming the accepted forms for anything else."""
    text = str(value).strip()
    if text.lower() in COMMANDS:
        return text.lower()
    try:        # a number as text, but not 255: that is VOID only as a CarlaRoute's uint8
        return ROAD_OPTION_COMMANDS[road_option_name(int(text) if text.lstrip("+-").isdigit()
                                                     and int(text) != 255 else text)]
    except ValueError:
        raise ValueError(f"command {text!r} is not one of {', '.join(COMMANDS)}, a RoadOption name "
                         f"({', '.join(ROAD_OPTIONS)}) or number ({', '.join(str(v) for v in ROAD_OPTIONS.values())})"
                         ) from None


def wrap_angle(angle: float) -> float:
    """An angle in radians wrapped into [-pi, pi)."""
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def yaw_from_quaternion(x: float, y: float, z: float, w: float) -> float:
    """Yaw (rotation about z) of a quaternion, radians."""
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def quaternion_from_yaw(yaw: float) -> tuple[float, float, float, float]:
    """(x, y, z, w) of a rotation by ``yaw`` about z."""
    return 0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0)


def ego_to_world(points_ego: np.ndarray, ego_xy: Sequence[float], ego_yaw: float) -> np.ndarray:
    """[N, 2] ego-frame points -> [N, 2] in the frame where the ego sits at ``ego_xy``, ``ego_yaw``."""
    c, s = math.cos(ego_yaw), math.sin(ego_yaw)
    rotation = np.array([[c, -s], [s, c]])
    return np.asarray(points_ego, dtype=np.float64).reshape(-1, 2) @ rotation.T + np.asarray(ego_xy, np.float64)


def world_to_ego(points_world: np.ndarray, ego_xy: Sequence[float], ego_yaw: float) -> np.ndarray:
    """Inverse of :func:`ego_to_world`."""
    c, s = math.cos(ego_yaw), math.sin(ego_yaw)
    rotation = np.array([[c, -s], [s, c]])
    return (np.asarray(points_world, dtype=np.float64).reshape(-1, 2) - np.asarray(ego_xy, np.float64)) @ rotation


def path_headings(points: np.ndarray, start_yaw: float = 0.0) -> np.ndarray:
    """[N] heading of each point of a polyline: the direction from the previous point
    (the first from the origin); a repeated point keeps the heading before it."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    headings = np.empty(len(points))
    previous_xy, previous_yaw = np.zeros(2), start_yaw
    for i, p in enumerate(points):
        d = p - previous_xy
        previous_yaw = math.atan2(d[1], d[0]) if np.hypot(*d) > 1e-6 else previous_yaw
        headings[i] = previous_yaw
        previous_xy = p
    return headings


@dataclass(frozen=True)
class EgoBox:
    """A vehicle's bounding box seen from its rear axle (the demo world's odometry origin)."""

    length_m: float
    width_m: float
    rear_overhang_m: float            # rear axle -> rear bumper

    @property
    def centre_from_axle_m(self) -> float:
        """Rear axle -> centre of the bounding box (forward)."""
        return self.length_m / 2 - self.rear_overhang_m


DEMO_EGO_BOX = EgoBox(length_m=4.7, width_m=1.9, rear_overhang_m=0.95)       # the demo world's ego car
DEMO_EGO_WHEELBASE_M = 2.8                                                    # ... and its wheelbase


def box_corners(x: float, y: float, yaw: float, length_m: float, width_m: float) -> np.ndarray:
    """[4, 2] corners of a ground box centred at (x, y) facing ``yaw``, counter-clockwise from front left."""
    c, s = math.cos(yaw), math.sin(yaw)
    hl, hw = length_m / 2, width_m / 2
    local = np.array([[hl, hw], [-hl, hw], [-hl, -hw], [hl, -hw]])
    return local @ np.array([[c, s], [-s, c]]) + np.array([x, y])


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Separating-axis test for two convex quads [4, 2] (touching counts as overlap)."""
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for ex, ey in edges:
            axis = np.array([-ey, ex])
            pa, pb = a @ axis, b @ axis
            if pa.max() < pb.min() or pb.max() < pa.min():
                return False
    return True


@dataclass(frozen=True)
class RouteCommandSettings:
    """The geometric rule of :func:`command_from_route`; the nodes' ``route.*`` parameters."""

    lookahead_m: float = setting(30.0, "route length ahead of the ego used to derive the command (metres)",
                                 low=1.0, high=1000.0)
    turn_angle_deg: float = setting(30.0, "heading change over the look-ahead that makes a left/right command "
                                    "(degrees)", low=1.0, high=180.0)
    lateral_offset_m: float = setting(2.0, "sideways route offset at the look-ahead end that makes a left/right "
                                      "command (metres; lane changes)", low=0.1, high=100.0)
    max_distance_m: float = setting(10.0, "ignore the route when the ego is farther from it than this (metres)",
                                    low=0.1, high=1000.0)


def command_from_route(route_xy: np.ndarray, ego_xy: Sequence[float], ego_yaw: float,
                       settings: RouteCommandSettings) -> str | None:
    """``left|straight|right`` from the route ``route_xy`` [N, 2] ahead of the ego (same frame); None off it. From
    the route point closest to the ego, the heading change over ``lookahead_m`` decides a turn (left when
    counter-clockwise); below the turn angle, a sideways offset of ``lateral_offset_m`` at the look-ahead end (a
    lane change, a fork) does; a route ending within a metre is ``straight``. Only the ego's position is used,
    not its heading: the route's own direction is the reference, so a heading error does not flip the command.
    """
    pts = world_to_ego(route_xy, ego_xy, ego_yaw)
    if len(pts) == 0 or not np.isfinite(pts).all():
        return None
    keep = np.ones(len(pts), bool)
    keep[1:] = np.hypot(*np.diff(pts, axis=0).T) > 1e-3
    pts = pts[keep]                                                  # [M, 2], no repeated points
    if len(pts) < 2:
        return None
    seg_start, seg_vec = pts[:-1], np.diff(pts, axis=0)              # [M-1, 2]
    seg_len = np.hypot(*seg_vec.T)
    # closest point of each segment to the ego (the origin)
    t = np.clip(-(seg_start * seg_vec).sum(1) / seg_len**2, 0.0, 1.0)
    closest = seg_start + t[:, None] * seg_vec
    distance = np.hypot(*closest.T)
    i = int(np.argmin(distance))
    if distance[i] > settings.max_distance_m:
        return None

    # the route window: from the entry point, lookahead_m along the route
    window, heading_change, remaining = [closest[i]], 0.0, settings.lookahead_m
    for j in range(i, len(seg_vec)):
        if j > i:   # signed turn from segment j-1 to segment j (unwrapped over the window: U-turns add up)
            a, b = seg_vec[j - 1], seg_vec[j]
            heading_change += math.atan2(a[0] * b[1] - a[1] * b[0], float(a @ b))
        available = float(np.hypot(*(pts[j + 1] - window[-1])))
        step = min(remaining, available)
        window.append(window[-1] + seg_vec[j] / seg_len[j] * step)
        remaining -= step
        if remaining <= 1e-9:
            break
    window = np.array(window)                                        # [K, 2]
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(window, axis=0).T))])
    travelled = arc[-1]
    if travelled < 1.0:
        return "straight"
    if abs(heading_change) >= math.radians(settings.turn_angle_deg):
        return "left" if heading_change > 0 else "right"

    # Below a turn: a sideways shift of the route (lane change, fork). Measured across the mean of
    # the route's start and end directions, each taken over a chord of a few metres, so that
    # waypoint noise and lane-centring wiggles do not tilt the reference over the long lever arm.
    def at(s: float) -> np.ndarray:
        return np.array([np.interp(s, arc, window[:, 0]), np.interp(s, arc, window[:, 1])])

    chord = min(5.0, travelled / 4.0)
    d0, d1 = at(chord) - at(0.0), at(travelled) - at(travelled - chord)
    h0 = math.atan2(d0[1], d0[0])
    reference = h0 + 0.5 * wrap_angle(math.atan2(d1[1], d1[0]) - h0)
    offset = window[-1] - window[0]
    lateral = math.cos(reference) * offset[1] - math.sin(reference) * offset[0]   # + left
    if abs(lateral) >= settings.lateral_offset_m:
        return "left" if lateral > 0 else "right"
    return "straight"


@dataclass(frozen=True)
class EgoMotion:
    """Ego motion in the ego frame (x forward, y left): what the policy is told about the car."""

    velocity: tuple[float, float]       # m/s
    acceleration: tuple[float, float]   # m/s^2

    def check(self) -> None:
        values = (*self.velocity, *self.acceleration)
        if len(values) != 4 or not all(math.isfinite(float(v)) for v in values):
            raise ValueError(f"ego state must be finite: velocity={self.velocity}, acceleration={self.acceleration}")


@dataclass(frozen=True)
class EgoSample:
    """Ego state at one time: pose in the odometry frame, motion in the ego frame."""

    stamp_s: float
    x: float                 # metres, odometry frame
    y: float
    yaw: float               # radians, odometry frame
    vx: float                # m/s, ego frame
    vy: float
    ax: float = 0.0          # m/s^2, ego frame
    ay: float = 0.0

    def motion(self) -> EgoMotion:
        return EgoMotion(velocity=(self.vx, self.vy), acceleration=(self.ax, self.ay))

    def interpolate(self, other: "EgoSample", stamp_s: float) -> "EgoSample":
        span = other.stamp_s - self.stamp_s
        w = 0.0 if span <= 0 else min(max((stamp_s - self.stamp_s) / span, 0.0), 1.0)

        def lerp(a: float, b: float) -> float:
            return a + (b - a) * w

        return EgoSample(stamp_s, lerp(self.x, other.x), lerp(self.y, other.y),
                         wrap_angle(self.yaw + wrap_angle(other.yaw - self.yaw) * w),
                         lerp(self.vx, other.vx), lerp(self.vy, other.vy),
                         lerp(self.ax, other.ax), lerp(self.ay, other.ay))


class AccelerationEstimator:
    """Ego-frame acceleration from ego-frame velocities: a_body = dv_body/dt + omega x v_body (the centripetal part
    a turning car feels; NAVSIM's includes it), first-order low-pass over ``time_constant_s``. A gap over
    ``max_gap_s`` or time going backwards (a bag restarting) resets it to zero."""

    def __init__(self, time_constant_s: float, max_gap_s: float = 1.0):
        self.time_constant_s, self.max_gap_s = time_constant_s, max_gap_s
        self.reset()

    def reset(self) -> None:
        self._last: tuple[float, float, float] | None = None
        self.acceleration = (0.0, 0.0)

    def update(self, stamp_s: float, vx: float, vy: float, yaw_rate: float) -> tuple[float, float]:
        last, self._last = self._last, (stamp_s, vx, vy)
        if last is None:
            return self.acceleration
        dt = stamp_s - last[0]
        if dt == 0.0:
            self._last = last
            return self.acceleration
        if dt < 0.0 or dt > self.max_gap_s:
            self.acceleration = (0.0, 0.0)
            return self.acceleration
        raw_x = (vx - last[1]) / dt - yaw_rate * vy
        raw_y = (vy - last[2]) / dt + yaw_rate * vx
        alpha = 1.0 if self.time_constant_s <= 0 else 1.0 - math.exp(-dt / self.time_constant_s)
        ax, ay = self.acceleration
        self.acceleration = (ax + alpha * (raw_x - ax), ay + alpha * (raw_y - ay))
        return self.acceleration


# A stamp further back than this is a new run (a bag replayed again, a simulator restarted),
# not a late message: ego history and bag readers start over (or stop) instead of sorting it in.
TIME_RESET_S = 1.0


class EgoHistory:
    """A short, time-ordered buffer of ego samples, queried at image stamps."""

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self._samples: list[EgoSample] = []            # in stamp order

    def __len__(self) -> int:
        return len(self._samples)

    def clear(self) -> None:
        self._samples.clear()

    def add(self, sample: EgoSample) -> None:
        """Append; a sample older than the newest by over ``TIME_RESET_S`` (a replay restart) clears the buffer."""
        if self._samples and sample.stamp_s < self._samples[-1].stamp_s - TIME_RESET_S:
            self.clear()
        i = bisect.bisect_left(self._samples, sample.stamp_s, key=attrgetter("stamp_s"))
        if i < len(self._samples) and self._samples[i].stamp_s == sample.stamp_s:
            self._samples[i] = sample
        else:
            self._samples.insert(i, sample)
        if len(self._samples) > self.max_samples:
            del self._samples[0]

    def at(self, stamp_s: float, tolerance_s: float) -> EgoSample | None:
        """The state at ``stamp_s``: interpolated between neighbours, or the nearest sample when
        it lies within ``tolerance_s``; None when no sample is that close."""
        if not self._samples:
            return None
        i = bisect.bisect_left(self._samples, stamp_s, key=attrgetter("stamp_s"))
        if 0 < i < len(self._samples):
            before, after = self._samples[i - 1], self._samples[i]
            if min(stamp_s - before.stamp_s, after.stamp_s - stamp_s) <= tolerance_s:
                return before.interpolate(after, stamp_s)
            return None
        nearest = self._samples[0] if i == 0 else self._samples[-1]
        return nearest if abs(nearest.stamp_s - stamp_s) <= tolerance_s else None


@dataclass(frozen=True)
class PinholeCamera:
    """Intrinsics in pixels for an image of ``width`` x ``height``."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    @classmethod
    def from_horizontal_fov(cls, width: int, height: int, horizontal_fov_deg: float) -> "PinholeCamera":
        """Square pixels and the principal point at the centre (how CARLA's cameras are built)."""
        f = width / (2.0 * math.tan(math.radians(horizontal_fov_deg) / 2.0))
        return cls(f, f, width / 2.0, height / 2.0, width, height)

    def scaled_to(self, width: int, height: int) -> "PinholeCamera":
        sx, sy = width / self.width, height / self.height
        return PinholeCamera(self.fx * sx, self.fy * sy, self.cx * sx, self.cy * sy, width, height)


@dataclass(frozen=True)
class CameraMount:
    """Camera pose in the ego frame (REP-103 roll/pitch/yaw: positive pitch looks down)."""

    x_m: float = 0.0
    y_m: float = 0.0
    z_m: float = 0.0
    roll_deg: float = 0.0
    pitch_deg: float = 0.0
    yaw_deg: float = 0.0

    def rotation(self) -> np.ndarray:
        """[3, 3] camera body axes (x forward, y left, z up) expressed in the ego frame."""
        r, p, y = (math.radians(a) for a in (self.roll_deg, self.pitch_deg, self.yaw_deg))
        rz = np.array([[math.cos(y), -math.sin(y), 0], [math.sin(y), math.cos(y), 0], [0, 0, 1]])
        ry = np.array([[math.cos(p), 0, math.sin(p)], [0, 1, 0], [-math.sin(p), 0, math.cos(p)]])
        rx = np.array([[1, 0, 0], [0, math.cos(r), -math.sin(r)], [0, math.sin(r), math.cos(r)]])
        return rz @ ry @ rx


def project_ego_points(points_ego: np.ndarray, camera: PinholeCamera, mount: CameraMount,
                       min_depth_m: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """[N, 3] ego-frame points -> ([N, 2] pixel (u right, v down), [N] in front of the camera); points behind
    the camera (or nearer than ``min_depth_m``) get NaN pixels and False."""
    points = np.asarray(points_ego, dtype=np.float64).reshape(-1, 3)
    body = (points - np.array([mount.x_m, mount.y_m, mount.z_m])) @ mount.rotation()   # [N, 3]
    # camera body (x fwd, y left, z up) -> optical (x right, y down, z forward)
    x_o, y_o, z_o = -body[:, 1], -body[:, 2], body[:, 0]
    in_front = z_o >= min_depth_m
    safe_z = np.where(in_front, z_o, np.nan)
    uv = np.stack([camera.fx * x_o / safe_z + camera.cx, camera.fy * y_o / safe_z + camera.cy], axis=1)
    return uv, in_front
