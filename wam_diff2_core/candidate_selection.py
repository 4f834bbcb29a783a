"""Choose among N candidate plans by their PDM score (NAVSIM v1, :mod:`~wam_diff2_core.pdm.score`), online
(wam_diff2_ros/README.md, "Candidate selection"): the planner decodes N plans of a frame in one batch and
keeps the one scored best against a scene built only from what it knows then (no recorded future, no map):

- **the ego**: its speed, longitudinal acceleration and the steering angle of its yaw rate (0 below
  :data:`STEERING_MIN_SPEED_MPS`), the demo world's car;
- **the drivable area**: a ``lane_width_m`` corridor around the route (:func:`corridor_line`), along which
  progress is measured; without a route, a square :data:`NO_ROUTE_HALF_SIZE_M` around the ego (DAC never
  fails) and progress along the ego's heading;
- **agents**: the tracked objects moved on at constant velocity from their message's stamp;
- **the reference progress** (EP's denominator, ``progress_reference``): ``best``, the best progress x NC x DAC
  among the candidates (as PDM-Closed scores its proposals), or ``first``, the greedy row 1's (``best`` when it
  did not parse or offers none): a candidate then gains only by being safer or smoother, not faster.

The highest PDMS wins, the earliest candidate on ties (row 1, the greedy decode).

    scene = online_scene(ego_xy=(x, y), ego_yaw=yaw, speed_mps=v, acceleration_mps2=a, yaw_rate_rps=w,
                         route_xy=route, objects=[TrackedObject(x=..., y=..., yaw=..., vx=..., vy=...)])
    selection = scene.select([plan_a, None, plan_c])      # None: a candidate that did not parse
    selection.index, selection.best.pdms, selection.valid
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from .frame_inputs import NS_PER_S, stamp_ns
from .geometry import wrap_angle, world_to_ego, yaw_from_quaternion
from .outputs.prompts import WAYPOINT_DT_S
from .pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S, TTC_PROJECTION_STEPS, AgentTrack, Area, EgoStart, PdmScene, Vehicle
from .pdm.score import PdmResult, pdm_score
from .pdm.tracking import MAX_STEERING_RAD
from .utils.fields import setting

DEFAULT_LANE_WIDTH_M = 3.5     # the drivable corridor's width around the route (planner: candidates.lane_width_m)
CORRIDOR_BEHIND_M = 30.0       # centre line kept behind the ego (progress is clipped at 0 anyway)
CORRIDOR_AHEAD_M = 200.0       # ... and ahead: more than 4 s at 40 m/s plus the ego's length
CORRIDOR_SPACING_M = 0.5       # centre-line points closer than this to the previous kept one are dropped
STEERING_MIN_SPEED_MPS = 0.5   # slower: the ego's steering angle is taken as 0 (yaw rate / speed is noise)
NO_ROUTE_HALF_SIZE_M = 1000.0  # without a route: the drivable area is this square around the ego
MAX_CANDIDATES = 16            # rows of one batched decode
OBJECTS_MAX_AGE_S = 1.0        # an objects message older than this at the frame is not used (nothing is tracked)
BOX, CYLINDER = 1, 3           # shape_msgs/SolidPrimitive types of derived_object_msgs/Object
PROGRESS_REFERENCES = ("best", "first")   # EP's reference progress among the candidates (module docstring)
DEFAULT_PROGRESS_REFERENCE = "best"
TRACKING_MARGIN_M = 5.0        # the tracked ego stays this close to its plan's line (agents farther are not scored)


@dataclass(frozen=True)
class CandidateSettings:
    """How many candidate plans a frame decodes (1: no selection) and how rows 2..N sample (row 1 decodes with the
    decoding settings), the online corridor's width and EP's reference among the candidates (the fields' help)."""

    count: int = setting(1, "plan candidates per frame, decoded in one batch: the first with the decoding settings "
                         "(greedy), the others sampled (candidates.temperature / top_p); the one the online PDM score "
                         "rates best is published (route corridor, tracked objects from ~/input/objects at constant "
                         "velocity); 1 = no selection", low=1, high=MAX_CANDIDATES)
    temperature: float = setting(1.0, "sampling temperature of candidates 2..N", low=1e-3, high=100.0)
    top_p: float = setting(1.0, "nucleus top-p of candidates 2..N", low=1e-3, high=1.0)
    seed: int = setting(0, "candidate row r draws from a generator seeded seed + r each frame", low=0, high=2**31 - 1)
    lane_width_m: float = setting(DEFAULT_LANE_WIDTH_M, "width of the drivable corridor around the route that "
                                  "candidates are scored in (metres; no map)", low=0.5, high=100.0)
    progress_reference: str = setting(DEFAULT_PROGRESS_REFERENCE, "ego progress (EP) of each candidate against: "
                                      "best = the best candidate's progress (as PDM-Closed), first = the greedy first "
                                      "candidate's (no gain for planning faster than it)", choices=PROGRESS_REFERENCES)

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_CANDIDATES:
            raise ValueError(f"candidates: must be an integer from 1 to {MAX_CANDIDATES}, got {self.count!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"candidate temperature: must be > 0 (rows 2..N sample), got {self.temperature!r}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"candidate top_p: must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"candidate seed: must be an integer >= 0, got {self.seed!r}")
        check_lane_width(self.lane_width_m)
        check_progress_reference(self.progress_reference)


def check_lane_width(lane_width_m: float) -> float:
    """``lane_width_m`` as a float; ValueError naming it unless finite and > 0."""
    if not (isinstance(lane_width_m, (int, float)) and math.isfinite(lane_width_m) and lane_width_m > 0):
        raise ValueError(f"lane_width_m (--lane-width-m): must be a finite width > 0 in metres, got {lane_width_m!r}")
    return float(lane_width_m)


def check_progress_reference(progress_reference: str) -> str:
    """``progress_reference`` itself; ValueError naming it unless one of :data:`PROGRESS_REFERENCES`."""
    if progress_reference not in PROGRESS_REFERENCES:
        raise ValueError(f"progress_reference: one of {', '.join(PROGRESS_REFERENCES)}, got {progress_reference!r}")
    return progress_reference


def corridor_line(points: np.ndarray, anchor: int, yaw: float) -> np.ndarray:
    """``points`` [N, 2] from :data:`CORRIDOR_BEHIND_M` before point ``anchor`` to :data:`CORRIDOR_AHEAD_M` after,
    thinned to :data:`CORRIDOR_SPACING_M`; where it ends sooner it goes on straight along its first / last
    segment (along ``yaw``, the ego's heading, where the stretch has no length: a drive standing still)."""
    s = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(points, axis=0).T))])
    window = (s >= s[anchor] - CORRIDOR_BEHIND_M) & (s <= s[anchor] + CORRIDOR_AHEAD_M)
    line, s_line = points[window], s[window]
    keep = np.concatenate([[True], np.diff(np.floor(s_line / CORRIDOR_SPACING_M)) > 0])
    keep[-1] = True
    line, s_line = line[keep], s_line[keep]
    steps = np.diff(line, axis=0)
    moving = np.flatnonzero(np.hypot(*steps.T) > 1e-6) if len(steps) else np.zeros(0, dtype=int)
    heading = np.array([math.cos(yaw), math.sin(yaw)])
    first, last = (steps[moving[0]], steps[moving[-1]]) if len(moving) else (heading, heading)
    behind = max(0.0, CORRIDOR_BEHIND_M - (s[anchor] - s_line[0]))
    ahead = max(0.0, CORRIDOR_AHEAD_M - (s_line[-1] - s[anchor]))
    return np.vstack([line[0] - behind * first / np.hypot(*first), line, line[-1] + ahead * last / np.hypot(*last)])


