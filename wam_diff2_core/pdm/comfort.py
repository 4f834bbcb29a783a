"""Comfort (C) of the PDM score: nuPlan's six checks on the tracked ego (``pdm_comfort_metrics.py``).

nuPlan smooths with Savitzky-Golay filters (scipy's ``savgol_filter``, not a dependency here); they
are computed with numpy as the local least-squares polynomial fits they are, with the same windows,
orders and edge handling (the even 8-sample window read half a sample late, as scipy reads it).

    comfort_checks(track_plan(plan, EgoStart(speed_mps=8.0)))    # {"lon_acceleration": True, ...}
"""
from __future__ import annotations

import math

import numpy as np

from .scene import SIM_DT_S
from .tracking import EgoRollout

# pdm_comfort_metrics.py (nuPlan's comfort bounds)
MAX_LON_ACCEL_MPS2, MIN_LON_ACCEL_MPS2 = 2.40, -4.05
MAX_ABS_LAT_ACCEL_MPS2 = 4.89
MAX_ABS_JERK_MPS3 = 8.37
MAX_ABS_LON_JERK_MPS3 = 4.13
MAX_ABS_YAW_ACCEL_RPS2 = 1.93
MAX_ABS_YAW_RATE_RPS = 0.95
ACCEL_SMOOTHING_WINDOW = 8                   # _extract_ego_acceleration's default window (jerk's input)
YAW_WINDOW = 5                               # _approximate_derivatives' default window (yaw rate, yaw accel)


def _local_polynomial(y: np.ndarray, window: int, order: int, deriv: int, dt: float) -> np.ndarray:
    """[N] Savitzky-Golay as scipy's ``savgol_filter(mode="interp")`` computes it: the ``deriv``-th derivative of
    a degree-``order`` least-squares polynomial over ``window`` samples (at most N), centred on sample i (an even
    window, i - w/2 + 1 ... i + w/2, read half a sample after i); within half a window of either end, the first /
    last window's fit read at sample i itself."""
    n = len(y)
    window = min(window, n)
    half, centre = window // 2, (window - 1) / 2.0
    out = np.empty(n)
    for i in range(n):
        if half <= i < n - half:
            start = i - int(math.floor(centre))
            read_at = start + centre                                          # i, or i + 0.5 for an even window
        else:
            start, read_at = (0 if i < half else n - window), float(i)
        offsets = np.arange(start, start + window) - read_at                 # samples, 0 where it is read
        coefficients = np.linalg.lstsq(np.vander(offsets.astype(float), order + 1, increasing=True),
                                       y[start:start + window], rcond=None)[0]
        out[i] = math.factorial(deriv) * coefficients[deriv] / dt ** deriv if deriv <= order else 0.0
    return out


def comfort_checks(rollout: EgoRollout) -> dict[str, bool]:
    """nuPlan's six comfort checks on the tracked ego (each: every sample strictly within its bounds)."""
    n = len(rollout.t_s)
    lon = rollout.acceleration
    lat = np.zeros(n)                                                         # the model's state has none
    yaw = np.unwrap(rollout.heading)

    def within(values, low, high):
        return bool(((values > low) & (values < high)).all())

    def fit(values, window, order, deriv):
        return _local_polynomial(values, window, order, deriv, SIM_DT_S)

    smooth_lon = fit(lon, ACCEL_SMOOTHING_WINDOW, 2, 0)
    smooth_mag = fit(np.hypot(lon, lat), ACCEL_SMOOTHING_WINDOW, 2, 0)
    return {
        "lon_acceleration": within(fit(lon, n, 2, 0), MIN_LON_ACCEL_MPS2, MAX_LON_ACCEL_MPS2),
        "lat_acceleration": within(fit(lat, n, 2, 0), -MAX_ABS_LAT_ACCEL_MPS2, MAX_ABS_LAT_ACCEL_MPS2),
        "jerk": within(fit(smooth_mag, n, 2, 1), -MAX_ABS_JERK_MPS3, MAX_ABS_JERK_MPS3),
        "lon_jerk": within(fit(smooth_lon, n, 2, 1), -MAX_ABS_LON_JERK_MPS3, MAX_ABS_LON_JERK_MPS3),
        "yaw_acceleration": within(fit(yaw, YAW_WINDOW, 3, 2), -MAX_ABS_YAW_ACCEL_RPS2, MAX_ABS_YAW_ACCEL_RPS2),
        "yaw_rate": within(fit(yaw, YAW_WINDOW, 2, 1), -MAX_ABS_YAW_RATE_RPS, MAX_ABS_YAW_RATE_RPS),
    }

