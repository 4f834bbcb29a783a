"""A drivable trajectory from a plan: the waypoints (one every ``WAYPOINT_DT_S``, ego frame) and the ego's
measured speed -> a point every ``step_s`` from t = 0 (the ego, at the measured speed) to the plan's horizon,
with position, heading, longitudinal speed, acceleration and heading rate: what Autoware's
``autoware_planning_msgs/Trajectory`` and path followers consume.

1. **path**: the ego (0, 0) and the waypoints (one closer than ``MIN_SEGMENT_M`` to the last kept dropped), by
   arc length;
2. **planned speed**: the derivative of the plan's progress at 0, 0.5, ..., 4.0 s interpolated by a monotone
   cubic (Fritsch-Carlson): never negative, no overshoot;
3. **speed**: from the measured speed, each step moves toward the planned speed within the limits
   (acceleration, deceleration, top speed, lateral acceleration on the path's curvature, >= 0); where they
   conflict the deceleration limit wins, and a plan that stops closer than the ego can brake continues past
   its last waypoint along the last heading;
4. **points**: s(t) integrates the speed (trapezoid) on the path; the heading is the path's tangent, the
   heading rate its time derivative.

    profile = speed_profile(plan_xy, measured_speed(ego.vx))     # SpeedProfile of numpy arrays
    profile.t, profile.x, profile.speed, profile.accel, profile.heading_rate
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .geometry import path_headings
from .outputs.prompts import WAYPOINT_DT_S
from .utils.fields import check_positive, setting

MIN_SEGMENT_M = 0.05        # path points closer than this to the last kept one are dropped


@dataclass(frozen=True)
class ProfileLimits:
    """Physical limits of the profile and its sampling step (defaults: a passenger car in traffic)."""

    step_s: float = setting(0.1, "time between trajectory points (seconds; Autoware's planners publish about "
                            "0.1 s)", low=1e-3, high=0.5)
    max_speed_mps: float = setting(36.0, "top speed of the profile (m/s; 130 km/h)", low=1e-3, high=100.0)
    max_accel_mps2: float = setting(3.0, "largest acceleration of the profile (m/s^2; a brisk passenger car)",
                                    low=1e-3, high=20.0)
    max_decel_mps2: float = setting(6.0, "largest deceleration of the profile (m/s^2; firm braking, about 0.6 g)",
                                    low=1e-3, high=20.0)
    max_lateral_accel_mps2: float = setting(4.0, "largest lateral acceleration on the path's curvature: v <= "
                                            "sqrt(a / curvature) (m/s^2)", low=1e-3, high=20.0)

    def __post_init__(self):
        check_positive(self)


@dataclass(frozen=True)
class SpeedProfile:
    """Points every ``step_s`` from t = 0 in the plan's (ego) frame; all arrays [M]."""

    t: np.ndarray              # s from the plan's stamp
    x: np.ndarray              # m, forward
    y: np.ndarray              # m, left
    heading: np.ndarray        # rad, from +x toward +y
    speed: np.ndarray          # m/s, longitudinal, >= 0
    accel: np.ndarray          # m/s^2, d speed / dt (the last point repeats the one before)
    heading_rate: np.ndarray   # rad/s, d heading / dt

    def __len__(self) -> int:
        return len(self.t)


def measured_speed(forward_velocity_mps: float) -> float:
    """The speed a profile starts from (the planner node's and the bag evaluator's): the ego's forward velocity
    (the odometry twist in the ego frame), 0 while it rolls backwards (the profile drives forward only)."""
    return max(float(forward_velocity_mps), 0.0)


def speed_profile(waypoints, measured_speed_mps: float, limits: ProfileLimits = ProfileLimits(),
                  waypoint_dt_s: float = WAYPOINT_DT_S) -> SpeedProfile:
    """The trajectory of ``waypoints`` [K, 2] (ego frame; waypoint k at (k + 1) * ``waypoint_dt_s``) driven
    from ``measured_speed_mps`` within ``limits`` (module doc). Raises ValueError naming a bad input."""
    plan = np.asarray(waypoints, dtype=np.float64)
    if plan.ndim != 2 or plan.shape[1] != 2 or len(plan) == 0:
        raise ValueError(f"waypoints: expected [K, 2] with K >= 1, got shape {plan.shape}")
    if not np.isfinite(plan).all():
        raise ValueError("waypoints: not finite (NaN or inf)")
    if not (np.isfinite(measured_speed_mps) and measured_speed_mps >= 0):
        raise ValueError(f"measured_speed_mps: must be finite and >= 0, got {measured_speed_mps!r}")
    path = _Path.through(np.vstack([np.zeros((1, 2)), plan]))
    step = limits.step_s
    t = np.arange(0.0, len(plan) * waypoint_dt_s + step / 2, step)
    planned = planned_speeds(plan, waypoint_dt_s, t)

    speed = np.empty_like(t)
    s = np.zeros_like(t)
    speed[0] = min(float(measured_speed_mps), limits.max_speed_mps)
    for i in range(1, len(t)):
        ceiling = min(limits.max_speed_mps, path.curve_speed(s[i - 1], limits.max_lateral_accel_mps2))
        speed[i] = max(float(np.clip(min(planned[i], ceiling), speed[i - 1] - limits.max_decel_mps2 * step,
                                     speed[i - 1] + limits.max_accel_mps2 * step)), 0.0)
        s[i] = s[i - 1] + 0.5 * (speed[i - 1] + speed[i]) * step
    x, y, heading = path.place(s)
    accel = np.append(np.diff(speed) / step, 0.0)
    accel[-1] = accel[-2] if len(accel) > 1 else 0.0
    heading_rate = np.gradient(heading, step) if len(t) > 1 else np.zeros_like(t)
    return SpeedProfile(t=t, x=x, y=y, heading=heading, speed=speed, accel=accel, heading_rate=heading_rate)


