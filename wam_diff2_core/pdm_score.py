"""The PDM score (PDMS) of a plan, NAVSIM v1's definition, ROS-free: one implementation for every caller.

A plan (8 waypoints at 0.5 ... 4.0 s, metres, in the ego frame: rear axle, x forward, y left) is
tracked for 4 s at 10 Hz by NAVSIM's controller and motion model, against non-reactive agents
(oriented boxes over time), a drivable area and the route's centre line; the tracked ego is scored:

| sub-score | range | rule (NAVSIM v1.1, ``pdm_scorer.py``) |
|---|---|---|
| ``nc``  no at-fault collision | {0, 0.5, 1} | an at-fault overlap of the ego box with an agent: 0 (a vehicle, pedestrian or cyclist), 0.5 (a static object) |
| ``dac`` drivable-area compliance | {0, 1} | 0 when a corner of the ego box leaves the drivable area at any step |
| ``ttc`` time to collision within bound | {0, 1} | 0 when the ego box, moved on at its speed for 0, 0.3, 0.6 or 0.9 s, hits an agent ahead (or not behind while the ego straddles lanes, is off the road or in an intersection) |
| ``ep``  ego progress | [0, 1] | progress of the box centre along the centre line x NC x DAC, over the larger of it and the rule-based reference planner's (1 when both are under 5 m) |
| ``c``   comfort | {0, 1} | longitudinal / lateral acceleration, jerk, longitudinal jerk, yaw rate and yaw acceleration within nuPlan's bounds |

    PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12

At-fault collisions (NAVSIM's ``get_collision_type``): with the ego stopped (<= 0.05 m/s) none is;
with the agent stopped (its speed at t = 0 <= 0.05 m/s), a front hit (the ego's front edge touches
it) or a lateral hit while the ego straddles lanes or is off the drivable area, it is; a hit from
behind (the agent's centre more than 150 deg off the ego's heading) is not. An agent once touched
without fault, or overlapping the ego already at t = 0, is ignored for NC and TTC afterwards. TTC's
"ahead" is the angle from the ego's pose now to the agent's centre 0 ... 0.9 s later (NAVSIM's rule,
kept: a car closing fast from behind can count as ahead once it would pass the ego's rear axle).

The controller and model are NAVSIM's (``pdm_simulator.py``): the plan, with the ego's pose at
t = 0 in front and a heading per waypoint (:func:`plan_headings`), is interpolated to 0.1 s; a
regularised least-squares fit gives its speed and curvature profiles (nuPlan's: "jerk" penalty 1e-4
as nuPlan builds it, on the accelerations themselves, see :func:`speed_and_curvature_profiles`;
curvature-rate penalty 1e-2); an LQR tracker (longitudinal: speed error 1 s ahead; lateral: lateral
/ heading error and steering angle over a 10-step horizon; below 0.2 m/s a proportional stopping
controller) commands
acceleration and steering rate to a kinematic bicycle at the rear axle (Euler steps, 0.2 s / 0.05 s
first-order lags on acceleration / steering, steering <= 60 deg). Its state carries no lateral
acceleration (NAVSIM's neither), so the lateral-acceleration bound never fails there either.

Where this differs from NAVSIM, and why:

- **Geometry from the caller, not a map**: the drivable area and the lanes are polygons or
  corridors (a centre line + a width, :meth:`Area.corridor`) instead of nuPlan map layers; with
  no lanes given the ego never "straddles lanes", with no intersections it is never in one.
  Progress is measured along the given centre line (NAVSIM: the route's lane centre line).
- **The ego**: the demo world's car (:data:`~wam_diff2_core.geometry.DEMO_EGO_BOX`, wheelbase
  2.8 m) instead of nuPlan's Chrysler Pacifica; any :class:`~wam_diff2_core.geometry.VehicleBox`
  and wheelbase can be given.
- **Headings**: the model's plans have none (NAVSIM's carry one per pose); each waypoint gets the
  path's tangent estimated from the chords around it (:func:`plan_headings`). The chord into a
  waypoint alone lags the tangent by half a step's turn, and NAVSIM's tracker, which weighs heading
  error 10 x lateral error, then cuts the demo world's tight crossing turns off the road.
- **The reference**: NAVSIM's is PDM-Closed's trajectory; here it is any rule-based planner's
  progress (x its NC x DAC), given as ``reference_progress_m`` (:func:`reference_progress` scores a
  reference plan through this same pipeline).
- **Smoothing for comfort**: nuPlan's Savitzky-Golay filters (scipy's ``savgol_filter``, not a
  dependency here) are computed with numpy as the local least-squares polynomial fits they are, with
  the same windows, orders and edge handling (the even 8-sample window read half a sample late, as
  scipy reads it).
- **Agents** are boxes every 0.1 s for 5 s (NAVSIM's observation horizon); an agent's speed at
  t = 0 comes from its first two positions.

    scene = PdmScene(centreline=np.array([[-50.0, 0.0], [200.0, 0.0]]),
                     drivable=Area.corridor([[-50.0, 0.0], [200.0, 0.0]], width_m=7.0),
                     agents=[AgentTrack.moving(x=30.0, y=0.0, yaw=0.0, speed_mps=0.0)])
    result = pdm_score(plan, EgoStart(speed_mps=8.0), scene, reference_progress_m=32.0)
    result.pdms, result.nc, result.as_dict()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .geometry import DEMO_EGO_BOX, DEMO_EGO_WHEELBASE_M, VehicleBox, box_corners, boxes_overlap, path_headings
from .outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S

# ----------------------------------------------------------------------------- NAVSIM v1.1's constants
# navsim/planning/script/config/pdm_scoring/default_scoring_parameters.yaml (proposal_sampling)
SIM_DT_S = 0.1                               # interval_length
SIM_STEPS = 40                               # num_poses: 4 s
# pdm_scorer.py PDMScorerConfig (the same defaults in default_scoring_parameters.yaml)
EP_WEIGHT, TTC_WEIGHT, COMFORT_WEIGHT = 5.0, 5.0, 2.0
PROGRESS_DISTANCE_THRESHOLD_M = 5.0          # below it for both plans, EP = 1
TTC_STOPPED_SPEED_MPS = 5e-3                 # a slower ego has no TTC infraction
TTC_PROJECTION_STEPS = (0, 3, 6, 9)          # pdm_scorer._calculate_ttc: np.arange(0, 10, 3) x 0.1 s
STATIC_OBJECT_NC = 0.5                       # at fault against a non-agent object (AGENT_TYPES: 0)
# pdm_scorer_utils.get_collision_type and nuPlan's idm/utils.py (is_track_stopped, is_agent_ahead / _behind)
COLLISION_STOPPED_SPEED_MPS = 5e-2
AGENT_AHEAD_DEG = 30.0
AGENT_BEHIND_DEG = 150.0
# metric_cache_processor.py: the observation spans 5 s at 0.1 s; TTC looks up to 0.9 s past the 4 s
OBSERVATION_SAMPLES = SIM_STEPS + TTC_PROJECTION_STEPS[-1] + 1      # 50 boxes: 0 ... 4.9 s
# pdm_comfort_metrics.py (nuPlan's comfort bounds)
MAX_LON_ACCEL_MPS2, MIN_LON_ACCEL_MPS2 = 2.40, -4.05
MAX_ABS_LAT_ACCEL_MPS2 = 4.89
MAX_ABS_JERK_MPS3 = 8.37
MAX_ABS_LON_JERK_MPS3 = 4.13
MAX_ABS_YAW_ACCEL_RPS2 = 1.93
MAX_ABS_YAW_RATE_RPS = 0.95
ACCEL_SMOOTHING_WINDOW = 8                   # _extract_ego_acceleration's default window (jerk's input)
YAW_WINDOW = 5                               # _approximate_derivatives' default window (yaw rate, yaw accel)
# batch_kinematic_bicycle.py
MAX_STEERING_RAD = math.pi / 3
ACCEL_TIME_CONSTANT_S = 0.2
STEERING_TIME_CONSTANT_S = 0.05
# batch_lqr.py BatchLQRTracker defaults
LQR_Q_LONGITUDINAL, LQR_R_LONGITUDINAL = 10.0, 1.0
LQR_Q_LATERAL = (1.0, 10.0, 0.0)             # lateral error, heading error, steering angle
LQR_R_LATERAL = 1.0
LQR_HORIZON_STEPS = 10
LQR_JERK_PENALTY = 1e-4
LQR_CURVATURE_RATE_PENALTY = 1e-2
LQR_INITIAL_CURVATURE_PENALTY = 1e-10        # batch_lqr_utils.py
STOPPING_GAIN = 0.5
STOPPING_SPEED_MPS = 0.2

AGENT_KINDS = ("vehicle", "pedestrian", "bicycle")   # nuPlan's AGENT_TYPES: NC 0
OBJECT_KINDS = AGENT_KINDS + ("static",)             # anything else (cones, barriers, ...): NC 0.5


# ----------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class EgoStart:
    """The ego at the plan's stamp: speed along its heading (m/s), longitudinal acceleration (m/s^2),
    front-wheel steering angle (rad, + left). Its pose is the ego frame's origin."""

    speed_mps: float
    acceleration_mps2: float = 0.0
    steering_angle_rad: float = 0.0

    def __post_init__(self):
        values = (self.speed_mps, self.acceleration_mps2, self.steering_angle_rad)
        if not all(math.isfinite(float(v)) for v in values):
            raise ValueError(f"EgoStart must be finite: speed_mps={self.speed_mps}, "
                             f"acceleration_mps2={self.acceleration_mps2}, "
                             f"steering_angle_rad={self.steering_angle_rad}")


