"""Road geometry of the demo world: one route road of pieces laid end to end (``Straight(length_m)``,
``Curve(radius_m, angle_deg)``, + turns left, and four-way ``Crossing(turn)``), with side-road stubs. One lane
per direction (right-hand traffic): the ego lane ``lane_width_m / 2`` right of the centreline, the oncoming
lane as far left. The crossings' geometry: sim/README.md, "The world".

    >>> road = build_road([Straight(30.0), Crossing("left"), Straight(40.0)], RoadSettings())
    >>> [c.turn for c in road.crossings], round(road.lane.length)
    (['left'], 85)
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from ..geometry import box_corners

TURNS = ("left", "straight", "right")
PUBLISHED_ROUTE_SPACING_M = 2.0     # metres between the points of the route as published (Path, CarlaRoute, bag)


class Path2D:
    """A dense polyline, the lanes vehicles follow: ``points`` [N, 2] metres, ``headings`` [N] radians (the
    tangents; from the points when not given), arc length ``s`` [N] and curvature [N]."""

    def __init__(self, points: np.ndarray, headings: np.ndarray | None = None):
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if len(points) < 2:
            raise ValueError("a path needs at least 2 points")
        self.points = points                                          # [N, 2]
        seg = np.diff(points, axis=0)                                 # [N-1, 2]
        self.segment_lengths = np.hypot(seg[:, 0], seg[:, 1])         # [N-1]
        if not (self.segment_lengths > 1e-9).all():
            raise ValueError("a path must not repeat a point")
        self.s = np.concatenate([[0.0], np.cumsum(self.segment_lengths)])   # [N]
        if headings is None:
            seg_heading = np.arctan2(seg[:, 1], seg[:, 0])
            headings = np.concatenate([seg_heading[:1], seg_heading])
            # the tangent at an inner point: the mean of the two segment directions
            headings[1:-1] = np.angle(np.exp(1j * seg_heading[:-1]) + np.exp(1j * seg_heading[1:]))
        self.headings = np.unwrap(np.asarray(headings, dtype=np.float64))   # [N], continuous
        # curvature per point from the heading change over the neighbouring segments
        seg_curv = np.diff(self.headings) / self.segment_lengths
        curv = np.zeros(len(points))
        curv[:-1] += seg_curv
        curv[1:] += seg_curv
        curv[1:-1] /= 2.0
        self.curvature = curv                                          # [N], 1/m, + left
        # plain lists for the scalar lookups done every tick
        self._s_list = self.s.tolist()
        self._xy_list = self.points.tolist()
        self._h_list = self.headings.tolist()
        self._profiles: dict[tuple[float, float], np.ndarray] = {}

    @property
    def length(self) -> float:
        return float(self.s[-1])

    def interpolate(self, s: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(xy [..., 2], heading [...]) at arc lengths ``s`` (clamped to the path)."""
        s = np.clip(np.asarray(s, dtype=np.float64), 0.0, self.length)
        x = np.interp(s, self.s, self.points[:, 0])
        y = np.interp(s, self.s, self.points[:, 1])
        heading = np.interp(s, self.s, self.headings)
        return np.stack([x, y], axis=-1), heading

    def pose_at(self, s: float) -> tuple[float, float, float]:
        """(x, y, heading) at arc length ``s``: :meth:`interpolate` for one point, without numpy overhead."""
        s = min(max(float(s), 0.0), self.length)
        i = min(max(bisect.bisect_right(self._s_list, s) - 1, 0), len(self._s_list) - 2)
        w = (s - self._s_list[i]) / (self._s_list[i + 1] - self._s_list[i])
        (x0, y0), (x1, y1) = self._xy_list[i], self._xy_list[i + 1]
        h0, h1 = self._h_list[i], self._h_list[i + 1]
        return x0 + w * (x1 - x0), y0 + w * (y1 - y0), h0 + w * (h1 - h0)

    def speed_profile(self, lateral_accel_mps2: float, decel_mps2: float) -> np.ndarray:
        """[N] suffix minimum of v_j^2 + 2 b s_j, v_j^2 = a_lat / |curvature_j| (cached): every curve from point
        i on can be taken after braking at b from sqrt(profile[i] - 2 b s)."""
        key = (lateral_accel_mps2, decel_mps2)
        if key not in self._profiles:
            value = lateral_accel_mps2 / np.maximum(np.abs(self.curvature), 1e-6) + 2.0 * decel_mps2 * self.s
            self._profiles[key] = np.minimum.accumulate(value[::-1])[::-1]
        return self._profiles[key]

    def project(self, xy: Sequence[float], s_hint: float | None = None,
                window_m: tuple[float, float] = (-20.0, 40.0)) -> tuple[float, float]:
        """(s, lateral + left) of the closest point to ``xy``; with ``s_hint`` only within ``window_m`` of it (a
        route that comes back near itself cannot capture a vehicle from the wrong stretch)."""
        p = np.asarray(xy, dtype=np.float64)
        lo, hi = 0, len(self.points) - 1
        if s_hint is not None:
            lo = max(0, int(np.searchsorted(self.s, s_hint + window_m[0])) - 1)
            hi = min(len(self.points) - 1, int(np.searchsorted(self.s, s_hint + window_m[1])) + 1)
            if hi - lo < 1:
                lo, hi = max(0, hi - 1), max(1, hi)
        a = self.points[lo:hi]                                       # [M, 2] segment starts
        d = self.points[lo + 1:hi + 1] - a                           # [M, 2]
        length = self.segment_lengths[lo:hi]
        t = np.clip(((p - a) * d).sum(1) / length**2, 0.0, 1.0)
        closest = a + t[:, None] * d
        dist = np.hypot(*(p - closest).T)
        i = int(np.argmin(dist))
        rel = p - closest[i]
        lateral = (d[i, 0] * rel[1] - d[i, 1] * rel[0]) / length[i]
        return float(self.s[lo + i] + t[i] * length[i]), float(lateral)

    def offset(self, lateral_m: float) -> "Path2D":
        """The parallel path ``lateral_m`` to the left (negative: right)."""
        normal = np.stack([-np.sin(self.headings), np.cos(self.headings)], axis=1)
        return Path2D(self.points + lateral_m * normal, self.headings)

    def reversed(self) -> "Path2D":
        return Path2D(self.points[::-1].copy(), self.headings[::-1] + math.pi)

    def resampled(self, spacing_m: float) -> np.ndarray:
        """[K, 2] points every ``spacing_m`` along the path, the last point included."""
        n = max(2, int(math.ceil(self.length / spacing_m)) + 1)
        return self.interpolate(np.linspace(0.0, self.length, n))[0]


