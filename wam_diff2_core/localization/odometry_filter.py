"""The odometry filter: GNSS + IMU + speedometer -> pose, heading and speed. ROS-free.

    ref = GeoReference()                                     # CARLA's default georeference, 42.0 / 2.0
    ekf = OdometryFilter(LocalizationSettings())
    ekf.gnss(t, *ref.to_local(lat, lon))                     # NavSatFix -> metres in the map frame
    ekf.imu(t, yaw, yaw_rate, accel_x)                       # Imu: orientation, angular_velocity.z, linear_acceleration.x
    ekf.speed(t, speed)                                      # the speedometer (carla_msgs/CarlaSpeedometer, m/s)
    if ekf.ready:
        ekf.state.x, ekf.state.y, ekf.state.yaw, ekf.state.speed, ekf.covariance    # [4, 4]

An extended Kalman filter over ``[x, y, yaw, v]`` (docs/carla.md, "the localization node"): the IMU drives the
prediction (a unicycle along the midpoint yaw), GNSS positions, the IMU's orientation (CARLA's IMU reports the
sensor's: a compass) and the speedometer are measurements, each predicted to its own stamp first. It is
``ready`` once it has had a position, a heading and a speed since it (re)started (a gap over ``max_gap_s``).
A measurement is checked before it touches the state (``measurements.py``); a refused one leaves the state
as it was and says why in ``refusal`` (``counts["refused_<code>"]``). Fixes beyond the ``gnss_gate_sigma``
gate are refused until ``gnss_reacquire_s`` of them place the position again, so the gate never locks the
filter out; a state that stops being finite restarts the filter: what ``state`` holds is always finite.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from ..geometry import wrap_angle
from ..utils.fields import check_positive, setting
from .georeference import degrees_to_metres
from .measurements import LEADERBOARD_NOISE, MeasurementRefused, bounded, finite, gnss_noise, variance

X, Y, YAW, V = range(4)                # state indices


@dataclass(frozen=True)
class LocalizationSettings:
    gnss_stddev_m: float = setting(degrees_to_metres(LEADERBOARD_NOISE.gnss_deg), "GNSS position standard deviation "
                                   "when a fix carries no covariance (metres; the leaderboard's 5e-6 deg)",
                                   low=1e-4, high=1000.0)
    heading_stddev_rad: float = setting(0.01, "IMU orientation (heading) standard deviation when the message carries "
                                        "no covariance (rad)", low=1e-5, high=10.0)
    speed_stddev_mps: float = setting(0.05, "speedometer standard deviation (m/s)", low=1e-5, high=100.0)
    gyro_noise_radps: float = setting(0.02, "process noise: yaw-rate error between IMU samples (rad/s)",
                                      low=1e-6, high=100.0)
    accel_noise_mps2: float = setting(0.5, "process noise: acceleration error between IMU samples (m/s^2)",
                                      low=1e-6, high=1000.0)
    position_noise_mps: float = setting(0.05, "process noise: motion the unicycle model misses (m/s)",
                                        low=1e-6, high=100.0)
    max_lag_s: float = setting(0.1, "a measurement older than the filter by more than this is refused (seconds)",
                               low=1e-4, high=10.0)
    max_gap_s: float = setting(1.0, "a gap longer than this, or time going back by more, restarts the filter "
                               "(seconds)", low=1e-3, high=3600.0)
    initial_speed_stddev_mps: float = setting(5.0, "speed standard deviation before the first speedometer reading "
                                              "(m/s)", low=1e-3, high=100.0)
    gnss_gate_sigma: float = setting(5.0, "innovation gate: a fix farther than this from the prediction (Mahalanobis "
                                     "distance, the prediction's and the fix's covariance together) is refused "
                                     "(counted gnss_refused_gate)", low=1.0, high=1e6)
    gnss_reacquire_s: float = setting(1.0, "fixes refused by the gate for this long (a real jump) and the next one "
                                      "places the position again, as the first fix does, so the gate never locks out "
                                      "(seconds)", low=0.05, high=3600.0)
    max_speed_mps: float = setting(100.0, "a speedometer reading beyond this is refused (m/s)", low=1.0, high=1000.0)
    max_yaw_rate_radps: float = setting(10.0, "an IMU angular_velocity.z beyond this is refused (rad/s)",
                                        low=0.1, high=1000.0)
    # 100 m/s^2 is 10 g: a crash, not driving
    max_acceleration_mps2: float = setting(100.0, "an IMU linear_acceleration.x beyond this is refused (m/s^2)",
                                           low=1.0, high=10000.0)

    def __post_init__(self):
        check_positive(self)


@dataclass
class FilterState:
    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0
    speed: float = 0.0
    yaw_rate: float = 0.0                  # the newest gyro input (rad/s)
    acceleration: float = 0.0              # the newest accelerometer input (m/s^2)


@dataclass
class OdometryFilter:
    """EKF over [x, y, yaw, v]; feed it measurements in (roughly) stamp order."""
    settings: LocalizationSettings = field(default_factory=LocalizationSettings)

    def __post_init__(self):
        # gnss / imu / speed: used; refused_<code>: refused (MeasurementRefused.code); restarts: a gap or time
        # going back; restarts_non_finite: a state that stopped being finite; gnss_reacquired: see the gate
        self.counts: collections.Counter[str] = collections.Counter()
        self.refusal: MeasurementRefused | None = None      # why the newest measurement was refused (None: used)
        self.last_restart = ""                               # why the filter last restarted ("": it never did)
        self.reset()

    def reset(self) -> None:
        self.state = FilterState()
        self.t: float | None = None
        self.covariance = np.diag([1e6, 1e6, math.pi ** 2, self.settings.initial_speed_stddev_mps ** 2])  # [4, 4]
        self.has_position = self.has_heading = self.has_speed = False
        self.gate_refused_since: float | None = None         # stamp of the first of the fixes the gate refuses in a row
        self.gate_refused_in_row = 0

    @property
    def ready(self) -> bool:
        """A position, a heading and a speed measured since the last (re)start: before the first speedometer
        reading the speed is a guess, and a planner differentiating it would see a jump."""
        return self.has_position and self.has_heading and self.has_speed

    @property
    def _x(self) -> np.ndarray:
        return np.array([self.state.x, self.state.y, self.state.yaw, self.state.speed])

    def _set(self, x: np.ndarray) -> None:
        s = self.state
        s.x, s.y, s.yaw, s.speed = float(x[X]), float(x[Y]), wrap_angle(float(x[YAW])), max(0.0, float(x[V]))

    def _restart(self, why: str, counter: str) -> None:
        self.reset()
        self.last_restart = why
        self.counts[counter] += 1

    def _advance(self, t: float) -> None:
        """Predict to ``t``; raises MeasurementRefused (``late``) when the measurement is too old to use."""
        st = self.settings
        if self.t is None:
            self.t = t
            return
        dt = t - self.t
        if dt > st.max_gap_s or dt < -st.max_gap_s:
            self._restart(f"a gap of {dt:+.3f} s between stamps (beyond +-max_gap_s {st.max_gap_s:g})", "restarts")
            self.t = t
            return
        if dt < -st.max_lag_s:
            raise MeasurementRefused("late", f"stamp {t:.3f} s is {-dt:.3f} s older than the filter's (more than "
                                             f"max_lag_s {st.max_lag_s:g})")
        if dt > 0:
            self._predict(dt)
            self.t = t

    def _predict(self, dt: float) -> None:
        st, s = self.settings, self.state
        w, a = s.yaw_rate, s.acceleration
        v_mid = max(0.0, s.speed + 0.5 * a * dt)
        yaw_mid = s.yaw + 0.5 * w * dt
        c, sn = math.cos(yaw_mid), math.sin(yaw_mid)
        x = self._x + np.array([v_mid * c * dt, v_mid * sn * dt, w * dt, a * dt])
        jac = np.eye(4)                                                     # d new / d old, [4, 4]
        jac[X, YAW], jac[X, V] = -v_mid * sn * dt, c * dt
        jac[Y, YAW], jac[Y, V] = v_mid * c * dt, sn * dt
        pos_var = (st.position_noise_mps * dt) ** 2
        q = np.diag([pos_var, pos_var, (st.gyro_noise_radps * dt) ** 2, (st.accel_noise_mps2 * dt) ** 2])
        with np.errstate(over="ignore", invalid="ignore"):                  # _commit checks the result
            covariance = jac @ self.covariance @ jac.T + q
        self._commit(x, covariance, "the prediction")

    def _update(self, h: np.ndarray, innovation: np.ndarray, r: np.ndarray, what: str) -> None:
        """Kalman update with measurement matrix ``h`` [m, 4], innovation [m], noise ``r`` [m, m] (Joseph form)."""
        p = self.covariance
        with np.errstate(over="ignore", invalid="ignore"):                  # _commit checks the result
            s = h @ p @ h.T + r
            gain = p @ h.T @ np.linalg.inv(s)                               # [4, m]
            i_kh = np.eye(4) - gain @ h
            x, covariance = self._x + gain @ innovation, i_kh @ p @ i_kh.T + gain @ r @ gain.T
        self._commit(x, covariance, what)

    def _commit(self, x: np.ndarray, covariance: np.ndarray, what: str) -> None:
        """The new state, or a restart when it is not finite (never handed on: a NaN stays a NaN for ever)."""
        if not (np.isfinite(x).all() and np.isfinite(covariance).all()):
            self._restart(f"{what} gave a non-finite state", "restarts_non_finite")
            raise MeasurementRefused("non_finite", self.last_restart + ": the filter restarted")
        self.covariance = covariance
        self._set(x)

    def _measure(self, kind: str, apply, *args) -> bool:
        try:
            apply(*args)
        except MeasurementRefused as exc:
            self.refusal = exc
            self.counts["refused_" + exc.code] += 1
            return False
        self.refusal = None
        self.counts[kind] += 1
        return True

    def gnss(self, t: float, x: float, y: float, covariance: np.ndarray | None = None) -> bool:
        """A GNSS position in the map frame (metres); ``covariance`` [2, 2] or None for the settings' figure.
        False: refused (``refusal`` says why)."""
        return self._measure("gnss", self._gnss, t, x, y, covariance)

    def _gnss(self, t: float, x: float, y: float, covariance: np.ndarray | None) -> None:
        t, x, y = finite("stamp", t, "stamp"), finite("x", x, "position"), finite("y", y, "position")
        r = np.eye(2) * self.settings.gnss_stddev_m ** 2 if covariance is None else gnss_noise(covariance)
        self._advance(t)
        if not self.has_position:                        # the first fix places the filter
            self._place([X, Y], (x, y), r, "a GNSS fix")
            self.has_position = True
            return
        h = np.eye(4)[[X, Y]]
        innovation = np.array([x - self.state.x, y - self.state.y])
        s = h @ self.covariance @ h.T + r
        distance = math.sqrt(max(0.0, float(innovation @ np.linalg.solve(s, innovation))))
        st = self.settings
        if distance > st.gnss_gate_sigma:
            if self.gate_refused_since is None:
                self.gate_refused_since = t
            if t - self.gate_refused_since < st.gnss_reacquire_s:
                self.gate_refused_in_row += 1
                raise MeasurementRefused("gate", f"the fix is {distance:.1f} sigma (Mahalanobis) from the prediction, "
                                                 f"beyond gnss_gate_sigma {st.gnss_gate_sigma:g} "
                                                 f"({self.gate_refused_in_row} in a row)")
            self._place([X, Y], (x, y), r, "a GNSS fix")   # refused for gnss_reacquire_s: a real jump, follow it
            self.counts["gnss_reacquired"] += 1
        else:
            self._update(h, innovation, r, "a GNSS fix")
        self.gate_refused_since, self.gate_refused_in_row = None, 0

    def _place(self, index: list[int], values, r: np.ndarray, what: str) -> None:
        """The state at ``index`` set to ``values`` with covariance ``r``, uncorrelated with the rest."""
        x, covariance = self._x, self.covariance.copy()
        x[index] = values
        covariance[index, :] = 0.0
        covariance[:, index] = 0.0
        covariance[np.ix_(index, index)] = r
        self._commit(x, covariance, what)

    def imu(self, t: float, yaw: float | None, yaw_rate: float, acceleration: float,
            yaw_variance: float | None = None) -> bool:
        """An IMU sample: orientation yaw (None: the IMU gives none), gyro z, accelerometer x (ego frame);
        ``yaw_variance`` None for the settings' figure. False: refused (``refusal`` says why)."""
        return self._measure("imu", self._imu, t, yaw, yaw_rate, acceleration, yaw_variance)

    def _imu(self, t: float, yaw: float | None, yaw_rate: float, acceleration: float,
             yaw_variance: float | None) -> None:
        st = self.settings
        t = finite("stamp", t, "stamp")
        yaw_rate = bounded("angular_velocity.z", yaw_rate, st.max_yaw_rate_radps, "max_yaw_rate_radps", "rate")
        acceleration = bounded("linear_acceleration.x", acceleration, st.max_acceleration_mps2,
                                "max_acceleration_mps2", "acceleration")
        if yaw is not None:
            yaw = finite("orientation yaw", yaw, "orientation")
            var = st.heading_stddev_rad ** 2 if yaw_variance is None else variance("orientation variance",
                                                                                   yaw_variance)
        self._advance(t)
        self.state.yaw_rate, self.state.acceleration = yaw_rate, acceleration   # inputs from here on
        if yaw is None:
            return
        if not self.has_heading:
            self._place([YAW], (yaw,), np.array([[var]]), "an IMU heading")
            self.has_heading = True
        else:
            self._update(np.eye(4)[[YAW]], np.array([wrap_angle(yaw - self.state.yaw)]), np.array([[var]]),
                         "an IMU heading")

    def speed(self, t: float, speed: float) -> bool:
        """A speedometer reading (m/s; its magnitude is used). False: refused (``refusal`` says why)."""
        return self._measure("speed", self._speed, t, speed)

    def _speed(self, t: float, speed: float) -> None:
        t = finite("stamp", t, "stamp")
        speed = bounded("speed", speed, self.settings.max_speed_mps, "max_speed_mps", "speed")
        self._advance(t)
        self._update(np.eye(4)[[V]], np.array([abs(speed) - self.state.speed]),
                     np.array([[self.settings.speed_stddev_mps ** 2]]), "a speed")
        self.has_speed = True

    def yaw_rate_variance(self) -> float:
        return self.settings.gyro_noise_radps ** 2