@dataclass(frozen=True)
class Vehicle:
    """The ego's box around its rear axle and its wheelbase (default: the demo world's car)."""

    box: VehicleBox = DEMO_EGO_BOX
    wheelbase_m: float = DEMO_EGO_WHEELBASE_M

    def corners(self, x: np.ndarray, y: np.ndarray, heading: np.ndarray) -> np.ndarray:
        """[T, 4, 2] box corners (front left, rear left, rear right, front right) for rear-axle poses [T]."""
        c = self.box.centre_from_axle_m
        return np.stack([box_corners(px + c * math.cos(h), py + c * math.sin(h), h, self.box.length_m,
                                     self.box.width_m) for px, py, h in zip(x, y, heading)])

    def centres(self, x: np.ndarray, y: np.ndarray, heading: np.ndarray) -> np.ndarray:
        """[T, 2] box centres for rear-axle poses [T]."""
        c = self.box.centre_from_axle_m
        return np.stack([x + c * np.cos(heading), y + c * np.sin(heading)], axis=-1)


@dataclass(frozen=True)
class AgentTrack:
    """One non-reactive agent: its box every :data:`SIM_DT_S` from the plan's stamp, in the ego frame
    at that stamp. ``xy`` [T, 2] box centres (m), ``yaw`` [T] (rad), T >= :data:`OBSERVATION_SAMPLES`;
    ``kind``: one of :data:`OBJECT_KINDS` ("static": not an agent, NC 0.5 when hit)."""

    xy: np.ndarray
    yaw: np.ndarray
    length_m: float = 4.5
    width_m: float = 1.85
    kind: str = "vehicle"
    name: str = ""

    def __post_init__(self):
        xy = np.asarray(self.xy, dtype=np.float64)
        yaw = np.asarray(self.yaw, dtype=np.float64)
        label = f"agent {self.name!r}" if self.name else "agent"
        if xy.ndim != 2 or xy.shape[1] != 2 or yaw.shape != (len(xy),):
            raise ValueError(f"{label}: xy must be [T, 2] and yaw [T], got {xy.shape} and {yaw.shape}")
        if len(xy) < OBSERVATION_SAMPLES:
            raise ValueError(f"{label}: {len(xy)} boxes; the score needs {OBSERVATION_SAMPLES} "
                             f"(every {SIM_DT_S} s from 0 to {(OBSERVATION_SAMPLES - 1) * SIM_DT_S:.1f} s)")
        if not (np.isfinite(xy).all() and np.isfinite(yaw).all()):
            raise ValueError(f"{label}: xy and yaw must be finite")
        if not (self.length_m > 0 and self.width_m > 0):
            raise ValueError(f"{label}: length_m and width_m must be > 0, got {self.length_m}, {self.width_m}")
        if self.kind not in OBJECT_KINDS:
            raise ValueError(f"{label}: kind {self.kind!r} is not one of {', '.join(OBJECT_KINDS)}")
        object.__setattr__(self, "xy", xy)
        object.__setattr__(self, "yaw", yaw)

    @classmethod
    def moving(cls, x: float, y: float, yaw: float, speed_mps: float, acceleration_mps2: float = 0.0,
               **kw) -> "AgentTrack":
        """Straight along ``yaw`` from (x, y) at ``speed_mps``, accelerating at ``acceleration_mps2``
        until it stands (it never reverses); speed 0: parked."""
        t = np.arange(OBSERVATION_SAMPLES) * SIM_DT_S
        if acceleration_mps2 < 0 and speed_mps > 0:
            stop_s = speed_mps / -acceleration_mps2
            t = np.minimum(t, stop_s)
        distance = speed_mps * t + 0.5 * acceleration_mps2 * t * t
        direction = np.array([math.cos(yaw), math.sin(yaw)])
        return cls(xy=np.array([x, y]) + distance[:, None] * direction, yaw=np.full(len(t), float(yaw)), **kw)

    @property
    def initial_speed_mps(self) -> float:
        """Speed at t = 0 from the first two boxes (what NAVSIM's collision type reads)."""
        return float(np.hypot(*(self.xy[1] - self.xy[0]))) / SIM_DT_S

    def corners(self, index: int) -> np.ndarray:
        """[4, 2] the box at step ``index``."""
        return box_corners(self.xy[index, 0], self.xy[index, 1], self.yaw[index], self.length_m, self.width_m)