@dataclass(frozen=True)
class Straight:
    length_m: float


@dataclass(frozen=True)
class Curve:
    radius_m: float
    angle_deg: float      # + turns left, - right


@dataclass(frozen=True)
class Crossing:
    turn: str             # left | straight | right


Piece = Union[Straight, Curve, Crossing]


@dataclass(frozen=True)
class RoadSettings:
    lane_width_m: float = 3.5
    shoulder_m: float = 0.6              # asphalt beyond the edge line
    corner_radius_m: float = 4.0         # intersection box half size = lane width + this
    stub_length_m: float = 60.0          # side roads drawn at intersections
    sample_spacing_m: float = 0.5

    @property
    def crossing_half_size_m(self) -> float:
        return self.lane_width_m + self.corner_radius_m


@dataclass
class Intersection:
    """A four-way crossing on the route."""
    centre: np.ndarray            # [2] map frame
    heading_in: float             # route heading entering the box
    half_size_m: float
    turn: str                     # what the route does here
    lane_s_entry: float = 0.0     # arc length on the ego lane where it enters / leaves the box
    lane_s_exit: float = 0.0
    arms_unused: list[float] = field(default_factory=list)   # headings of the stub arms (pointing out)

    def corners(self) -> np.ndarray:
        """[4, 2] box corners."""
        return box_corners(*self.centre, self.heading_in, 2 * self.half_size_m, 2 * self.half_size_m)


@dataclass
class CurveSpan:
    """A curve of the route, for questions about the road ahead."""
    lane_s_start: float
    lane_s_end: float
    direction: str                # left | right
    radius_m: float


@dataclass
class RoadMap:
    """Everything static in an episode's world."""
    settings: RoadSettings
    centreline: Path2D
    lane: Path2D                  # the ego lane (the route the ego drives), right of the centreline
    oncoming: Path2D              # the other lane, driven the other way
    crossings: list[Intersection]
    curves: list[CurveSpan]
    stubs: list[Path2D]           # side-road centrelines, starting at a box edge, pointing out
    in_crossing: np.ndarray       # [N] bool per centreline point: inside an intersection box
    stub_lanes: list[tuple[Path2D, Path2D]] = field(default_factory=list)   # (towards box, away)

    def bounds(self, margin_m: float = 0.0) -> tuple[float, float, float, float]:
        """(x_min, y_min, x_max, y_max) of every road point."""
        pts = np.concatenate([self.centreline.points] + [s.points for s in self.stubs])
        lo, hi = pts.min(0) - margin_m, pts.max(0) + margin_m
        return float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1])

    def next_crossing(self, lane_s: float) -> Intersection | None:
        """The first intersection the ego has not left yet."""
        return next((c for c in self.crossings if c.lane_s_exit > lane_s), None)