def ego_start(speed_mps: float, acceleration_mps2: float, yaw_rate_rps: float,
              vehicle: Vehicle = Vehicle()) -> EgoStart:
    """The ego's start for the tracker: the steering angle of a kinematic bicycle turning at ``yaw_rate_rps``
    (0 below :data:`STEERING_MIN_SPEED_MPS`, clipped to the steering limit)."""
    speed = float(speed_mps)
    steering = math.atan(vehicle.wheelbase_m * yaw_rate_rps / speed) if abs(speed) > STEERING_MIN_SPEED_MPS else 0.0
    return EgoStart(speed, float(acceleration_mps2), min(max(steering, -MAX_STEERING_RAD), MAX_STEERING_RAD))


@dataclass(frozen=True)
class TrackedObject:
    """An object as last measured, in the odometry frame: box centre (m), heading (rad), velocity (m/s),
    size (m), ``age_s``: how long before the frame it was measured (it is moved on by that much first)."""

    x: float
    y: float
    yaw: float
    vx: float = 0.0
    vy: float = 0.0
    length_m: float = AgentTrack.length_m      # the PDM agent's default box
    width_m: float = AgentTrack.width_m
    age_s: float = 0.0
    kind: str = "vehicle"
    name: str = ""

    def __post_init__(self):
        values = (self.x, self.y, self.yaw, self.vx, self.vy, self.age_s)
        if not all(math.isfinite(float(v)) for v in values):
            raise ValueError(f"tracked object {self.name!r}: pose, velocity and age must be finite, got "
                             f"x={self.x}, y={self.y}, yaw={self.yaw}, vx={self.vx}, vy={self.vy}, age_s={self.age_s}")

    def agent(self, origin, yaw: float) -> AgentTrack:
        """Its box every 0.1 s for 5 s from the frame, at constant velocity, in the ego frame at (origin, yaw)."""
        t = self.age_s + np.arange(OBSERVATION_SAMPLES) * SIM_DT_S
        xy = np.array([self.x, self.y]) + t[:, None] * np.array([self.vx, self.vy])
        return AgentTrack(xy=world_to_ego(xy, origin, yaw), yaw=np.full(len(t), wrap_angle(self.yaw - yaw)),
                          length_m=float(self.length_m), width_m=float(self.width_m), kind=self.kind,
                          name=self.name)


