"""Waypoints -> vehicle control, as TransFuser / TCP do for 0.5 s waypoints (the rules: docs/carla.md, "The
controller"). ROS-free. The plan is followed as it stands *now*: its waypoints are moved into the current ego
frame with the ego poses at its stamp and now, and resampled at now + 0.5 s and + 1.0 s. CARLA's steer is
positive to the right; the ego frame (REP-103) has y to the left. A missing, invalid or stale plan gives a
full brake with the wheels straight: the controller never accelerates on it.

    ctl = WaypointController()
    control = ctl.step(plan, ego_pose_now, speed_mps, now_s)     # VehicleControl(throttle, steer, brake, ...)
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .geometry import ego_to_world, world_to_ego
from .outputs.prompts import WAYPOINT_DT_S
from .utils.fields import setting


@dataclass(frozen=True)
class Pose2D:
    """Ego pose in the odometry frame: position (m) and heading (rad, counter-clockwise from x)."""

    x: float
    y: float
    yaw: float


@dataclass(frozen=True)
class Plan:
    """A trajectory as published: waypoints in the ego frame at ``stamp_s``, 0.5 s apart."""

    stamp_s: float
    waypoints: np.ndarray            # [N, 2] metres, ego frame at stamp_s
    valid: bool = True
    ego_pose: Pose2D | None = None   # ego pose at stamp_s (None: look it up in the pose history)


@dataclass(frozen=True)
class VehicleControl:
    """CARLA's control: throttle and brake in [0, 1], steer in [-1, 1] with + turning **right**."""

    throttle: float = 0.0
    steer: float = 0.0               # -1 (left) .. 1 (right), CARLA convention
    brake: float = 0.0
    hand_brake: bool = False
    reverse: bool = False
    reason: str = ""                 # why a fallback brake was applied; empty when following a plan

    def __post_init__(self):
        for name, low in (("throttle", 0.0), ("steer", -1.0), ("brake", 0.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= 1.0):
                raise ValueError(f"VehicleControl.{name} must be in [{low:g}, 1], got {value!r}")


@dataclass
class ControllerGains:
    """TransFuser's defaults; the controller node's ``control.*`` parameters."""

    turn_kp: float = setting(1.25, "steering PID: proportional gain on the angle to the aim point (angle / 90 deg "
                             "-> steer)", low=0.0, high=100.0)
    turn_ki: float = setting(0.75, "steering PID: gain on the mean error over turn_window ticks", low=0.0, high=100.0)
    turn_kd: float = setting(0.3, "steering PID: gain on the change of the error since the last tick",
                             low=0.0, high=100.0)
    turn_window: int = setting(40, "steering PID: integral window (ticks)", low=1, high=100000)
    speed_kp: float = setting(5.0, "throttle PID: proportional gain on the speed error (m/s -> throttle)",
                              low=0.0, high=100.0)
    speed_ki: float = setting(0.5, "throttle PID: gain on the mean error over speed_window ticks", low=0.0, high=100.0)
    speed_kd: float = setting(1.0, "throttle PID: gain on the change of the error since the last tick",
                              low=0.0, high=100.0)
    speed_window: int = setting(40, "throttle PID: integral window (ticks)", low=1, high=100000)
    brake_speed_mps: float = setting(0.4, "brake when the plan's desired speed (2 x its first 0.5 s segment) is "
                                     "below this (m/s)", low=0.0, high=100.0)
    brake_ratio: float = setting(1.1, "brake when the speed is above this times the desired speed", low=1.0, high=10.0)
    clip_delta_mps: float = setting(0.25, "the speed error fed to the throttle PID is clipped to 0 .. this (m/s)",
                                    low=0.0, high=100.0)
    max_throttle: float = setting(0.75, "throttle cap", low=0.0, high=1.0)
    plan_timeout_s: float = setting(1.0, "a plan older than this (sim time since its image stamp) is stale: full "
                                    "brake (seconds)", low=0.0, high=3600.0)


class PID:
    """PID with a windowed integral (mean of the last ``window`` errors), as TransFuser's."""

    def __init__(self, kp: float, ki: float, kd: float, window: int):
        self.kp, self.ki, self.kd = kp, ki, kd
        self.errors: deque[float] = deque([0.0] * window, maxlen=window)

    def step(self, error: float) -> float:
        self.errors.append(error)
        integral = float(np.mean(self.errors))
        derivative = self.errors[-1] - self.errors[-2] if len(self.errors) >= 2 else 0.0
        return self.kp * error + self.ki * integral + self.kd * derivative


@dataclass
class PoseHistory:
    """Recent (time, pose) pairs, to look up the ego pose at a plan's stamp."""

    horizon_s: float = 10.0
    items: deque = field(default_factory=deque)

    def add(self, t: float, pose: Pose2D) -> None:
        if self.items and t < self.items[-1][0]:
            self.items.clear()          # time went backwards (a bag restart): start over
        self.items.append((t, pose))
        while self.items and self.items[0][0] < t - self.horizon_s:
            self.items.popleft()

    def at(self, t: float) -> Pose2D | None:
        """Linearly interpolated pose at ``t``; None outside the history."""
        if not self.items or t < self.items[0][0] or t > self.items[-1][0]:
            return None
        times = [a for a, _ in self.items]
        j = int(np.searchsorted(times, t))
        if times[j] == t:
            return self.items[j][1]
        (t0, p0), (t1, p1) = self.items[j - 1], self.items[j]
        w = (t - t0) / (t1 - t0)
        dyaw = math.atan2(math.sin(p1.yaw - p0.yaw), math.cos(p1.yaw - p0.yaw))
        return Pose2D(p0.x + w * (p1.x - p0.x), p0.y + w * (p1.y - p0.y), p0.yaw + w * dyaw)


def shift_plan(plan: Plan, plan_pose: Pose2D, now_pose: Pose2D, elapsed_s: float) -> np.ndarray:
    """The plan's path in the current ego frame, resampled at elapsed + 0.5 s and + 1.0 s: [2, 2]."""
    times = WAYPOINT_DT_S * np.arange(len(plan.waypoints) + 1)                  # 0 = the ego at stamp
    path = np.vstack([[0.0, 0.0], plan.waypoints])
    world = ego_to_world(path, (plan_pose.x, plan_pose.y), plan_pose.yaw)
    local = world_to_ego(world, (now_pose.x, now_pose.y), now_pose.yaw)
    query = np.minimum(elapsed_s + np.array([WAYPOINT_DT_S, 2 * WAYPOINT_DT_S]), times[-1])
    return np.stack([np.interp(query, times, local[:, 0]), np.interp(query, times, local[:, 1])], axis=1)


class WaypointController:
    """Turns the newest plan into control every tick; brakes when there is no usable plan."""

    def __init__(self, gains: ControllerGains | None = None):
        g = self.gains = gains or ControllerGains()
        self.turn = PID(g.turn_kp, g.turn_ki, g.turn_kd, g.turn_window)
        self.speed = PID(g.speed_kp, g.speed_ki, g.speed_kd, g.speed_window)
        self.poses = PoseHistory()

    def brake(self, reason: str) -> VehicleControl:
        return VehicleControl(throttle=0.0, steer=0.0, brake=1.0, reason=reason)

    def step(self, plan: Plan | None, pose: Pose2D, speed_mps: float, now_s: float) -> VehicleControl:
        g = self.gains
        self.poses.add(now_s, pose)
        if plan is None:
            return self.brake("no plan")
        if not plan.valid or not np.all(np.isfinite(plan.waypoints)) or len(plan.waypoints) < 2:
            return self.brake("invalid plan")
        elapsed = now_s - plan.stamp_s
        if elapsed > g.plan_timeout_s:
            return self.brake(f"stale plan ({elapsed:.2f} s old)")
        if not math.isfinite(speed_mps):
            return self.brake("invalid speed")
        plan_pose = plan.ego_pose or self.poses.at(plan.stamp_s) or pose
        wp = shift_plan(plan, plan_pose, pose, max(elapsed, 0.0))                # [2, 2]
        desired = 2.0 * float(np.linalg.norm(wp[1] - wp[0]))
        brake = desired < g.brake_speed_mps or speed_mps > g.brake_ratio * desired
        delta = float(np.clip(desired - speed_mps, 0.0, g.clip_delta_mps))
        throttle = float(np.clip(self.speed.step(delta), 0.0, g.max_throttle))
        aim = wp.mean(axis=0)
        angle = math.degrees(math.atan2(-aim[1], aim[0])) / 90.0                 # + = right (CARLA)
        steer = float(np.clip(self.turn.step(angle), -1.0, 1.0))
        return VehicleControl(throttle=0.0 if brake else throttle, steer=steer, brake=1.0 if brake else 0.0)