def _inside_polygon(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """[N] even-odd rule: which of ``points`` [N, 2] lie inside the simple ``polygon`` [K, 2]."""
    x, y = points[:, 0:1], points[:, 1:2]                                     # [N, 1]
    x0, y0 = polygon[:, 0], polygon[:, 1]                                     # [K]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    straddles = (y0 > y) != (y1 > y)                                          # [N, K]
    dy = np.where(straddles, y1 - y0, 1.0)
    crossing_x = x0 + (x1 - x0) * (y - y0) / dy
    return ((straddles & (x < crossing_x)).sum(axis=1) % 2) == 1


def _distance_to_polyline(points: np.ndarray, line: np.ndarray) -> np.ndarray:
    """[N] distance of ``points`` [N, 2] to the polyline ``line`` [M, 2]."""
    start, seg = line[:-1], np.diff(line, axis=0)                            # [M-1, 2]
    length2 = np.maximum((seg * seg).sum(axis=1), 1e-12)
    rel = points[:, None, :] - start[None]                                    # [N, M-1, 2]
    t = np.clip((rel * seg[None]).sum(-1) / length2, 0.0, 1.0)
    return np.hypot(*(rel - t[..., None] * seg[None]).transpose(2, 0, 1)).min(axis=1)


def _polyline(points, what: str) -> np.ndarray:
    line = np.asarray(points, dtype=np.float64)
    if line.ndim != 2 or line.shape[1] != 2 or len(line) < 2 or not np.isfinite(line).all():
        raise ValueError(f"{what} must be >= 2 finite points [N, 2], got shape {line.shape}")
    return line


@dataclass(frozen=True)
class Area:
    """A region of the ground in the ego frame: a union of simple polygons ([K, 2] vertices) and
    corridors (a centre line [N, 2] and a half width, m)."""

    polygons: tuple[np.ndarray, ...] = ()
    corridors: tuple[tuple[np.ndarray, float], ...] = ()

    @classmethod
    def polygon(cls, vertices) -> "Area":
        poly = _polyline(vertices, "a polygon")
        if len(poly) < 3:
            raise ValueError(f"a polygon needs >= 3 vertices, got {len(poly)}")
        return cls(polygons=(poly,))

    @classmethod
    def corridor(cls, centreline, width_m: float) -> "Area":
        """Every point within ``width_m / 2`` of the centre line (a route and a lane width when no map is known)."""
        if not (math.isfinite(width_m) and width_m > 0):
            raise ValueError(f"corridor width_m must be > 0, got {width_m}")
        return cls(corridors=((_polyline(centreline, "a corridor's centre line"), width_m / 2.0),))

    def __or__(self, other: "Area") -> "Area":
        return Area(self.polygons + other.polygons, self.corridors + other.corridors)

    def contains(self, points: np.ndarray) -> np.ndarray:
        """[N] whether each of ``points`` [N, 2] lies in the area."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        inside = np.zeros(len(points), dtype=bool)
        for poly in self.polygons:
            inside |= _inside_polygon(points, poly)
        for line, half_width in self.corridors:
            inside |= _distance_to_polyline(points, line) <= half_width
        return inside


@dataclass(frozen=True)
class PdmScene:
    """What the plan is scored against, in the ego frame at the plan's stamp.

    ``centreline`` [N, 2]: the route's centre line (progress is measured along it, in its point order);
    ``drivable``: the drivable area; ``agents``: the other road users and objects; ``lanes``: lane
    areas (an ego box with corners in two lanes and wholly in none "straddles lanes": lateral hits are
    then its fault); ``intersections``: where TTC counts agents beside the ego too."""

    centreline: np.ndarray
    drivable: Area
    agents: Sequence[AgentTrack] = ()
    lanes: Sequence[Area] = ()
    intersections: Area = field(default_factory=Area)

    def __post_init__(self):
        object.__setattr__(self, "centreline", _polyline(self.centreline, "PdmScene.centreline"))
        object.__setattr__(self, "agents", tuple(self.agents))
        object.__setattr__(self, "lanes", tuple(self.lanes))


# ----------------------------------------------------------------------------- tracking
@dataclass(frozen=True)
class EgoRollout:
    """The tracked ego every :data:`SIM_DT_S` from 0 to 4 s ([41] each), rear axle, ego frame at t = 0."""

    t_s: np.ndarray
    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    speed: np.ndarray           # m/s along the heading
    acceleration: np.ndarray    # m/s^2, longitudinal (the model has no lateral one)
    steering: np.ndarray        # rad


def check_plan(plan) -> np.ndarray:
    """``plan`` as [8, 2] float64; ValueError naming what is wrong with it."""
    points = np.asarray(plan, dtype=np.float64)
    if points.shape != (NUM_WAYPOINTS, 2):
        raise ValueError(f"plan must be [{NUM_WAYPOINTS}, 2] waypoints (0.5 ... 4.0 s, metres), "
                         f"got shape {points.shape}")
    bad = ~np.isfinite(points).all(axis=1)
    if bad.any():
        raise ValueError(f"plan waypoints must be finite; waypoint(s) {np.flatnonzero(bad).tolist()} are not: "
                         f"{points[bad].tolist()}")
    return points


def plan_headings(plan: np.ndarray) -> np.ndarray:
    """[8] a heading for each waypoint (the model gives none): the path's tangent, estimated as the mean
    direction of the chords before and after it (the origin, heading 0, before the first), the last one
    turned on by half the last change of chord direction; exact on a straight line and on a circular
    arc. A repeated point keeps the heading before it."""
    chords = np.unwrap(path_headings(plan))                                   # [8] direction into each waypoint
    headings = np.empty(NUM_WAYPOINTS)
    headings[:-1] = (chords[:-1] + chords[1:]) / 2.0
    headings[-1] = chords[-1] + (chords[-1] - chords[-2]) / 2.0
    return headings


def reference_poses(plan: np.ndarray) -> np.ndarray:
    """[41, 3] (x, y, heading) every 0.1 s: the ego at the origin (heading 0), then the waypoints
    (:func:`plan_headings`), interpolated linearly (heading unwrapped), as NAVSIM interpolates a plan
    before tracking it."""
    points = np.vstack([[0.0, 0.0], plan])                                    # [9, 2]
    headings = np.unwrap(np.concatenate([[0.0], plan_headings(plan)]))        # [9]
    times = np.arange(NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    t = np.arange(SIM_STEPS + 1) * SIM_DT_S
    return np.stack([np.interp(t, times, points[:, 0]), np.interp(t, times, points[:, 1]),
                     np.interp(t, times, headings)], axis=1)


def _wrap(angle):
    return (np.asarray(angle) + np.pi) % (2.0 * np.pi) - np.pi


def speed_and_curvature_profiles(poses: np.ndarray, dt: float = SIM_DT_S) -> tuple[np.ndarray, np.ndarray]:
    """([M] speed, [M] curvature) of the M steps between ``poses`` [M + 1, 3], by nuPlan's regularised
    least squares: each displacement = dt x speed x (cos, sin)(heading) with speed = v0 + integrated
    accelerations (penalised by the "jerk" penalty), each heading change = dt x speed x curvature with
    curvature = k0 + integrated curvature rates (penalised)."""
    steps = np.diff(poses, axis=0)                                            # [M, 3]
    m = len(steps)
    heading = poses[:-1, 2]
    direction = np.stack([np.cos(heading), np.sin(heading)], axis=1)         # [M, 2]
    # unknowns (v0, a_0 ... a_{M-2}): displacement_k = dt * (v0 + dt * sum_{j<k} a_j) * direction_k;
    # coefficients [M, M] maps them to the speeds v_k
    coefficients = np.concatenate([np.ones((m, 1)), dt * np.tri(m, m - 1, k=-1)], axis=1)
    a = (dt * coefficients[:, None, :] * direction[:, :, None]).reshape(2 * m, m)
    # nuPlan's "jerk" regulariser as it is built (batch_lqr_utils._make_banded_difference_matrix writes the
    # -1 band over the +1 band): it penalises a_0 ... a_{M-3} themselves and only the last difference
    # a_{M-2} - a_{M-3}; NAVSIM's scores were computed with it, so it is kept
    jerk = np.zeros((m - 2, m))
    jerk[np.arange(m - 2), np.arange(1, m - 1)] = -1.0
    jerk[m - 3, m - 1] = 1.0
    solution = np.linalg.pinv(a.T @ a + LQR_JERK_PENALTY * jerk.T @ jerk) @ a.T @ steps[:, :2].reshape(-1)
    speed = coefficients @ solution                                           # [M]
    # unknowns (k0, rate_0 ... rate_{M-2}): heading change_k = dt * speed_k * (k0 + dt * sum_{j<k} rate_j)
    c = dt * speed[:, None] * coefficients
    penalty = LQR_CURVATURE_RATE_PENALTY * np.eye(m)
    penalty[0, 0] = LQR_INITIAL_CURVATURE_PENALTY
    solution = np.linalg.pinv(c.T @ c + penalty) @ c.T @ _wrap(steps[:, 2])
    return speed, coefficients @ solution


def _lqr_step(state: np.ndarray, reference: np.ndarray, speed_profile: np.ndarray, curvature_profile: np.ndarray,
              index: int, wheelbase_m: float) -> tuple[float, float]:
    """(acceleration, steering rate) commanded at step ``index`` from ``state`` (x, y, heading, v, a, steering)."""
    x, y, heading, v, _, steering = state
    rx, ry, rh = reference[index]
    lateral = -(x - rx) * math.sin(rh) + (y - ry) * math.cos(rh)
    target = min(index + LQR_HORIZON_STEPS, len(speed_profile) - 1)
    v_ref = float(speed_profile[target])
    if v_ref <= STOPPING_SPEED_MPS and v <= STOPPING_SPEED_MPS:
        return -STOPPING_GAIN * (v - v_ref), 0.0
    # longitudinal: the acceleration held over the horizon that best reaches v_ref at its end
    b = LQR_HORIZON_STEPS * SIM_DT_S
    accel = -b * LQR_Q_LONGITUDINAL * (v - v_ref) / (b * LQR_Q_LONGITUDINAL * b + LQR_R_LONGITUDINAL)
    # lateral: linearised (lateral error, heading error, steering) over the horizon at the speeds this
    # acceleration gives and the reference's curvatures; one steering rate held over it
    curvature = np.full(LQR_HORIZON_STEPS, curvature_profile[target])
    curvature[:target - index] = curvature_profile[index:target]
    speeds = v + accel * SIM_DT_S * np.arange(LQR_HORIZON_STEPS)
    a_total, b_total, g_total = np.eye(3), np.zeros(3), np.zeros(3)
    for v_k, k_k in zip(speeds, curvature):
        step = np.eye(3)
        step[0, 1] = v_k * SIM_DT_S
        step[1, 2] = v_k * SIM_DT_S / wheelbase_m
        a_total = step @ a_total
        b_total = step @ b_total + np.array([0.0, 0.0, SIM_DT_S])
        g_total = step @ g_total + np.array([0.0, -v_k * k_k * SIM_DT_S, 0.0])
    error = a_total @ np.array([lateral, _wrap(heading - rh), steering]) + g_total
    error[1:] = _wrap(error[1:])
    q = np.diag(LQR_Q_LATERAL)
    rate = -(b_total @ q @ error) / (b_total @ q @ b_total + LQR_R_LATERAL)
    return float(accel), float(rate)


def track_plan(plan, ego: EgoStart, vehicle: Vehicle = Vehicle()) -> EgoRollout:
    """The ego driving ``plan`` [8, 2] for 4 s: NAVSIM's LQR tracker on its kinematic bicycle."""
    reference = reference_poses(check_plan(plan))
    speed_profile, curvature_profile = speed_and_curvature_profiles(reference)
    state = np.array([0.0, 0.0, 0.0, ego.speed_mps, ego.acceleration_mps2, ego.steering_angle_rad])
    states = [state]
    for index in range(SIM_STEPS):
        accel_cmd, rate_cmd = _lqr_step(state, reference, speed_profile, curvature_profile, index,
                                        vehicle.wheelbase_m)
        x, y, heading, v, accel, steering = state
        # first-order lags on the commands, then one Euler step from the current pose and steering
        accel = accel + SIM_DT_S / (SIM_DT_S + ACCEL_TIME_CONSTANT_S) * (accel_cmd - accel)
        wanted = steering + SIM_DT_S * rate_cmd
        new_steering = steering + SIM_DT_S / (SIM_DT_S + STEERING_TIME_CONSTANT_S) * (wanted - steering)
        state = np.array([x + v * math.cos(heading) * SIM_DT_S, y + v * math.sin(heading) * SIM_DT_S,
                          float(_wrap(heading + v * math.tan(steering) / vehicle.wheelbase_m * SIM_DT_S)),
                          v + accel * SIM_DT_S, accel,
                          min(max(new_steering, -MAX_STEERING_RAD), MAX_STEERING_RAD)])
        states.append(state)
    s = np.array(states)                                                      # [41, 6]
    return EgoRollout(np.arange(SIM_STEPS + 1) * SIM_DT_S, s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4], s[:, 5])