def object_ground_box(obj) -> tuple[float, float, float, float, float, float] | None:
    """A ``derived_object_msgs/Object`` (read by attribute: a live message or a bag's) as (x, y, yaw, length,
    width, height) on the ground: BOX dimensions are [length, width, height], a CYLINDER [height, radius] is a
    2r square; None for another shape or a non-finite / empty box (height NaN when a BOX gives none)."""
    dims = [float(d) for d in obj.shape.dimensions]
    if obj.shape.type == BOX and len(dims) >= 2:
        length, width, height = dims[0], dims[1], dims[2] if len(dims) >= 3 else math.nan
    elif obj.shape.type == CYLINDER and len(dims) >= 2:
        length, width, height = 2.0 * dims[1], 2.0 * dims[1], dims[0]
    else:
        return None
    p, q = obj.pose.position, obj.pose.orientation
    row = (float(p.x), float(p.y), yaw_from_quaternion(q.x, q.y, q.z, q.w), length, width)
    if not all(math.isfinite(v) for v in row) or length <= 0 or width <= 0:
        return None
    return (*row, height)


def tracked_objects_from_msg(msg, t_ns: int) -> list[TrackedObject]:
    """An ``ObjectArray``'s objects (pose and twist in its frame) as :class:`TrackedObject` for a frame at ``t_ns``,
    those without a usable box or a finite velocity left out."""
    age_s = (int(t_ns) - stamp_ns(msg.header.stamp)) / NS_PER_S
    objects = []
    for obj in msg.objects:
        box = object_ground_box(obj)
        v = obj.twist.linear
        if box is None or not (math.isfinite(float(v.x)) and math.isfinite(float(v.y))):
            continue
        x, y, yaw, length, width, _ = box
        objects.append(TrackedObject(x, y, yaw, float(v.x), float(v.y), length, width, age_s,
                                     name=f"object {int(obj.id)}"))
    return objects


@dataclass(frozen=True)
class Selection:
    """The choice among candidates: ``index`` of the best (into the candidates given), every candidate's
    result (None: it did not parse), ``valid``: how many parsed."""

    index: int
    results: tuple[PdmResult | None, ...]

    @property
    def best(self) -> PdmResult:
        return self.results[self.index]

    @property
    def valid(self) -> int:
        return sum(r is not None for r in self.results)


