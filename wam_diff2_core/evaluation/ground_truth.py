"""Recorded ego future as waypoints: the odometry interpolated (linearly in position and speed, along the
shorter arc in yaw) at +0.5 ... +4.0 s, in the ego frame at the frame stamp; integer nanoseconds, so a
target on a recorded stamp returns that sample exactly.

    trajectory = EgoTrajectory(stamps_ns, xy, yaw, speed=vx)
    gt = trajectory.future_waypoints(frame_stamp_ns)       # [8, 2], or raises NoFuture
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..geometry import world_to_ego, wrap_angle
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S

WAYPOINT_OFFSETS_NS = tuple(round((k + 1) * WAYPOINT_DT_S * 1e9) for k in range(NUM_WAYPOINTS))   # 0.5 ... 4.0 s
MAX_GAP_S = 0.5     # the longest odometry gap interpolated over, by default (eval-bag --max-gap-s)

# NoFuture codes
BEYOND_END = "insufficient_future"     # the recording ends before +4 s
BEFORE_START = "before_odometry"        # the frame is older than the first odometry sample
ODOMETRY_GAP = "odometry_gap"           # a target time falls in a gap longer than max_gap_s


class NoFuture(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class EgoTrajectory:
    """Recorded ego poses in the odometry frame, strictly increasing in time, and optionally the
    recorded forward speed at each (m/s, the odometry twist's x: negative when reversing)."""

    def __init__(self, stamps_ns: Sequence[int], xy: np.ndarray, yaw: Sequence[float], max_gap_s: float = MAX_GAP_S,
                 speed: Sequence[float] | None = None):
        self.stamps_ns = np.asarray(stamps_ns, dtype=np.int64)                  # [N]
        self.xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)              # [N, 2]
        self.yaw = np.asarray(yaw, dtype=np.float64)                            # [N]
        self.speed = None if speed is None else np.asarray(speed, dtype=np.float64)   # [N] or None
        if not (len(self.stamps_ns) == len(self.xy) == len(self.yaw)):
            raise ValueError("stamps, xy and yaw must have the same length")
        if self.speed is not None and self.speed.shape != self.stamps_ns.shape:
            raise ValueError(f"speed: expected one value per stamp ({len(self.stamps_ns)}), got shape "
                             f"{self.speed.shape}")
        if len(self.stamps_ns) > 1 and not (np.diff(self.stamps_ns) > 0).all():
            raise ValueError("odometry stamps must be strictly increasing")
        self.max_gap_ns = int(round(max_gap_s * 1e9))

    def _bracket(self, t_ns: int) -> tuple[int, float]:
        """(i, w): ``t_ns`` lies the share w in [0, 1) of the way from sample i to sample i + 1 (w = 0: on
        sample i); NoFuture when outside the recording or inside a gap longer than max_gap_s."""
        n = len(self.stamps_ns)
        if n == 0 or t_ns < self.stamps_ns[0]:
            raise NoFuture(BEFORE_START, f"{t_ns} ns is before the first odometry sample")
        if t_ns > self.stamps_ns[-1]:
            raise NoFuture(BEYOND_END, f"the odometry ends {(t_ns - self.stamps_ns[-1]) / 1e9:.3f} s before "
                                       f"{t_ns} ns")
        i = int(np.searchsorted(self.stamps_ns, t_ns, side="right")) - 1      # stamps[i] <= t
        if self.stamps_ns[i] == t_ns:
            return i, 0.0
        t0, t1 = int(self.stamps_ns[i]), int(self.stamps_ns[i + 1])
        if t1 - t0 > self.max_gap_ns:
            raise NoFuture(ODOMETRY_GAP, f"{(t1 - t0) / 1e9:.3f} s without odometry around {t_ns} ns "
                                         f"(max {self.max_gap_ns / 1e9:.3f} s)")
        return i, (t_ns - t0) / (t1 - t0)

    def pose_at(self, t_ns: int) -> tuple[np.ndarray, float]:
        """(xy [2], yaw) at ``t_ns``; NoFuture when outside the recording or inside a long gap."""
        i, w = self._bracket(t_ns)
        if w == 0.0:
            return self.xy[i].copy(), float(self.yaw[i])
        xy = self.xy[i] + (self.xy[i + 1] - self.xy[i]) * w
        yaw = wrap_angle(self.yaw[i] + wrap_angle(self.yaw[i + 1] - self.yaw[i]) * w)
        return xy, yaw

    def speed_at(self, t_ns: int) -> float:
        """The recorded forward speed at ``t_ns`` (m/s), interpolated linearly; NoFuture as :meth:`pose_at`."""
        if self.speed is None:
            raise ValueError("this EgoTrajectory was built without speeds (pass speed=)")
        i, w = self._bracket(t_ns)
        if w == 0.0:
            return float(self.speed[i])
        return float(self.speed[i] + (self.speed[i + 1] - self.speed[i]) * w)

    def future_waypoints(self, t_ns: int) -> np.ndarray:
        """[8, 2] recorded positions at +0.5 ... +4.0 s in the ego frame at ``t_ns``."""
        origin, yaw = self.pose_at(t_ns)
        future = np.stack([self.pose_at(t_ns + dt)[0] for dt in WAYPOINT_OFFSETS_NS])   # [8, 2] odometry frame
        return world_to_ego(future, origin, yaw)

    def future_speeds(self, t_ns: int) -> np.ndarray:
        """[8] recorded forward speeds at +0.5 ... +4.0 s (m/s); NoFuture as :meth:`future_waypoints`."""
        self._bracket(t_ns)
        return np.array([self.speed_at(t_ns + dt) for dt in WAYPOINT_OFFSETS_NS])


def constant_velocity_waypoints(velocity: Sequence[float]) -> np.ndarray:
    """The constant-velocity baseline: the ego keeps its ego-frame velocity; [8, 2] metres."""
    v = np.asarray(velocity, dtype=np.float64).reshape(1, 2)
    t = np.asarray(WAYPOINT_OFFSETS_NS, dtype=np.float64).reshape(-1, 1) / 1e9
    return t * v


def is_finite_waypoints(points) -> bool:
    return points is not None and np.shape(points) == (NUM_WAYPOINTS, 2) and bool(np.isfinite(points).all())
