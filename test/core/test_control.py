"""The TransFuser-style waypoint controller on scripted plans, with exact expectations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from wam_diff2_core.control import (ControllerGains, Plan, Pose2D, PoseHistory, WaypointController, shift_plan)

ORIGIN = Pose2D(0.0, 0.0, 0.0)


def straight(speed_mps: float, n: int = 8) -> np.ndarray:
    return np.array([[speed_mps * 0.5 * (k + 1), 0.0] for k in range(n)])


def first_pid_output(kp, ki, kd, window, error):
    # Fresh PID: history of zeros, so integral = error / window and derivative = error.
    return kp * error + ki * error / window + kd * error


def test_cruise_at_the_planned_speed_neither_accelerates_nor_steers():
    ctl = WaypointController()
    c = ctl.step(Plan(0.0, straight(8.0)), ORIGIN, 8.0, 0.0)
    assert (c.throttle, c.steer, c.brake) == (0.0, 0.0, 0.0) and c.reason == ""


def test_slower_than_planned_gives_clipped_pid_throttle_capped_at_max():
    g = ControllerGains()
    c = WaypointController().step(Plan(0.0, straight(10.0)), ORIGIN, 9.9, 0.0)
    expected = first_pid_output(g.speed_kp, g.speed_ki, g.speed_kd, g.speed_window, 10.0 - 9.9)
    assert c.throttle == pytest.approx(expected) and c.brake == 0.0
    c = WaypointController().step(Plan(0.0, straight(10.0)), ORIGIN, 2.0, 0.0)  # error clipped to 0.25
    assert c.throttle == g.max_throttle == 0.75


def test_stop_plan_and_overspeed_brake():
    stop = np.zeros((8, 2))
    c = WaypointController().step(Plan(0.0, stop), ORIGIN, 3.0, 0.0)
    assert (c.throttle, c.brake) == (0.0, 1.0)
    c = WaypointController().step(Plan(0.0, straight(10.0)), ORIGIN, 11.5, 0.0)  # > 1.1 x desired
    assert (c.throttle, c.brake) == (0.0, 1.0)
    c = WaypointController().step(Plan(0.0, straight(10.0)), ORIGIN, 10.9, 0.0)  # within 1.1 x
    assert c.brake == 0.0


@pytest.mark.parametrize("side,sign", [(1.0, -1.0), (-1.0, 1.0)])
def test_curve_steers_towards_the_mean_of_the_first_two_waypoints(side, sign):
    g = ControllerGains()
    wp = straight(8.0)
    wp[:, 1] = side * 0.1 * wp[:, 0] ** 2 / 4.0        # curving left (y > 0) or right
    c = WaypointController().step(Plan(0.0, wp), ORIGIN, 8.0, 0.0)
    aim = wp[:2].mean(axis=0)
    angle = math.degrees(math.atan2(-aim[1], aim[0])) / 90.0
    assert c.steer == pytest.approx(first_pid_output(g.turn_kp, g.turn_ki, g.turn_kd, g.turn_window, angle))
    assert np.sign(c.steer) == sign                     # CARLA: positive steer = right


@pytest.mark.parametrize("plan,reason", [
    (None, "no plan"),
    (Plan(0.0, straight(8.0), valid=False), "invalid plan"),
    (Plan(0.0, np.full((8, 2), np.nan)), "invalid plan"),
    (Plan(-1.5, straight(8.0)), "stale plan"),
])
def test_missing_invalid_and_stale_plans_brake_and_never_accelerate(plan, reason):
    c = WaypointController().step(plan, ORIGIN, 5.0, 0.0)
    assert (c.throttle, c.steer, c.brake) == (0.0, 0.0, 1.0) and c.reason.startswith(reason)


def test_plan_is_followed_as_it_stands_now():
    # Plan at t=0 from the origin, 10 m/s straight; at t=0.5 the ego is at x=5 (and turned 90 deg
    # left, to make the frame change visible): the next 0.5 s / 1.0 s points are world (10,0), (15,0).
    plan = Plan(0.0, straight(10.0), ego_pose=ORIGIN)
    now = Pose2D(5.0, 0.0, math.pi / 2)
    wp = shift_plan(plan, ORIGIN, now, 0.5)
    np.testing.assert_allclose(wp, [[0.0, -5.0], [0.0, -10.0]], atol=1e-12)


def test_pose_history_interpolates_and_looks_up_the_plan_pose():
    hist = PoseHistory()
    hist.add(0.0, Pose2D(0.0, 0.0, 0.0))
    hist.add(1.0, Pose2D(10.0, 2.0, 0.2))
    p = hist.at(0.25)
    assert (p.x, p.y, p.yaw) == pytest.approx((2.5, 0.5, 0.05))
    assert hist.at(-0.1) is None and hist.at(1.1) is None
    ctl = WaypointController()
    ctl.step(None, Pose2D(0.0, 0.0, 0.0), 10.0, 0.0)
    c = ctl.step(Plan(0.0, straight(10.0)), Pose2D(5.0, 0.0, 0.0), 10.0, 0.5)   # pose at stamp from history
    assert c.steer == 0.0 and c.brake == 0.0