# ----------------------------------------------------------------------------- comfort
def _local_polynomial(y: np.ndarray, window: int, order: int, deriv: int, dt: float) -> np.ndarray:
    """[N] Savitzky-Golay as scipy's ``savgol_filter(mode="interp")`` computes it: the ``deriv``-th
    derivative of a degree-``order`` least-squares polynomial over ``window`` samples (at most N). Inside,
    the window is centred on sample i (an even window covers i - w/2 + 1 ... i + w/2 and is read half a
    sample after i, at its centre); within half a window of either end, the first / last window's fit is
    read at sample i itself."""
    n = len(y)
    window = min(window, n)
    half, centre = window // 2, (window - 1) / 2.0
    out = np.empty(n)
    for i in range(n):
        if half <= i < n - half:
            start = i - int(math.floor(centre))
            read_at = start + centre                                          # i, or i + 0.5 for an even window
        else:
            start, read_at = (0 if i < half else n - window), float(i)
        offsets = np.arange(start, start + window) - read_at                 # samples, 0 where it is read
        coefficients = np.linalg.lstsq(np.vander(offsets.astype(float), order + 1, increasing=True),
                                       y[start:start + window], rcond=None)[0]
        out[i] = math.factorial(deriv) * coefficients[deriv] / dt ** deriv if deriv <= order else 0.0
    return out