def planned_speeds(waypoints, waypoint_dt_s: float = WAYPOINT_DT_S, at: np.ndarray | None = None) -> np.ndarray:
    """The plan's own speed (m/s) at the times ``at`` (default: each waypoint's): the slope of its progress along
    the path (the monotone cubic of the module doc), before any limit: the model's speed intent."""
    points = np.vstack([np.zeros((1, 2)), np.asarray(waypoints, dtype=np.float64)])
    times = np.arange(len(points)) * waypoint_dt_s
    progress = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=1))])
    return _monotone_slope(times, progress, times[1:] if at is None else at)


def waypoint_states(waypoints, waypoint_dt_s: float = WAYPOINT_DT_S) -> tuple[np.ndarray, np.ndarray]:
    """(heading, speed) [K] at each waypoint as the package's own ``TrajectoryPoint`` carries them: the
    direction from the previous point (``geometry.path_headings``) and :func:`planned_speeds`."""
    return path_headings(waypoints), planned_speeds(waypoints, waypoint_dt_s)


@dataclass(frozen=True)
class _Path:
    """The ego and the plan's points as a polyline by arc length, with what every step reads of it
    (segment headings, their midpoints, the curvature at each joint) computed once."""

    xy: np.ndarray             # [P, 2] the kept points, the ego first
    s: np.ndarray              # [P] arc length at each
    headings: np.ndarray       # [max(P - 1, 1)] unwrapped heading of each segment (0: a path of one point)
    mids: np.ndarray           # [P - 1] arc length at each segment's midpoint
    curvature: np.ndarray      # [P - 2] |heading change| per metre at each joint

    @classmethod
    def through(cls, points: np.ndarray) -> "_Path":
        """Each point at least MIN_SEGMENT_M from the last kept one."""
        kept = [points[0]]
        for p in points[1:]:
            if np.linalg.norm(p - kept[-1]) >= MIN_SEGMENT_M:
                kept.append(p)
        xy = np.array(kept)
        d = np.diff(xy, axis=0)
        s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(d, axis=1))])
        headings = np.unwrap(np.arctan2(d[:, 1], d[:, 0])) if len(xy) > 1 else np.zeros(1)
        mids = 0.5 * (s[:-1] + s[1:])
        curvature = np.abs(np.diff(headings) / np.maximum(np.diff(mids), 1e-6)) if len(headings) > 1 else np.zeros(0)
        return cls(xy, s, headings, mids, curvature)

    def curve_speed(self, s: float, max_lateral: float) -> float:
        """The highest speed at arc length ``s`` whose lateral acceleration stays <= ``max_lateral``."""
        if len(self.curvature) == 0:
            return np.inf
        k = (float(np.interp(s, 0.5 * (self.mids[:-1] + self.mids[1:]), self.curvature)) if len(self.curvature) > 1
             else float(self.curvature[0]))
        return np.inf if k < 1e-9 else float(np.sqrt(max_lateral / k))

    def place(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions and headings at arc lengths ``s`` (past the end: straight on, last heading); the heading is
        the segments' interpolated between their midpoints (the first and last segments' held beyond them)."""
        within = np.minimum(s, self.s[-1])
        if len(self.xy) > 1:
            x, y = np.interp(within, self.s, self.xy[:, 0]), np.interp(within, self.s, self.xy[:, 1])
        else:
            x, y = np.full_like(s, self.xy[0, 0]), np.full_like(s, self.xy[0, 1])
        beyond, last = s - within, self.headings[-1]
        heading = np.full_like(s, last) if len(self.headings) == 1 else np.interp(s, self.mids, self.headings)
        return x + beyond * np.cos(last), y + beyond * np.sin(last), heading


def _monotone_slope(xs: np.ndarray, ys: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The derivative at ``at`` of the monotone cubic Hermite interpolant of (xs, ys) (Fritsch-Carlson:
    ys non-decreasing -> derivative >= 0, no overshoot); xs strictly increasing."""
    h = np.diff(xs)
    delta = np.diff(ys) / h
    slopes = np.zeros_like(ys)
    for k in range(1, len(xs) - 1):
        if delta[k - 1] * delta[k] > 0:
            w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
            slopes[k] = (w1 + w2) / (w1 / delta[k - 1] + w2 / delta[k])
    slopes[0], slopes[-1] = delta[0], delta[-1]
    index = np.clip(np.searchsorted(xs, at, side="right") - 1, 0, len(h) - 1)
    u = (at - xs[index]) / h[index]
    y0, y1, m0, m1, hk = ys[index], ys[index + 1], slopes[index], slopes[index + 1], h[index]
    # derivative of the cubic Hermite basis in u, divided by h
    d = ((6 * u ** 2 - 6 * u) * y0 + (3 * u ** 2 - 4 * u + 1) * hk * m0
         + (-6 * u ** 2 + 6 * u) * y1 + (3 * u ** 2 - 2 * u) * hk * m1) / hk
    return np.maximum(d, 0.0)