def _arc_points(x: float, y: float, yaw: float, radius: float, angle: float, spacing: float):
    """Points (excluding the start) and tangents along an arc; angle signed (+ left)."""
    length = abs(angle) * radius
    n = max(1, int(math.ceil(length / spacing)))
    phi = np.linspace(0.0, angle, n + 1)[1:]
    sign = 1.0 if angle > 0 else -1.0
    # centre of the turn is to the left (+) or right (-) of the heading
    cx, cy = x - sign * radius * math.sin(yaw), y + sign * radius * math.cos(yaw)
    headings = yaw + phi
    px = cx + sign * radius * np.sin(headings)
    py = cy - sign * radius * np.cos(headings)
    return np.stack([px, py], 1), headings


def _straight_points(x: float, y: float, yaw: float, length: float, spacing: float):
    n = max(1, int(math.ceil(length / spacing)))
    d = np.linspace(0.0, length, n + 1)[1:]
    return np.stack([x + d * math.cos(yaw), y + d * math.sin(yaw)], 1), np.full(n, yaw)


def build_road(pieces: Sequence[Piece], settings: RoadSettings, start_xy: Sequence[float] = (0.0, 0.0),
               start_yaw: float = 0.0) -> RoadMap:
    """Lay the pieces end to end from ``start_xy``/``start_yaw`` and derive lanes and stubs."""
    if not pieces:
        raise ValueError("a road needs at least one piece")
    a = settings.crossing_half_size_m
    sp = settings.sample_spacing_m
    pts, heads, inside = [np.asarray(start_xy, np.float64)[None]], [np.array([start_yaw])], [np.array([False])]
    crossing_spans, curve_spans, crossings = [], [], []
    x, y, yaw = float(start_xy[0]), float(start_xy[1]), float(start_yaw)
    for piece in pieces:
        i_start = sum(len(p) for p in pts) - 1
        if isinstance(piece, Straight):
            if piece.length_m <= 0:
                raise ValueError(f"Straight.length_m must be > 0, got {piece.length_m}")
            p, h = _straight_points(x, y, yaw, piece.length_m, sp)
        elif isinstance(piece, Curve):
            if piece.radius_m <= settings.lane_width_m or piece.angle_deg == 0:
                raise ValueError(f"Curve needs radius_m > lane width and a non-zero angle, got {piece}")
            p, h = _arc_points(x, y, yaw, piece.radius_m, math.radians(piece.angle_deg), sp)
            curve_spans.append((i_start, i_start + len(p), piece))
        elif isinstance(piece, Crossing):
            if piece.turn not in TURNS:
                raise ValueError(f"Crossing.turn must be one of {TURNS}, got {piece.turn!r}")
            centre = np.array([x + a * math.cos(yaw), y + a * math.sin(yaw)])
            if piece.turn == "straight":
                p, h = _straight_points(x, y, yaw, 2 * a, sp)
            else:
                p, h = _arc_points(x, y, yaw, a, math.pi / 2 if piece.turn == "left" else -math.pi / 2, sp)
            out_yaw = {"left": yaw + math.pi / 2, "straight": yaw, "right": yaw - math.pi / 2}[piece.turn]
            arms = [yaw, yaw + math.pi / 2, yaw - math.pi / 2]
            unused = [arm for arm in arms if abs(math.remainder(arm - out_yaw, 2 * math.pi)) > 1e-6]
            crossings.append(Intersection(centre, yaw, a, piece.turn, arms_unused=unused))
            crossing_spans.append((i_start, i_start + len(p)))
        else:
            raise TypeError(f"unknown road piece {piece!r}")
        pts.append(p)
        heads.append(h)
        inside.append(np.full(len(p), isinstance(piece, Crossing)))
        x, y, yaw = float(p[-1, 0]), float(p[-1, 1]), float(h[-1])

    centreline = Path2D(np.concatenate(pts), np.concatenate(heads))
    lane = centreline.offset(-settings.lane_width_m / 2)
    oncoming = centreline.offset(settings.lane_width_m / 2).reversed()
    for crossing, (i0, i1) in zip(crossings, crossing_spans):
        crossing.lane_s_entry, crossing.lane_s_exit = float(lane.s[i0]), float(lane.s[i1])
    curves = [CurveSpan(float(lane.s[i0]), float(lane.s[i1]), "left" if c.angle_deg > 0 else "right", c.radius_m)
              for i0, i1, c in curve_spans]

    stubs, stub_lanes = [], []
    for crossing in crossings:
        for arm in crossing.arms_unused:
            direction = np.array([math.cos(arm), math.sin(arm)])
            start = crossing.centre + a * direction
            n = max(2, int(math.ceil(settings.stub_length_m / sp)) + 1)
            d = np.linspace(0.0, settings.stub_length_m, n)
            stub = Path2D(start + d[:, None] * direction, np.full(n, arm))
            stubs.append(stub)
            away = stub.offset(-settings.lane_width_m / 2)               # right of the outward direction
            towards = stub.offset(settings.lane_width_m / 2).reversed()  # drives into the box
            stub_lanes.append((towards, away))
    return RoadMap(settings=settings, centreline=centreline, lane=lane, oncoming=oncoming, crossings=crossings,
                   curves=curves, stubs=stubs, in_crossing=np.concatenate(inside), stub_lanes=stub_lanes)