def comfort_checks(rollout: EgoRollout) -> dict[str, bool]:
    """nuPlan's six comfort checks on the tracked ego (each: every sample strictly within its bounds)."""
    n = len(rollout.t_s)
    lon = rollout.acceleration
    lat = np.zeros(n)                                                         # the model's state has none
    yaw = np.unwrap(rollout.heading)

    def within(values, low, high):
        return bool(((values > low) & (values < high)).all())

    smooth_lon = _local_polynomial(lon, ACCEL_SMOOTHING_WINDOW, 2, 0, SIM_DT_S)
    smooth_mag = _local_polynomial(np.hypot(lon, lat), ACCEL_SMOOTHING_WINDOW, 2, 0, SIM_DT_S)
    return {
        "lon_acceleration": within(_local_polynomial(lon, n, 2, 0, SIM_DT_S), MIN_LON_ACCEL_MPS2, MAX_LON_ACCEL_MPS2),
        "lat_acceleration": within(_local_polynomial(lat, n, 2, 0, SIM_DT_S), -MAX_ABS_LAT_ACCEL_MPS2,
                                   MAX_ABS_LAT_ACCEL_MPS2),
        "jerk": within(_local_polynomial(smooth_mag, n, 2, 1, SIM_DT_S), -MAX_ABS_JERK_MPS3, MAX_ABS_JERK_MPS3),
        "lon_jerk": within(_local_polynomial(smooth_lon, n, 2, 1, SIM_DT_S), -MAX_ABS_LON_JERK_MPS3,
                           MAX_ABS_LON_JERK_MPS3),
        "yaw_acceleration": within(_local_polynomial(yaw, YAW_WINDOW, 3, 2, SIM_DT_S), -MAX_ABS_YAW_ACCEL_RPS2,
                                   MAX_ABS_YAW_ACCEL_RPS2),
        "yaw_rate": within(_local_polynomial(yaw, YAW_WINDOW, 2, 1, SIM_DT_S), -MAX_ABS_YAW_RATE_RPS,
                           MAX_ABS_YAW_RATE_RPS),
    }


