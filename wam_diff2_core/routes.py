"""A route -> the navigation command, stable over time (the controller node's ``route.*``; docs/carla.md,
"Route -> command"). A route is a polyline in the odometry frame, optionally with one CARLA RoadOption per
point (the leaderboard's ``carla_msgs/CarlaRoute``); a ``nav_msgs/Path`` route has none.

    tracker = RouteTracker()
    tracker.set_route(points_xy, road_options=[4, 4, 1, 4])   # CarlaRoute-like; None for a Path
    tracker.update((x, y), yaw, stamp_s)                      # 'left' | 'straight' | 'right' | None (off route)

**Progress** along the route never goes back and is searched only from ``search_back_m`` behind to
``search_ahead_m`` ahead of the last one, so a route passing near itself cannot capture the ego and a wobble
cannot step the command back and forth. The first fix, or one farther than ``geometry.max_distance_m`` from
that window (a respawn), takes the earliest stretch of the route within ``max_distance_m`` (leaderboard
routes start at the ego); none: off route (None).

**RoadOptions -> command**, in order: (1) the option of the segment under the ego (its first point's: CARLA's
``downsample_route`` keeps the first point of every option stretch): ``LEFT`` / ``RIGHT`` / ``STRAIGHT`` for
the whole stretch, a lane change only within ``lane_change_length_m`` of its point (the downsampled route
keeps no point where lane following resumes); (2) else the first maneuver within ``option_lookahead_m``
ahead; (3) else (``VOID``, ``LANEFOLLOW``) straight, or with ``lanefollow_geometry`` the geometric rule of
Path routes: :func:`wam_diff2_core.geometry.command_from_route` on the route around the progress.

**Hysteresis**: a new command replaces the held one only after it has been the candidate for
``hysteresis_m`` of progress or ``hysteresis_s``, whichever comes first, in one unbroken run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .geometry import ROAD_OPTION_COMMANDS, RouteCommandSettings, command_from_route, road_option_name
from .geometry import ROAD_OPTIONS  # noqa: F401  (the ROS tools import it from here)
from .utils.fields import setting

# Options that name a maneuver (rules 1 and 2); LANEFOLLOW and VOID do not.
MANEUVERS = ("LEFT", "RIGHT", "STRAIGHT", "CHANGELANELEFT", "CHANGELANERIGHT")
LANE_CHANGES = ("CHANGELANELEFT", "CHANGELANERIGHT")


@dataclass(frozen=True)
class RouteTrackerSettings:
    """The controller's ``route.*`` parameters (``geometry``'s fields flattened in)."""

    # 60 m is the demo world's crossing rule (sim.truth.CommandSettings.crossing_distance_m, checked by a
    # test): braking from 13 m/s to a turn's speed fits in it
    option_lookahead_m: float = setting(60.0, "RoadOption routes: a maneuver (LEFT/RIGHT/STRAIGHT/lane change) "
                                        "this far ahead is announced (metres)", low=0.0, high=10000.0)
    lane_change_length_m: float = setting(10.0, "RoadOption routes: a lane change option holds this far past its "
                                          "point (metres)", low=0.0, high=1000.0)
    lanefollow_geometry: bool = setting(False, "RoadOption routes: LANEFOLLOW/VOID stretches use the geometric "
                                        "rule instead of straight")
    geometry: RouteCommandSettings = field(default_factory=RouteCommandSettings)   # Path routes; max_distance_m
    search_back_m: float = setting(5.0, "progress window behind the remembered progress (metres)",
                                   low=0.0, high=1000.0)
    search_ahead_m: float = setting(30.0, "progress window ahead of the remembered progress (metres)",
                                    low=0.0, high=10000.0)
    hysteresis_m: float = setting(2.0, "a new command must persist this much route progress ... (metres)",
                                  low=0.0, high=1000.0)
    hysteresis_s: float = setting(1.0, "... or this long, whichever comes first (seconds)", low=0.0, high=3600.0)

    def __post_init__(self):
        for name in ("option_lookahead_m", "lane_change_length_m", "search_back_m", "search_ahead_m",
                     "hysteresis_m", "hysteresis_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


class RouteTracker:
    """Remembers the progress along one route and turns it into a stable command."""

    def __init__(self, settings: RouteTrackerSettings | None = None):
        self.settings = settings or RouteTrackerSettings()
        self.points: np.ndarray | None = None      # [N, 2]
        self.options: list[str] | None = None      # [N] RoadOption names, None for a Path route
        self.clear_progress()

    def set_route(self, points_xy: np.ndarray, road_options: Sequence[Any] | None = None) -> None:
        """A new route (progress starts over), repeated points dropped with their options. ValueError for fewer
        than 2 distinct points, non-finite ones, or options that are not RoadOptions one to one with them."""
        points = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
        if not np.isfinite(points).all():
            bad = int((~np.isfinite(points)).any(1).sum())
            raise ValueError(f"route has non-finite points ({bad} of {len(points)})")
        options = None
        if road_options is not None:
            if len(road_options) != len(points):
                raise ValueError(f"route has {len(points)} points but {len(road_options)} road options")
            options = [road_option_name(o) for o in road_options]
        keep = np.ones(len(points), bool)
        keep[1:] = np.hypot(*np.diff(points, axis=0).T) > 1e-3
        points = points[keep]
        if len(points) < 2:
            raise ValueError("route needs at least 2 distinct points")
        self.points = points
        self.options = None if options is None else [o for o, k in zip(options, keep) if k]
        seg = np.diff(points, axis=0)                                  # [N-1, 2]
        self._seg_len = np.hypot(*seg.T)                               # [N-1]
        self._s = np.concatenate([[0.0], np.cumsum(self._seg_len)])   # [N] arc length of each point
        self.clear_progress()

    def clear_progress(self) -> None:
        self.progress_m: float | None = None
        self.distance_m: float | None = None       # ego to the route at the last update
        self.command: str | None = None            # the held command
        self._pending: tuple[str, float, float] | None = None   # (candidate, progress, time) it began

    @property
    def length_m(self) -> float:
        return 0.0 if self.points is None else float(self._s[-1])

    @property
    def completion(self) -> float:
        """Progress / route length (0 before the first update)."""
        if self.progress_m is None or self.length_m == 0.0:
            return 0.0
        return min(1.0, self.progress_m / self.length_m)

    def update(self, ego_xy: Sequence[float], ego_yaw: float, stamp_s: float) -> str | None:
        """The command at ``ego_xy`` / ``ego_yaw`` (route frame) at ``stamp_s``; None without a route or off it."""
        if self.points is None:
            return None
        if self._localise(np.asarray(ego_xy, dtype=np.float64)) is None:
            return None
        return self._hold(self._candidate(self.progress_m, ego_xy, ego_yaw), self.progress_m, stamp_s)

    def _project(self, xy: np.ndarray, lo: int, hi: int, earliest_within_m: float | None = None) -> tuple[float, float]:
        """(arc length, distance) of the closest point on segments lo .. hi-1; with ``earliest_within_m``, on the
        earliest run of segments within that distance (when there is one)."""
        a, d = self.points[lo:hi], np.diff(self.points[lo:hi + 1], axis=0)
        length = self._seg_len[lo:hi]
        t = np.clip(((xy - a) * d).sum(1) / length**2, 0.0, 1.0)
        closest = a + t[:, None] * d
        dist = np.hypot(*(xy - closest).T)
        first, last = 0, len(dist)
        if earliest_within_m is not None:
            near = dist <= earliest_within_m
            if near.any():
                first = int(np.argmax(near))
                after = np.flatnonzero(~near[first:])
                last = first + int(after[0]) if len(after) else len(dist)
        i = first + int(np.argmin(dist[first:last]))
        return float(self._s[lo + i] + t[i] * length[i]), float(dist[i])

    def _localise(self, xy: np.ndarray) -> float | None:
        st, n = self.settings, len(self.points) - 1
        max_distance = st.geometry.max_distance_m
        if self.progress_m is not None:
            lo = max(0, int(np.searchsorted(self._s, self.progress_m - st.search_back_m, "right")) - 1)
            hi = min(n, int(np.searchsorted(self._s, self.progress_m + st.search_ahead_m, "left")) + 1)
            s, dist = self._project(xy, lo, max(hi, lo + 1))
            if dist <= max_distance:
                self.progress_m, self.distance_m = max(self.progress_m, s), dist
                return self.progress_m
        # first fix, or lost the window (a respawn): the earliest stretch of the route within reach
        s, dist = self._project(xy, 0, n, earliest_within_m=max_distance)
        self.distance_m = dist
        if dist > max_distance:
            return None
        if self.progress_m is not None and s < self.progress_m:
            self._pending = None                  # re-localised backwards: a new start, no carried candidate
        self.progress_m = s
        return s

    def _segment(self, s: float) -> int:
        return int(np.clip(np.searchsorted(self._s, s, "right") - 1, 0, len(self._s) - 2))

    def _candidate(self, s: float, ego_xy: Sequence[float], ego_yaw: float) -> str:
        st = self.settings
        if self.options is not None:
            k = self._segment(s)
            here = self.options[k]
            if here in MANEUVERS and (here not in LANE_CHANGES or s - self._s[k] <= st.lane_change_length_m):
                return ROAD_OPTION_COMMANDS[here]
            for j in range(k + 1, len(self.options)):
                if self._s[j] - s > st.option_lookahead_m:
                    break
                if self.options[j] in MANEUVERS:
                    return ROAD_OPTION_COMMANDS[self.options[j]]
            if not st.lanefollow_geometry:
                return "straight"
        # the geometric rule on the route around the progress point (not the whole route: a stretch
        # passing near the ego elsewhere must not decide)
        lo = int(np.searchsorted(self._s, s - 5.0))
        hi = int(np.searchsorted(self._s, s + st.geometry.lookahead_m + 5.0)) + 1
        lo = max(0, min(lo, self._segment(s)))
        command = command_from_route(self.points[lo:hi + 1], ego_xy, ego_yaw, st.geometry)
        return command or "straight"

    def _hold(self, candidate: str, s: float, t: float) -> str:
        st = self.settings
        if self.command is None or candidate == self.command:
            self.command, self._pending = candidate, None
            return self.command
        if self._pending is None or self._pending[0] != candidate:
            self._pending = (candidate, s, t)
        _, s0, t0 = self._pending
        if s - s0 >= st.hysteresis_m or t - t0 >= st.hysteresis_s:
            self.command, self._pending = candidate, None
        return self.command


def route_from_path_msg(msg) -> np.ndarray:
    """``nav_msgs/Path`` (a live ROS 2 message or a rosbags one; its ``poses``: PoseStamped[], or Pose[]) -> [N, 2]
    points in its frame."""
    poses = [getattr(p, "pose", p) for p in msg.poses]
    return np.array([[float(p.position.x), float(p.position.y)] for p in poses], dtype=np.float64).reshape(-1, 2)


def route_from_msg(msg) -> tuple[np.ndarray, list[str] | None]:
    """A ``nav_msgs/Path`` or a ``carla_msgs/CarlaRoute`` (``poses``: Pose[] or PoseStamped[], ``road_options``) ->
    (points [N, 2] in its frame, road options or None for a Path); ValueError for road options CARLA does not have.
    A CarlaRoute is in the bridge's ``map`` frame (the odometry's)."""
    points = route_from_path_msg(msg)
    if not hasattr(msg, "road_options"):
        return points, None
    # uint8[] arrives as array('B') or bytes, int8[] as array('b'), names as str: list() gives items
    return points, [road_option_name(o if isinstance(o, str) else int(o)) for o in list(msg.road_options)]
