"""Vehicle models of the demo world: the ego's kinematic bicycle, traffic on lanes, IDM, speed limits.

The ego is a kinematic bicycle referenced at the **rear axle** (the ego frame origin, as in NAVSIM); one step
integrates the arc of the step's constant curvature tan(delta) / L and acceleration exactly. It is driven by
an :class:`Actuation` (acceleration and steering angle, + left: the expert's) or CARLA's
:class:`VehicleControl` (steer + **right**), mapped by :meth:`KinematicBicycle.actuation_from_control`.

    >>> model = KinematicBicycle(BicycleParams(wheelbase_m=2.8))
    >>> state = EgoState(x=0.0, y=0.0, yaw=0.0, speed=10.0)
    >>> state = model.step(state, Actuation(acceleration_mps2=0.0, steer_angle_rad=0.0), 0.05)
    >>> round(state.x, 3), state.y
    (0.5, 0.0)
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from ..control import VehicleControl
from ..geometry import DEMO_EGO_BOX, DEMO_EGO_WHEELBASE_M, EgoBox
from .road import Path2D


@dataclass(frozen=True)
class VehicleShape:
    label: str            # detection class (DEFAULT_DETECTION_CLASSES)
    length_m: float
    width_m: float
    height_m: float


VEHICLE_SHAPES = {
    "car": VehicleShape("car", 4.5, 1.85, 1.5),
    "suv": VehicleShape("car", 4.8, 1.95, 1.8),
    "truck": VehicleShape("truck", 7.5, 2.4, 3.2),
    "bus": VehicleShape("bus", 11.5, 2.55, 3.2),
}
TRAFFIC_MIX = {"car": 0.6, "suv": 0.2, "truck": 0.12, "bus": 0.08}


@dataclass(frozen=True)
class BicycleParams:
    wheelbase_m: float = DEMO_EGO_WHEELBASE_M
    rear_overhang_m: float = DEMO_EGO_BOX.rear_overhang_m     # rear axle -> rear bumper
    length_m: float = DEMO_EGO_BOX.length_m
    width_m: float = DEMO_EGO_BOX.width_m
    height_m: float = 1.5
    max_steer_rad: float = 0.6        # ~34 deg at the front wheel
    max_accel_mps2: float = 3.5       # full throttle at standstill
    max_decel_mps2: float = 8.0       # full brake
    max_speed_mps: float = 30.0       # throttle authority fades to 0 here
    rolling_decel_mps2: float = 0.3   # coasting (no throttle, no brake)

    @property
    def front_from_axle_m(self) -> float:
        """Rear axle -> front bumper."""
        return self.length_m - self.rear_overhang_m

    @property
    def centre_from_axle_m(self) -> float:
        """Rear axle -> centre of the bounding box (forward)."""
        return EgoBox(self.length_m, self.width_m, self.rear_overhang_m).centre_from_axle_m


@dataclass(frozen=True)
class EgoState:
    """Ego at one tick: rear-axle pose in the map frame and its motion."""
    x: float
    y: float
    yaw: float
    speed: float                       # m/s along the heading (never negative)
    steer_angle: float = 0.0           # rad, + left
    acceleration: float = 0.0          # m/s^2 longitudinal, over the last step
    yaw_rate: float = 0.0              # rad/s over the last step


@dataclass(frozen=True)
class Actuation:
    acceleration_mps2: float
    steer_angle_rad: float            # + left (REP-103)


class KinematicBicycle:
    def __init__(self, params: BicycleParams = BicycleParams()):
        self.params = params

    def actuation_from_control(self, control: VehicleControl, speed: float) -> Actuation:
        """throttle -> max_accel * (1 - v / max_speed); brake -> max_decel; neither: rolling
        resistance; steer -> -steer * max_steer (CARLA + right is REP-103 - left)."""
        p = self.params
        drive = control.throttle * p.max_accel_mps2 * max(0.0, 1.0 - speed / p.max_speed_mps)
        resist = control.brake * p.max_decel_mps2 + (p.rolling_decel_mps2 if speed > 0 else 0.0)
        return Actuation(drive - resist, -control.steer * p.max_steer_rad)

    def step(self, state: EgoState, actuation: Actuation, dt: float) -> EgoState:
        """Advance ``dt`` seconds with constant acceleration and steering (clamped to limits)."""
        p = self.params
        accel = float(np.clip(actuation.acceleration_mps2, -p.max_decel_mps2, p.max_accel_mps2))
        steer = float(np.clip(actuation.steer_angle_rad, -p.max_steer_rad, p.max_steer_rad))
        v0 = state.speed
        distance, v1 = speed_step(v0, accel, dt)
        curvature = math.tan(steer) / p.wheelbase_m
        dyaw = curvature * distance
        if abs(dyaw) < 1e-9:
            x = state.x + distance * math.cos(state.yaw)
            y = state.y + distance * math.sin(state.yaw)
        else:                            # exact arc of radius 1 / curvature
            x = state.x + (math.sin(state.yaw + dyaw) - math.sin(state.yaw)) / curvature
            y = state.y + (math.cos(state.yaw) - math.cos(state.yaw + dyaw)) / curvature
        return EgoState(x=x, y=y, yaw=state.yaw + dyaw, speed=v1, steer_angle=steer,
                        acceleration=(v1 - v0) / dt, yaw_rate=dyaw / dt)


def speed_step(speed: float, accel: float, dt: float) -> tuple[float, float]:
    """(distance, speed) after ``dt`` s at ``accel`` from ``speed``: braking to a stop within the step stops
    there (no reversing)."""
    end = speed + accel * dt
    if end < 0.0:
        return (speed * speed / (2.0 * -accel) if accel < 0 else 0.0), 0.0
    return 0.5 * (speed + end) * dt, end


@dataclass(frozen=True)
class IdmParams:
    """Intelligent Driver Model (Treiber et al. 2000) car-following."""
    max_accel_mps2: float = 1.6
    comfort_decel_mps2: float = 2.0
    time_headway_s: float = 1.4
    min_gap_m: float = 3.0
    exponent: float = 4.0


def idm_acceleration(speed: float, desired_speed: float, gap_m: float | None, leader_speed: float,
                     p: IdmParams) -> float:
    """IDM acceleration; ``gap_m`` bumper to bumper (None: free road). A desired speed of (about) zero means
    "stop": the free-road term brakes comfortably to standstill instead of IDM's unbounded -(v / v0)^4."""
    if desired_speed <= 0.05:
        free = -min(p.comfort_decel_mps2, speed / 0.5)
    else:
        free = p.max_accel_mps2 * (1.0 - (speed / desired_speed) ** p.exponent)
    if gap_m is None:
        return free
    desired_gap = p.min_gap_m + max(0.0, speed * p.time_headway_s + speed * (speed - leader_speed)
                                    / (2.0 * math.sqrt(p.max_accel_mps2 * p.comfort_decel_mps2)))
    return free - p.max_accel_mps2 * (desired_gap / max(gap_m, 0.1)) ** 2