# ----------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class PdmResult:
    """Sub-scores and the score of one plan; ``progress_m`` is the raw progress (before NC x DAC);
    ``collision_time_s`` / ``ttc_time_s``: the first at-fault collision / TTC infraction (None: none)."""

    nc: float
    dac: float
    ttc: float
    ep: float
    c: float
    pdms: float
    progress_m: float
    reference_progress_m: float
    collision_time_s: float | None
    ttc_time_s: float | None
    comfort: dict[str, bool]
    rollout: EgoRollout

    @property
    def weighted_progress_m(self) -> float:
        """Progress x NC x DAC: what this plan offers as another plan's reference (NAVSIM scores PDM-Closed's
        proposals so, EP against the best of them)."""
        return self.progress_m * self.nc * self.dac

    def with_reference(self, reference_progress_m: float) -> "PdmResult":
        """This plan's score with another reference progress (EP and PDMS again; nothing is tracked again)."""
        if not (math.isfinite(reference_progress_m) and reference_progress_m >= 0):
            raise ValueError(f"reference_progress_m must be finite and >= 0, got {reference_progress_m}")
        return _combine(self.nc, self.dac, self.ttc, self.c, self.progress_m, float(reference_progress_m),
                        self.collision_time_s, self.ttc_time_s, self.comfort, self.rollout)

    def as_dict(self) -> dict:
        keys = ("nc", "dac", "ttc", "ep", "c", "pdms", "progress_m", "reference_progress_m", "collision_time_s",
                "ttc_time_s", "comfort")
        return {k: getattr(self, k) for k in keys}