@dataclass(frozen=True)
class OnlineScene:
    """What a planner scores its candidates against at one frame (module docstring)."""

    ego: EgoStart
    scene: PdmScene
    vehicle: Vehicle = Vehicle()

    def near_agents(self, plans: Sequence[np.ndarray | None]) -> tuple[AgentTrack, ...]:
        """The agents whose boxes come within reach of a plan's line (from the ego through its waypoints): half their
        diagonal + the ego's + the TTC projection (0.9 s at the plan's top speed) + :data:`TRACKING_MARGIN_M`;
        the others cannot touch the ego or its projections, so leaving them out changes no score."""
        lines = [np.vstack([[0.0, 0.0], np.asarray(p, dtype=np.float64)]) for p in plans if p is not None]
        if not lines:
            return ()
        dense = []
        top_speed = abs(self.ego.speed_mps)
        for line in lines:
            steps = np.hypot(*np.diff(line, axis=0).T)
            top_speed = max(top_speed, float(steps.max()) / WAYPOINT_DT_S)
            s = np.concatenate([[0.0], np.cumsum(steps)])
            at = np.linspace(0.0, s[-1], max(2, int(s[-1] / 0.5) + 2))
            dense.append(np.stack([np.interp(at, s, line[:, 0]), np.interp(at, s, line[:, 1])], axis=1))
        points = np.vstack(dense)                                                   # [P, 2]
        reach = (math.hypot(self.vehicle.box.length_m, self.vehicle.box.width_m)
                 + TTC_PROJECTION_STEPS[-1] * SIM_DT_S * top_speed + TRACKING_MARGIN_M)
        return tuple(agent for agent in self.scene.agents
                     if np.hypot(*(agent.xy[:, None, :] - points[None]).transpose(2, 0, 1)).min()
                     <= reach + 0.5 * math.hypot(agent.length_m, agent.width_m))

    def score_all(self, plans: Sequence[np.ndarray | None],
                  progress_reference: str = DEFAULT_PROGRESS_REFERENCE) -> tuple[PdmResult | None, ...]:
        """Every plan's PDM score (None stays None), EP against the best progress x NC x DAC among them or, with
        ``progress_reference="first"``, the first plan's (the best's when it is None or offers none); only the
        agents near some plan are scored against (:meth:`near_agents`)."""
        check_progress_reference(progress_reference)
        scene = replace(self.scene, agents=self.near_agents(plans))
        raw = [None if p is None else pdm_score(p, self.ego, scene, 0.0, self.vehicle) for p in plans]
        if progress_reference == "first" and raw and raw[0] is not None and raw[0].weighted_progress_m > 0:
            reference = raw[0].weighted_progress_m
        else:
            reference = max((r.weighted_progress_m for r in raw if r is not None), default=0.0)
        return tuple(None if r is None else r.with_reference(reference) for r in raw)

    def select(self, plans: Sequence[np.ndarray | None],
               progress_reference: str = DEFAULT_PROGRESS_REFERENCE) -> Selection | None:
        """The best of ``plans`` ([8, 2] ego-frame waypoints, None where a candidate did not parse; EP's
        reference as :meth:`score_all`); None when none parsed."""
        results = self.score_all(plans, progress_reference)
        valid = [i for i, r in enumerate(results) if r is not None]
        if not valid:
            return None
        return Selection(max(valid, key=lambda i: (results[i].pdms, -i)), results)


def online_scene(ego_xy, ego_yaw: float, speed_mps: float, acceleration_mps2: float = 0.0,
                 yaw_rate_rps: float = 0.0, route_xy: np.ndarray | None = None,
                 objects: Sequence[TrackedObject] = (), lane_width_m: float = DEFAULT_LANE_WIDTH_M,
                 vehicle: Vehicle = Vehicle()) -> OnlineScene:
    """The scene at the ego's pose ``ego_xy``, ``ego_yaw`` (odometry frame; module docstring): ``route_xy``
    [N, 2] the route in the odometry frame (None or empty: no route), ``objects`` the tracked objects."""
    width = check_lane_width(lane_width_m)
    origin = np.asarray(ego_xy, dtype=np.float64).reshape(2)
    if not (np.isfinite(origin).all() and math.isfinite(ego_yaw)):
        raise ValueError(f"ego pose must be finite, got {tuple(origin)}, yaw {ego_yaw}")
    if route_xy is not None and len(route_xy):
        route = np.asarray(route_xy, dtype=np.float64)
        if route.ndim != 2 or route.shape[1] != 2 or not np.isfinite(route).all():
            raise ValueError(f"route_xy must be finite points [N, 2], got shape {route.shape}")
        line = corridor_line(route, int(np.argmin(np.hypot(*(route - origin).T))), ego_yaw)
        centreline = world_to_ego(line, origin, ego_yaw)
        drivable = Area.corridor(centreline, width)
    else:
        h = NO_ROUTE_HALF_SIZE_M
        centreline = np.array([[-CORRIDOR_BEHIND_M, 0.0], [CORRIDOR_AHEAD_M, 0.0]])
        drivable = Area.polygon([[-h, -h], [h, -h], [h, h], [-h, h]])
    agents = [o.agent(origin, ego_yaw) for o in objects]
    return OnlineScene(ego_start(speed_mps, acceleration_mps2, yaw_rate_rps, vehicle),
                       PdmScene(centreline=centreline, drivable=drivable, agents=agents), vehicle)
