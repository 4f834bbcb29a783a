"""The expert that drives the ego and so defines the ground-truth future: pure pursuit on the ego lane centre,
and the highest speed from which every curve ahead can be taken (:func:`anticipated_speed_limit`), never
above what IDM allows behind the vehicle ahead, clipped to comfort limits and jerk-limited.

    >>> from .road import Straight, RoadSettings, build_road
    >>> lane = build_road([Straight(100.0)], RoadSettings()).lane
    >>> expert = ExpertDriver(lane, BicycleParams(), ExpertSettings(cruise_speed_mps=10.0))
    >>> command = expert.act(EgoState(lane.points[0, 0], lane.points[0, 1], 0.0, speed=5.0), 0.0, None, 0.05)
    >>> command.acceleration_mps2 > 0, abs(command.steer_angle_rad) < 1e-9
    (True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .road import Path2D
from .vehicles import (Actuation, BicycleParams, EgoState, IdmParams, anticipated_speed_limit,
                       idm_acceleration)


@dataclass(frozen=True)
class Leader:
    """The vehicle ahead in the ego lane: bumper-to-bumper gap along the lane and its speed."""
    vehicle_id: int
    gap_m: float
    speed: float


@dataclass(frozen=True)
class ExpertSettings:
    cruise_speed_mps: float = 10.0
    lateral_accel_mps2: float = 2.0      # curve speed: v^2 * curvature <= this
    planning_decel_mps2: float = 1.5     # braking assumed when anticipating curves
    speed_gain_per_s: float = 1.5        # speed error -> acceleration
    max_accel_mps2: float = 2.0
    max_decel_mps2: float = 6.0
    max_jerk_mps3: float = 6.0
    lookahead_min_m: float = 2.5         # pure pursuit look-ahead = clip(min + gain * v, min, max)
    lookahead_gain_s: float = 0.5
    lookahead_max_m: float = 16.0
    idm: IdmParams = field(default_factory=IdmParams)


class ExpertDriver:
    """Pure pursuit + speed control on one lane; stateless apart from the settings."""

    def __init__(self, lane: Path2D, params: BicycleParams, settings: ExpertSettings):
        self.lane, self.params, self.settings = lane, params, settings

    def lookahead_m(self, speed: float) -> float:
        st = self.settings
        return min(max(st.lookahead_min_m + st.lookahead_gain_s * speed, st.lookahead_min_m), st.lookahead_max_m)

    def steer(self, ego: EgoState, lane_s: float) -> float:
        """Pure pursuit from the rear axle: delta = atan(2 L sin(alpha) / l_d)."""
        tx, ty, _ = self.lane.pose_at(lane_s + self.lookahead_m(ego.speed))
        dx, dy = tx - ego.x, ty - ego.y
        alpha = math.atan2(dy, dx) - ego.yaw
        distance = max(math.hypot(dx, dy), 1e-3)
        return math.atan2(2.0 * self.params.wheelbase_m * math.sin(alpha), distance)

    def acceleration(self, ego: EgoState, lane_s: float, leader: Leader | None, dt: float) -> float:
        st = self.settings
        allowed = anticipated_speed_limit(self.lane, lane_s, st.cruise_speed_mps, st.lateral_accel_mps2,
                                          st.planning_decel_mps2)
        accel = st.speed_gain_per_s * (allowed - ego.speed)
        if leader is not None:
            accel = min(accel, idm_acceleration(ego.speed, allowed, leader.gap_m, leader.speed, st.idm))
        accel = min(max(accel, -st.max_decel_mps2), st.max_accel_mps2)
        # jerk limit relative to the acceleration actually applied over the last step
        previous = ego.acceleration
        return min(max(accel, previous - st.max_jerk_mps3 * dt), previous + st.max_jerk_mps3 * dt)

    def act(self, ego: EgoState, lane_s: float, leader: Leader | None, dt: float) -> Actuation:
        return Actuation(self.acceleration(ego, lane_s, leader, dt), self.steer(ego, lane_s))