def _relative_angle(pose: tuple[float, float, float], point: np.ndarray) -> float:
    """Angle (rad) between the pose's heading and the direction to ``point``; NaN when they coincide
    (nuPlan divides by the distance: such an agent is neither ahead nor behind)."""
    d = np.asarray(point) - pose[:2]
    norm = float(np.hypot(*d))
    if norm < 1e-9:
        return float("nan")
    return math.acos(min(max((math.cos(pose[2]) * d[0] + math.sin(pose[2]) * d[1]) / norm, -1.0), 1.0))


def _ego_areas(corners: np.ndarray, scene: PdmScene) -> tuple[np.ndarray, np.ndarray]:
    """([T] off the drivable area: a corner outside it, [T] straddling lanes) for ego corners [T, 4, 2]."""
    steps = len(corners)
    flat = corners.reshape(-1, 2)
    off_road = ~scene.drivable.contains(flat).reshape(steps, 4).all(axis=1)
    if not scene.lanes:
        return off_road, np.zeros(steps, dtype=bool)
    in_lane = np.stack([lane.contains(flat).reshape(steps, 4) for lane in scene.lanes], axis=1)   # [T, L, 4]
    corners_per_lane = in_lane.sum(axis=2)                                     # [T, L]
    straddling = ((corners_per_lane > 0).sum(axis=1) > 1) & (corners_per_lane != 4).all(axis=1)
    return off_road, straddling


