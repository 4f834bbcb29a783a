"""What a plan is scored against (NAVSIM v1's PDM score, :mod:`.score`): the ego at the plan's stamp,
non-reactive agents as boxes every :data:`SIM_DT_S` for 5 s (an agent's speed at t = 0 from its first two),
the drivable area, lanes, intersections and the route's centre line, all in the ego frame at the plan's stamp
(rear axle, x forward, y left, metres). The geometry comes from the caller as polygons or corridors (a centre
line + a width, :meth:`Area.corridor`), not a map; the ego is any box and wheelbase (default the demo car's).

    scene = PdmScene(centreline=np.array([[-50.0, 0.0], [200.0, 0.0]]),
                     drivable=Area.corridor([[-50.0, 0.0], [200.0, 0.0]], width_m=7.0),
                     agents=[AgentTrack.moving(x=30.0, y=0.0, yaw=0.0, speed_mps=0.0)])
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

from ..geometry import DEMO_EGO_BOX, DEMO_EGO_WHEELBASE_M, EgoBox, box_corners

# NAVSIM v1.1's time grid: navsim/planning/script/config/pdm_scoring/default_scoring_parameters.yaml
# (proposal_sampling) and metric_cache_processor.py (the observation spans 5 s at 0.1 s)
SIM_DT_S = 0.1                               # interval_length
SIM_STEPS = 40                               # num_poses: 4 s
TTC_PROJECTION_STEPS = (0, 3, 6, 9)          # pdm_scorer._calculate_ttc: np.arange(0, 10, 3) x 0.1 s
OBSERVATION_SAMPLES = SIM_STEPS + TTC_PROJECTION_STEPS[-1] + 1      # 50 boxes: 0 ... 4.9 s (TTC looks 0.9 s past 4 s)

AGENT_KINDS = ("vehicle", "pedestrian", "bicycle")   # nuPlan's AGENT_TYPES: NC 0
OBJECT_KINDS = AGENT_KINDS + ("static",)             # anything else (cones, barriers, ...): NC 0.5

@dataclass(frozen=True)
class EgoStart:
    """The ego at the plan's stamp: speed along its heading (m/s), longitudinal acceleration (m/s^2),
    front-wheel steering angle (rad, + left). Its pose is the ego frame's origin."""

    speed_mps: float
    acceleration_mps2: float = 0.0
    steering_angle_rad: float = 0.0

    def __post_init__(self):
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if not all(math.isfinite(float(v)) for v in values.values()):
            raise ValueError("EgoStart must be finite: " + ", ".join(f"{k}={v}" for k, v in values.items()))


@dataclass(frozen=True)
class Vehicle:
    """The ego's box around its rear axle and its wheelbase (default: the demo world's car)."""

    box: EgoBox = DEMO_EGO_BOX
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
            t = np.minimum(t, speed_mps / -acceleration_mps2)                 # stands from then on
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
    """What the plan is scored against, in the ego frame at its stamp: ``centreline`` [N, 2] (progress along it,
    in its point order), ``drivable``, ``agents``, ``lanes`` (an ego box with corners in two lanes and wholly in
    none "straddles lanes": lateral hits are then its fault), ``intersections`` (TTC counts agents beside too)."""

    centreline: np.ndarray
    drivable: Area
    agents: Sequence[AgentTrack] = ()
    lanes: Sequence[Area] = ()
    intersections: Area = field(default_factory=Area)

    def __post_init__(self):
        object.__setattr__(self, "centreline", _polyline(self.centreline, "PdmScene.centreline"))
        object.__setattr__(self, "agents", tuple(self.agents))
        object.__setattr__(self, "lanes", tuple(self.lanes))