def anticipated_speed_limit(path: Path2D, s: float, cruise_mps: float, lateral_accel_mps2: float,
                            decel_mps2: float) -> float:
    """The highest speed now from which every curve ahead can be taken at ``lateral_accel_mps2`` after braking at
    ``decel_mps2`` (:meth:`Path2D.speed_profile`), capped at ``cruise_mps``."""
    profile = path.speed_profile(lateral_accel_mps2, decel_mps2)
    i = bisect.bisect_left(path._s_list, s)
    if i >= len(profile):
        return cruise_mps
    return min(cruise_mps, math.sqrt(max(0.0, float(profile[i]) - 2.0 * decel_mps2 * s)))


@dataclass(frozen=True)
class SpeedEvent:
    """Between ``start_s`` and ``end_s`` (sim time) the vehicle wants ``factor`` x its cruise speed."""
    start_s: float
    end_s: float
    factor: float


@dataclass
class TrafficVehicle:
    """A vehicle on rails: its box centre follows ``path`` at arc length ``s``."""
    id: int
    shape: VehicleShape
    colour: tuple[int, int, int]      # RGB
    path_name: str                    # which lane (key of World.lanes)
    s: float
    speed: float
    cruise_mps: float
    events: tuple[SpeedEvent, ...] = ()
    parked: bool = False              # never moves (waiting at a side road)
    acceleration: float = 0.0

    def desired_speed(self, time_s: float) -> float:
        return self.cruise_mps * min([1.0] + [e.factor for e in self.events if e.start_s <= time_s < e.end_s])

    @property
    def braking(self) -> bool:
        return self.acceleration < -0.5 or (self.speed < 0.1 and not self.parked)

