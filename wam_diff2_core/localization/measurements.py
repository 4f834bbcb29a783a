"""The sensors' measurements before the filter uses them: their noise, and the checks that refuse a hostile
one (finite stamps and values, the settings' ``max_*`` figures, variances within [``MIN_VARIANCE``,
``MAX_VARIANCE``], a positive definite GNSS covariance) with :class:`MeasurementRefused` and a reason code.

Noise defaults (:data:`LEADERBOARD_NOISE`) are the leaderboard's own sensor settings
(``leaderboard/autoagents/agent_wrapper.py``: GNSS 5e-6 deg, about 0.56 m; accelerometer 0.001 m/s^2, gyro
0.001 rad/s); CARLA's speedometer and IMU orientation are exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..geometry import yaw_from_quaternion

# Variances a measurement may claim (its units squared). Below: a sensor claiming micrometre / microradian
# precision, whose inverse would dominate the update's arithmetic; above (100 km, 1e5 rad): a measurement
# that carries no information, and whose products overflow in the update.
MIN_VARIANCE, MAX_VARIANCE = 1e-12, 1e10
QUATERNION_NORM_TOLERANCE = 0.01       # |norm - 1| a message's orientation may have (float32 rounding is ~1e-7)


class MeasurementRefused(ValueError):
    """A measurement the filter does not use: ``code`` (a counter name: ``late``, ``stamp``, ``position``,
    ``covariance``, ``gate``, ``orientation``, ``rate``, ``acceleration``, ``speed``), a message naming the value."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def finite(name: str, value: float, code: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise MeasurementRefused(code, f"{name} is {value!r}, not a finite number")
    return value


def bounded(name: str, value: float, limit: float, setting: str, code: str) -> float:
    value = finite(name, value, code)
    if abs(value) > limit:
        raise MeasurementRefused(code, f"{name} {value!r} is beyond +-{limit:g} ({setting})")
    return value


def variance(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and MIN_VARIANCE <= value <= MAX_VARIANCE):
        raise MeasurementRefused("covariance", f"{name} {value!r} is not a variance in [{MIN_VARIANCE:g}, "
                                               f"{MAX_VARIANCE:g}]")
    return value


def heading_from_quaternion(x: float, y: float, z: float, w: float) -> float:
    """Yaw of an orientation quaternion (rad); raises MeasurementRefused (``orientation``) when a component
    is not finite or the norm is not 1 (within QUATERNION_NORM_TOLERANCE)."""
    q = [finite(f"orientation.{n}", v, "orientation") for n, v in zip("xyzw", (x, y, z, w))]
    norm = math.sqrt(sum(c * c for c in q))
    if not abs(norm - 1.0) <= QUATERNION_NORM_TOLERANCE:
        raise MeasurementRefused("orientation", f"orientation ({x!r}, {y!r}, {z!r}, {w!r}) has norm {norm!r}, "
                                                "not a unit quaternion")
    return yaw_from_quaternion(*(c / norm for c in q))


@dataclass(frozen=True)
class SensorNoise:
    """Standard deviations of the sensors (white, per sample)."""
    gnss_deg: float = 5e-6                 # latitude and longitude each (degrees)
    accel_mps2: float = 0.001              # accelerometer, per axis
    gyro_radps: float = 0.001              # gyroscope, per axis
    compass_rad: float = 0.0               # the IMU's orientation (yaw)
    speed_mps: float = 0.0                 # speedometer


LEADERBOARD_NOISE = SensorNoise()          # the leaderboard's agent_wrapper settings (orientation, speed: exact)


def gnss_noise(covariance) -> np.ndarray:
    """A fix's east / north covariance [2, 2] (m^2) checked: finite, symmetric (its symmetric part is used),
    variances in [MIN_VARIANCE, MAX_VARIANCE], positive definite; raises MeasurementRefused (``covariance``)."""
    r = np.asarray(covariance, dtype=np.float64)
    if r.shape != (2, 2):
        raise MeasurementRefused("covariance", f"the position covariance has shape {r.shape}, not (2, 2)")
    with np.errstate(over="ignore", invalid="ignore"):
        r = 0.5 * (r + r.T)
    if not np.isfinite(r).all():
        raise MeasurementRefused("covariance", f"the position covariance {r.tolist()} is not finite")
    variance("the east variance", r[0, 0])
    variance("the north variance", r[1, 1])
    if np.linalg.eigvalsh(r)[0] < MIN_VARIANCE:
        raise MeasurementRefused("covariance", f"the position covariance {r.tolist()} is not positive definite")
    return r
