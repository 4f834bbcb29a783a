"""The ego driving a plan for 4 s, as NAVSIM v1 simulates it (``pdm_simulator.py``) before scoring it: the plan,
the ego at t = 0 in front and a heading per waypoint (:func:`plan_headings`), interpolated to 0.1 s; nuPlan's
regularised least-squares speed / curvature profiles (:func:`speed_and_curvature_profiles`); NAVSIM's LQR
tracker commanding acceleration and steering rate to a kinematic bicycle at the rear axle (Euler steps,
first-order lags, steering <= 60 deg; no lateral acceleration, as NAVSIM's). The constants are NAVSIM's,
named with their source; evaluation/README.md, "PDM score", says where this differs (the headings).

    rollout = track_plan(plan, EgoStart(speed_mps=8.0))          # EgoRollout, [41] per field
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..geometry import path_headings, wrap_angle
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .scene import SIM_DT_S, SIM_STEPS, EgoStart, Vehicle

# batch_kinematic_bicycle.py
MAX_STEERING_RAD = math.pi / 3
ACCEL_TIME_CONSTANT_S = 0.2
STEERING_TIME_CONSTANT_S = 0.05
# batch_lqr.py BatchLQRTracker defaults
LQR_Q_LONGITUDINAL, LQR_R_LONGITUDINAL = 10.0, 1.0
LQR_Q_LATERAL = (1.0, 10.0, 0.0)             # lateral error, heading error, steering angle
LQR_R_LATERAL = 1.0
LQR_HORIZON_STEPS = 10
LQR_JERK_PENALTY = 1e-4
LQR_CURVATURE_RATE_PENALTY = 1e-2
LQR_INITIAL_CURVATURE_PENALTY = 1e-10        # batch_lqr_utils.py
STOPPING_GAIN = 0.5
STOPPING_SPEED_MPS = 0.2


@dataclass(frozen=True)
class EgoRollout:
    """The tracked ego every :data:`SIM_DT_S` from 0 to 4 s ([41] each), rear axle, ego frame at t = 0."""

    t_s: np.ndarray
    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    speed: np.ndarray           # m/s along the heading
    acceleration: np.ndarray    # m/s^2, longitudinal (the model has no lateral one)
    steering: np.ndarray        # rad


def check_plan(plan) -> np.ndarray:
    """``plan`` as [8, 2] float64; ValueError naming what is wrong with it."""
    points = np.asarray(plan, dtype=np.float64)
    if points.shape != (NUM_WAYPOINTS, 2):
        raise ValueError(f"plan must be [{NUM_WAYPOINTS}, 2] waypoints (0.5 ... 4.0 s, metres), "
                         f"got shape {points.shape}")
    bad = ~np.isfinite(points).all(axis=1)
    if bad.any():
        raise ValueError(f"plan waypoints must be finite; waypoint(s) {np.flatnonzero(bad).tolist()} are not: "
                         f"{points[bad].tolist()}")
    return points


def plan_headings(plan: np.ndarray) -> np.ndarray:
    """[8] a heading per waypoint (the model gives none): the mean direction of the chords before and after it (the
    origin, heading 0, before the first; the last turned on by half the last change), exact on lines and arcs."""
    chords = np.unwrap(path_headings(plan))                                   # [8] direction into each waypoint
    headings = np.empty(NUM_WAYPOINTS)
    headings[:-1] = (chords[:-1] + chords[1:]) / 2.0
    headings[-1] = chords[-1] + (chords[-1] - chords[-2]) / 2.0
    return headings


def reference_poses(plan: np.ndarray) -> np.ndarray:
    """[41, 3] (x, y, heading) every 0.1 s from the ego at the origin through the waypoints (:func:`plan_headings`),
    linearly (heading unwrapped), as NAVSIM interpolates a plan before tracking it."""
    points = np.vstack([[0.0, 0.0], plan])                                    # [9, 2]
    headings = np.unwrap(np.concatenate([[0.0], plan_headings(plan)]))        # [9]
    times = np.arange(NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    t = np.arange(SIM_STEPS + 1) * SIM_DT_S
    return np.stack([np.interp(t, times, points[:, 0]), np.interp(t, times, points[:, 1]),
                     np.interp(t, times, headings)], axis=1)


def speed_and_curvature_profiles(poses: np.ndarray, dt: float = SIM_DT_S) -> tuple[np.ndarray, np.ndarray]:
    """([M] speed, [M] curvature) of the M steps between ``poses`` [M + 1, 3], by nuPlan's regularised
    least squares: each displacement = dt x speed x (cos, sin)(heading) with speed = v0 + integrated
    accelerations (penalised by the "jerk" penalty), each heading change = dt x speed x curvature with
    curvature = k0 + integrated curvature rates (penalised)."""
    steps = np.diff(poses, axis=0)                                            # [M, 3]
    m = len(steps)
    heading = poses[:-1, 2]
    direction = np.stack([np.cos(heading), np.sin(heading)], axis=1)         # [M, 2]
    # unknowns (v0, a_0 ... a_{M-2}): displacement_k = dt * (v0 + dt * sum_{j<k} a_j) * direction_k;
    # coefficients [M, M] maps them to the speeds v_k
    coefficients = np.concatenate([np.ones((m, 1)), dt * np.tri(m, m - 1, k=-1)], axis=1)
    a = (dt * coefficients[:, None, :] * direction[:, :, None]).reshape(2 * m, m)
    # nuPlan's "jerk" regulariser as it is built (batch_lqr_utils._make_banded_difference_matrix writes the
    # -1 band over the +1 band): it penalises a_0 ... a_{M-3} themselves and only the last difference
    # a_{M-2} - a_{M-3}; NAVSIM's scores were computed with it, so it is kept
    jerk = np.zeros((m - 2, m))
    jerk[np.arange(m - 2), np.arange(1, m - 1)] = -1.0
    jerk[m - 3, m - 1] = 1.0
    solution = np.linalg.pinv(a.T @ a + LQR_JERK_PENALTY * jerk.T @ jerk) @ a.T @ steps[:, :2].reshape(-1)
    speed = coefficients @ solution                                           # [M]
    # unknowns (k0, rate_0 ... rate_{M-2}): heading change_k = dt * speed_k * (k0 + dt * sum_{j<k} rate_j)
    c = dt * speed[:, None] * coefficients
    penalty = LQR_CURVATURE_RATE_PENALTY * np.eye(m)
    penalty[0, 0] = LQR_INITIAL_CURVATURE_PENALTY
    solution = np.linalg.pinv(c.T @ c + penalty) @ c.T @ wrap_angle(steps[:, 2])
    return speed, coefficients @ solution


def _lqr_step(state: np.ndarray, reference: np.ndarray, speed_profile: np.ndarray, curvature_profile: np.ndarray,
              index: int, wheelbase_m: float) -> tuple[float, float]:
    """(acceleration, steering rate) commanded at step ``index`` from ``state`` (x, y, heading, v, a, steering)."""
    x, y, heading, v, _, steering = state
    rx, ry, rh = reference[index]
    lateral = -(x - rx) * math.sin(rh) + (y - ry) * math.cos(rh)
    target = min(index + LQR_HORIZON_STEPS, len(speed_profile) - 1)
    v_ref = float(speed_profile[target])
    if v_ref <= STOPPING_SPEED_MPS and v <= STOPPING_SPEED_MPS:
        return -STOPPING_GAIN * (v - v_ref), 0.0
    # longitudinal: the acceleration held over the horizon that best reaches v_ref at its end
    b = LQR_HORIZON_STEPS * SIM_DT_S
    accel = -b * LQR_Q_LONGITUDINAL * (v - v_ref) / (b * LQR_Q_LONGITUDINAL * b + LQR_R_LONGITUDINAL)
    # lateral: linearised (lateral error, heading error, steering) over the horizon at the speeds this
    # acceleration gives and the reference's curvatures; one steering rate held over it
    curvature = np.full(LQR_HORIZON_STEPS, curvature_profile[target])
    curvature[:target - index] = curvature_profile[index:target]
    speeds = v + accel * SIM_DT_S * np.arange(LQR_HORIZON_STEPS)
    a_total, b_total, g_total = np.eye(3), np.zeros(3), np.zeros(3)
    for v_k, k_k in zip(speeds, curvature):
        step = np.eye(3)
        step[0, 1] = v_k * SIM_DT_S
        step[1, 2] = v_k * SIM_DT_S / wheelbase_m
        a_total = step @ a_total
        b_total = step @ b_total + np.array([0.0, 0.0, SIM_DT_S])
        g_total = step @ g_total + np.array([0.0, -v_k * k_k * SIM_DT_S, 0.0])
    error = a_total @ np.array([lateral, wrap_angle(heading - rh), steering]) + g_total
    error[1:] = wrap_angle(error[1:])
    q = np.diag(LQR_Q_LATERAL)
    rate = -(b_total @ q @ error) / (b_total @ q @ b_total + LQR_R_LATERAL)
    return float(accel), float(rate)


def track_plan(plan, ego: EgoStart, vehicle: Vehicle = Vehicle()) -> EgoRollout:
    """The ego driving ``plan`` [8, 2] for 4 s: NAVSIM's LQR tracker on its kinematic bicycle."""
    reference = reference_poses(check_plan(plan))
    speed_profile, curvature_profile = speed_and_curvature_profiles(reference)
    state = np.array([0.0, 0.0, 0.0, ego.speed_mps, ego.acceleration_mps2, ego.steering_angle_rad])
    states = [state]
    for index in range(SIM_STEPS):
        accel_cmd, rate_cmd = _lqr_step(state, reference, speed_profile, curvature_profile, index,
                                        vehicle.wheelbase_m)
        x, y, heading, v, accel, steering = state
        # first-order lags on the commands, then one Euler step from the current pose and steering
        accel = accel + SIM_DT_S / (SIM_DT_S + ACCEL_TIME_CONSTANT_S) * (accel_cmd - accel)
        wanted = steering + SIM_DT_S * rate_cmd
        new_steering = steering + SIM_DT_S / (SIM_DT_S + STEERING_TIME_CONSTANT_S) * (wanted - steering)
        state = np.array([x + v * math.cos(heading) * SIM_DT_S, y + v * math.sin(heading) * SIM_DT_S,
                          float(wrap_angle(heading + v * math.tan(steering) / vehicle.wheelbase_m * SIM_DT_S)),
                          v + accel * SIM_DT_S, accel,
                          min(max(new_steering, -MAX_STEERING_RAD), MAX_STEERING_RAD)])
        states.append(state)
    return EgoRollout(np.arange(SIM_STEPS + 1) * SIM_DT_S, *np.array(states).T)    # states [41, 6]

