"""The speed profile (wam_diff2_core/speed_profile.py): plans -> points every 0.1 s with heading, speed,
acceleration and heading rate, from the ego at its measured speed, within the physical limits."""
from __future__ import annotations

import math

import numpy as np
import pytest

from wam_diff2_core.speed_profile import ProfileLimits, speed_profile

LIMITS = ProfileLimits()
T = np.arange(1, 9) * 0.5                          # the plan's waypoint times


def _straight(speed):
    return np.stack([speed * T, np.zeros(8)], axis=1)


def test_a_plan_at_the_measured_speed_is_followed_exactly():
    p = speed_profile(_straight(10.0), 10.0)
    assert len(p) == 41 and np.allclose(np.diff(p.t), 0.1) and p.t[0] == 0 and math.isclose(p.t[-1], 4.0)
    assert np.allclose(p.speed, 10.0) and np.allclose(p.accel, 0.0) and np.allclose(p.heading, 0.0)
    assert np.allclose(p.x, 10.0 * p.t) and np.allclose(p.y, 0.0) and np.allclose(p.heading_rate, 0.0)


def test_the_first_point_is_the_ego_at_its_measured_speed_and_acceleration_is_bounded():
    p = speed_profile(_straight(10.0), 5.0)
    assert (p.x[0], p.y[0], p.speed[0]) == (0.0, 0.0, 5.0)
    assert np.all(np.diff(p.speed) <= LIMITS.max_accel_mps2 * LIMITS.step_s + 1e-9)
    reached = p.t[np.argmax(p.speed >= 10.0 - 1e-9)]
    assert math.isclose(reached, math.ceil(5.0 / 3.0 / 0.1) * 0.1, abs_tol=1e-9)      # 3 m/s^2 from 5 to 10 m/s


def test_a_stop_plan_brakes_at_the_deceleration_limit_and_goes_on_straight_past_the_plan():
    p = speed_profile(np.zeros((8, 2)), 8.0)
    assert p.speed[0] == 8.0 and p.speed[-1] == 0.0
    assert np.all(np.diff(p.speed) >= -LIMITS.max_decel_mps2 * LIMITS.step_s - 1e-9)
    assert math.isclose(p.x[-1], 8.0 ** 2 / (2 * 6.0), rel_tol=0.02) and np.allclose(p.y, 0.0)   # v^2 / 2a
    assert np.allclose(p.heading, 0.0)


def test_standing_still_stays_still():
    p = speed_profile(np.zeros((8, 2)), 0.0)
    assert np.all(p.speed == 0) and np.all(p.x == 0) and np.all(p.accel == 0) and np.all(p.heading_rate == 0)


def test_a_curve_is_driven_within_the_lateral_limit_with_the_heading_rate_of_the_arc():
    radius, speed = 10.0, 10.0                           # 10 m/s^2 of lateral acceleration as planned
    angle = speed * T / radius
    plan = np.stack([radius * np.sin(angle), radius * (1 - np.cos(angle))], axis=1)
    p = speed_profile(plan, 6.0)
    v_max = math.sqrt(LIMITS.max_lateral_accel_mps2 * radius)
    assert np.all(p.speed <= v_max * 1.05)               # the chord polyline's curvature is a little lower
    middle = slice(5, 30)
    assert np.allclose(p.heading_rate[middle], p.speed[middle] / radius, rtol=0.1)
    assert 0 < p.heading[-1] < angle[-1]


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_give_finite_bounded_points(seed):
    rng = np.random.default_rng(seed)
    plan = np.cumsum(rng.normal(0, 3, (8, 2)), axis=0)
    p = speed_profile(plan, float(rng.uniform(0, 30)))
    for values in (p.t, p.x, p.y, p.heading, p.speed, p.accel, p.heading_rate):
        assert np.isfinite(values).all()
    assert np.all(p.speed >= 0) and np.all(p.speed <= LIMITS.max_speed_mps)
    assert np.all(p.accel <= LIMITS.max_accel_mps2 + 1e-9) and np.all(p.accel >= -LIMITS.max_decel_mps2 - 1e-9)
    chord = np.hypot(np.diff(p.x), np.diff(p.y))         # spacing consistent with the speeds (the path's
    assert np.all(chord <= 0.5 * (p.speed[1:] + p.speed[:-1]) * 0.1 + 1e-9)   # corners shorten chords)


@pytest.mark.parametrize("plan,speed,message", [
    (np.full((8, 2), np.nan), 1.0, "waypoints: not finite"),
    (np.zeros((8, 3)), 1.0, "waypoints: expected"),
    (np.zeros((8, 2)), -1.0, "measured_speed_mps"),
    (np.zeros((8, 2)), float("inf"), "measured_speed_mps")])
def test_bad_input_is_named(plan, speed, message):
    with pytest.raises(ValueError, match=message):
        speed_profile(plan, speed)


def test_bad_limits_are_named():
    with pytest.raises(ValueError, match="max_decel_mps2"):
        ProfileLimits(max_decel_mps2=0.0)


def test_planned_speeds_are_the_plans_own_speed_intent():
    from wam_diff2_core.speed_profile import planned_speeds
    assert np.allclose(planned_speeds(_straight(7.0)), 7.0)
    slowing = np.stack([np.cumsum(np.linspace(4.0, 0.5, 8)), np.zeros(8)], axis=1)    # metres per 0.5 s
    speeds = planned_speeds(slowing)
    assert np.all(np.diff(speeds) < 0) and np.all(speeds >= 0)
    assert np.allclose(planned_speeds(np.zeros((8, 2))), 0.0)