def _near(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the circles around two boxes [4, 2] meet (a cheap test before the exact one)."""
    ca, cb = a.mean(axis=0), b.mean(axis=0)
    ra, rb = np.hypot(*(a - ca).T).max(), np.hypot(*(b - cb).T).max()
    return float(np.hypot(*(ca - cb))) <= ra + rb


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    return _near(a, b) and boxes_overlap(a, b)


def _progress_along(line: np.ndarray, point: np.ndarray) -> float:
    """Arc length (m) of the point of ``line`` [M, 2] closest to ``point``."""
    start, seg = line[:-1], np.diff(line, axis=0)
    length = np.hypot(*seg.T)
    t = np.clip(((point - start) * seg).sum(axis=1) / np.maximum(length ** 2, 1e-12), 0.0, 1.0)
    i = int(np.argmin(np.hypot(*(start + t[:, None] * seg - point).T)))
    return float(np.concatenate([[0.0], np.cumsum(length)])[i] + t[i] * length[i])


@dataclass(frozen=True)
class _Scored:
    nc: float
    dac: float
    ttc: float
    c: float
    progress_m: float
    collision_time_s: float | None
    ttc_time_s: float | None
    comfort: dict[str, bool]
    rollout: EgoRollout


def _score_rollout(rollout: EgoRollout, scene: PdmScene, vehicle: Vehicle) -> _Scored:
    corners = vehicle.corners(rollout.x, rollout.y, rollout.heading)           # [41, 4, 2]
    off_road, straddling = _ego_areas(corners, scene)
    in_intersection = scene.intersections.contains(np.stack([rollout.x, rollout.y], axis=1))
    agents = scene.agents
    already = {i for i, agent in enumerate(agents) if _overlaps(corners[0], agent.corners(0))}

    # NC: at-fault collisions
    nc, collision_step = 1.0, None
    excused = set(already)
    for step in range(SIM_STEPS + 1):
        pose = (rollout.x[step], rollout.y[step], rollout.heading[step])
        for i, agent in enumerate(agents):
            if i in excused or not _overlaps(corners[step], agent.corners(step)):
                continue
            centre = agent.xy[step]
            if abs(rollout.speed[step]) <= COLLISION_STOPPED_SPEED_MPS:
                at_fault = False                                               # the ego stood
            elif agent.initial_speed_mps <= COLLISION_STOPPED_SPEED_MPS:
                at_fault = True                                                # it stood
            elif _relative_angle(pose, centre) > math.radians(AGENT_BEHIND_DEG):
                at_fault = False                                               # hit from behind
            elif boxes_overlap(corners[step][[0, 3]], agent.corners(step)):
                at_fault = True                                                # the ego's front edge hit it
            else:                                                              # lateral
                at_fault = bool(straddling[step] or off_road[step])
            if at_fault:
                nc = min(nc, 0.0 if agent.kind in AGENT_KINDS else STATIC_OBJECT_NC)
                collision_step = step if collision_step is None else collision_step
            else:
                excused.add(i)

    # TTC: the ego box moved on at its speed for 0 ... 0.9 s against the agents then
    ttc, ttc_step = 1.0, None
    excused = set(already)
    for step in range(SIM_STEPS + 1):
        if abs(rollout.speed[step]) < TTC_STOPPED_SPEED_MPS or ttc_step is not None:
            continue
        pose = (rollout.x[step], rollout.y[step], rollout.heading[step])
        velocity = rollout.speed[step] * np.array([math.cos(pose[2]), math.sin(pose[2])])
        for ahead in TTC_PROJECTION_STEPS:
            moved = corners[step] + velocity * ahead * SIM_DT_S
            for i, agent in enumerate(agents):
                if i in excused or not _overlaps(moved, agent.corners(step + ahead)):
                    continue
                angle = _relative_angle(pose, agent.xy[step + ahead])
                exposed = straddling[step] or off_road[step] or in_intersection[step]
                if angle < math.radians(AGENT_AHEAD_DEG) or (exposed and not angle > math.radians(AGENT_BEHIND_DEG)):
                    ttc, ttc_step = 0.0, step
                else:
                    excused.add(i)

    dac = 0.0 if off_road.any() else 1.0
    centres = vehicle.centres(rollout.x, rollout.y, rollout.heading)
    progress = max(0.0, _progress_along(scene.centreline, centres[-1]) - _progress_along(scene.centreline, centres[0]))
    comfort = comfort_checks(rollout)
    return _Scored(nc, dac, ttc, 1.0 if all(comfort.values()) else 0.0, progress,
                   None if collision_step is None else collision_step * SIM_DT_S,
                   None if ttc_step is None else ttc_step * SIM_DT_S, comfort, rollout)


def reference_progress(reference_plan, ego: EgoStart, scene: PdmScene, vehicle: Vehicle = Vehicle()) -> float:
    """A rule-based reference planner's plan scored as NAVSIM scores PDM-Closed's: its progress (m)
    x its NC x its DAC, the ``reference_progress_m`` of :func:`pdm_score`."""
    scored = _score_rollout(track_plan(reference_plan, ego, vehicle), scene, vehicle)
    return scored.progress_m * scored.nc * scored.dac


def pdm_score(plan, ego: EgoStart, scene: PdmScene, reference_progress_m: float,
              vehicle: Vehicle = Vehicle()) -> PdmResult:
    """Track ``plan`` [8, 2] for 4 s and score it (module docstring). ``reference_progress_m``: the
    reference planner's progress x its NC x DAC (:func:`reference_progress`). ValueError on a plan that
    is not 8 finite waypoints or a reference progress that is negative or not finite."""
    if not (math.isfinite(reference_progress_m) and reference_progress_m >= 0):
        raise ValueError(f"reference_progress_m must be finite and >= 0, got {reference_progress_m}")
    scored = _score_rollout(track_plan(plan, ego, vehicle), scene, vehicle)
    return _combine(scored.nc, scored.dac, scored.ttc, scored.c, scored.progress_m, float(reference_progress_m),
                    scored.collision_time_s, scored.ttc_time_s, scored.comfort, scored.rollout)


def _combine(nc: float, dac: float, ttc: float, c: float, progress_m: float, reference_progress_m: float,
             collision_time_s, ttc_time_s, comfort: dict[str, bool], rollout: EgoRollout) -> PdmResult:
    """EP against the reference, and PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12."""
    multiplier = nc * dac
    progress = progress_m * multiplier
    best = max(progress, reference_progress_m)
    if best > PROGRESS_DISTANCE_THRESHOLD_M:
        ep = progress / best
    else:
        ep = 1.0 if multiplier > 0 else 0.0
    weighted = (EP_WEIGHT * ep + TTC_WEIGHT * ttc + COMFORT_WEIGHT * c) / (EP_WEIGHT + TTC_WEIGHT + COMFORT_WEIGHT)
    return PdmResult(nc, dac, ttc, ep, c, multiplier * weighted, progress_m, reference_progress_m,
                     collision_time_s, ttc_time_s, comfort, rollout)


__all__ = ["Area", "AgentTrack", "EgoRollout", "EgoStart", "PdmResult", "PdmScene", "Vehicle", "check_plan",
           "comfort_checks", "pdm_score", "plan_headings", "reference_poses", "reference_progress",
           "speed_and_curvature_profiles", "track_plan", "SIM_DT_S", "SIM_STEPS", "OBSERVATION_SAMPLES",
           "AGENT_KINDS", "OBJECT_KINDS"]