@dataclass(frozen=True)
class RouteSettings:
    """How random routes are drawn (lengths in metres, angles in degrees)."""
    first_straight_m: tuple[float, float] = (40.0, 90.0)
    straight_m: tuple[float, float] = (20.0, 110.0)
    curve_radius_m: tuple[float, float] = (25.0, 220.0)
    curve_angle_deg: tuple[float, float] = (20.0, 90.0)
    piece_weights: tuple[float, float, float] = (0.35, 0.35, 0.30)   # straight, curve, crossing
    turn_weights: tuple[float, float, float] = (0.4, 0.2, 0.4)       # left, straight, right at a crossing
    clearance_m: float = 30.0   # a new piece keeps this far from earlier road (no self-crossings)
    mirror_turns: bool = False  # every crossing turns the other way (left <-> right): World.generate
                                # then builds the twin of the world the same seed gives without it


def _sample_piece(rng: np.random.Generator, rs: RouteSettings, previous: Piece | None) -> Piece:
    kind = rng.choice(3, p=np.asarray(rs.piece_weights) / sum(rs.piece_weights))
    if isinstance(previous, (Curve, Crossing)) and kind != 0:
        kind = 0  # a short straight between curves and crossings keeps them readable in the image
    if kind == 0:
        return Straight(float(rng.uniform(*rs.straight_m)))
    if kind == 1:
        sign = 1.0 if rng.random() < 0.5 else -1.0
        return Curve(float(rng.uniform(*rs.curve_radius_m)), sign * float(rng.uniform(*rs.curve_angle_deg)))
    turn = TURNS[int(rng.choice(3, p=np.asarray(rs.turn_weights) / sum(rs.turn_weights)))]
    return Crossing(TURNS[2 - TURNS.index(turn)] if rs.mirror_turns else turn)


def _far_from(candidate: RoadMap, previous: RoadMap | None, clearance: float, settings: RoadSettings) -> bool:
    """The candidate's new road (and stubs) keeps ``clearance`` from the earlier road."""
    if previous is None:
        return True
    old_n = len(previous.centreline.points)
    # recent road right behind the new piece is allowed to be close: it is where we come from
    keep = previous.centreline.s < previous.centreline.length - clearance - 2 * settings.crossing_half_size_m
    old = np.concatenate([previous.centreline.points[keep][::4]] + [s.points[::4] for s in previous.stubs])
    new = np.concatenate([candidate.centreline.points[old_n:][::4]]
                         + [s.points[::4] for s in candidate.stubs[len(previous.stubs):]])
    if len(old) == 0 or len(new) == 0:
        return True
    d2 = ((new[:, None, :] - old[None, :, :]) ** 2).sum(-1)
    return float(d2.min()) > clearance**2


def generate_road(rng: np.random.Generator, min_length_m: float, settings: RoadSettings,
                  route: RouteSettings = RouteSettings(), start_xy: Sequence[float] = (0.0, 0.0),
                  start_yaw: float = 0.0) -> RoadMap:
    """A random route at least ``min_length_m`` long that never comes back near itself."""
    pieces: list[Piece] = [Straight(float(rng.uniform(*route.first_straight_m)))]
    road = build_road(pieces, settings, start_xy, start_yaw)
    while road.lane.length < min_length_m:
        for _ in range(12):
            candidate_pieces = pieces + [_sample_piece(rng, route, pieces[-1])]
            if isinstance(candidate_pieces[-1], Crossing):
                candidate_pieces.append(Straight(float(rng.uniform(*route.straight_m))))
            candidate = build_road(candidate_pieces, settings, start_xy, start_yaw)
            if _far_from(candidate, road, route.clearance_m, settings):
                break
        else:
            candidate_pieces = pieces + [Straight(float(route.straight_m[0]))]
            candidate = build_road(candidate_pieces, settings, start_xy, start_yaw)
        pieces, road = candidate_pieces, candidate
    return road
