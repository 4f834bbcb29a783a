"""Odometry from GNSS + IMU + speedometer: the leaderboard's SENSORS track gives no odometry. ROS-free.

    ref = GeoReference()                                     # CARLA's default georeference, 42.0 / 2.0
    ekf = OdometryFilter(LocalizationSettings())
    ekf.gnss(t, *ref.to_local(lat, lon))                     # NavSatFix -> metres in the map frame
    ekf.imu(t, yaw, yaw_rate, accel_x)                       # Imu: orientation, angular_velocity.z, linear_acceleration.x
    ekf.speed(t, speed)                                      # the speedometer (carla_msgs/CarlaSpeedometer, m/s)
    if ekf.ready:
        ekf.state.x, ekf.state.y, ekf.state.yaw, ekf.state.speed, ekf.covariance    # [4, 4]

**GNSS -> local metres.** CARLA's GNSS sensor turns a world location into latitude / longitude
with a Mercator projection scaled to the map's reference latitude (``cos(lat_ref)``, the earth's
equatorial radius 6378137 m), around the reference latitude / longitude in the town's OpenDRIVE
header; CARLA and the leaderboard use 42.0 / 2.0 where the header names none (every town they
ship), which is :class:`GeoReference`'s default. A route's own reference can be solved from one
point known in both frames (:meth:`GeoReference.solve`, as Bench2Drive agents do with the first
point of the leaderboard's global plan). The public CARLA agents (TransFuser's ``convert_gps_to_carla``,
Roach's ``gps2xyz``) invert that projection; :class:`GeoReference` does the same, in the ROS map
frame the carla-ros-bridge uses (CARLA's world frame with y flipped: x east, y north), so the
result lies in the frame of the bridge's odometry and of the leaderboard's route.

**The filter** is an extended Kalman filter over ``[x, y, yaw, v]`` (the pose of the GNSS
antenna in the map frame, heading, speed along the heading). The IMU drives the prediction
(yaw rate from the gyro, longitudinal acceleration from the accelerometer, a unicycle moving
along its heading over the midpoint yaw); GNSS positions, the IMU's orientation (CARLA's IMU
reports the sensor's orientation: a compass) and the speedometer are measurements. Each
measurement first predicts the state to its own stamp with the newest IMU inputs; a
measurement older than the filter's time by more than ``max_lag_s`` is refused (counted). A
gap longer than ``max_gap_s`` restarts the filter (a simulator reset). The filter is
``ready`` once it has had a position, a heading and a speed since it (re)started.

Noise defaults (:data:`LEADERBOARD_NOISE`) are the leaderboard's own sensor settings
(``leaderboard/autoagents/agent_wrapper.py``: GNSS latitude / longitude standard deviation
5e-6 deg, about 0.56 m; accelerometer 0.001 m/s^2, gyro 0.001 rad/s); the speedometer and the
IMU's orientation are exact in CARLA, so their filter defaults are small model-error figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .geometry import wrap_angle

EARTH_RADIUS_EQUA_M = 6378137.0        # CARLA's (and WGS-84's) equatorial radius
X, Y, YAW, V = range(4)                # state indices


def degrees_to_metres(deg: float, lat_ref_deg: float = 0.0) -> float:
    """Metres on the ground of ``deg`` degrees of latitude at the reference latitude (Mercator scale)."""
    return math.radians(deg) * EARTH_RADIUS_EQUA_M * math.cos(math.radians(lat_ref_deg))


@dataclass(frozen=True)
class SensorNoise:
    """Standard deviations of the sensors (white, per sample)."""
    gnss_deg: float = 5e-6                 # latitude and longitude each (degrees)
    accel_mps2: float = 0.001              # accelerometer, per axis
    gyro_radps: float = 0.001              # gyroscope, per axis
    compass_rad: float = 0.0               # the IMU's orientation (yaw)
    speed_mps: float = 0.0                 # speedometer


LEADERBOARD_NOISE = SensorNoise()          # the leaderboard's agent_wrapper settings (orientation, speed: exact)


@dataclass(frozen=True)
class GeoReference:
    """The map's georeference: latitude / longitude of the map origin (degrees); the defaults are
    CARLA's (and the leaderboard's) when the town's OpenDRIVE header names none."""
    lat_deg: float = 42.0
    lon_deg: float = 2.0

    def __post_init__(self):
        if not (math.isfinite(self.lat_deg) and -85.0 < self.lat_deg < 85.0):
            raise ValueError(f"lat_deg: {self.lat_deg!r} is not a latitude in (-85, 85) degrees")
        if not (math.isfinite(self.lon_deg) and -180.0 <= self.lon_deg <= 180.0):
            raise ValueError(f"lon_deg: {self.lon_deg!r} is not a longitude in [-180, 180] degrees")

    @property
    def _scale_m(self) -> float:
        return math.cos(math.radians(self.lat_deg)) * EARTH_RADIUS_EQUA_M

    def _mercator(self, lat_deg: float, lon_deg: float) -> tuple[float, float]:
        return (math.radians(lon_deg) * self._scale_m,
                math.log(math.tan(math.radians(90.0 + lat_deg) / 2.0)) * self._scale_m)

    def to_local(self, lat_deg: float, lon_deg: float) -> tuple[float, float]:
        """(x east, y north) metres in the ROS map frame (CARLA's x, -y)."""
        mx, my = self._mercator(lat_deg, lon_deg)
        mx0, my0 = self._mercator(self.lat_deg, self.lon_deg)
        return mx - mx0, my - my0

    @classmethod
    def solve(cls, lat_deg: float, lon_deg: float, x: float, y: float) -> "GeoReference":
        """The reference under which the map-frame point (``x`` east, ``y`` north, metres: CARLA's x, -y)
        reads ``lat_deg`` / ``lon_deg``: the inverse of :meth:`to_local` for one point known in both frames
        (the first point of the leaderboard's GNSS and world global plans).

        The Mercator scale depends on the reference latitude being solved for, so this iterates on
        it (a fixed point: each step changes the scale by about ``y / R``; a few steps reach float
        precision). Raises ValueError naming the bad input (non-finite, or no latitude in range)."""
        for name, value in (("lat_deg", lat_deg), ("lon_deg", lon_deg), ("x", x), ("y", y)):
            if not math.isfinite(value):
                raise ValueError(f"{name}: {value!r} is not a finite number")
        if not -85.0 < lat_deg < 85.0:
            raise ValueError(f"lat_deg: {lat_deg!r} is not a latitude in (-85, 85) degrees")
        lat_ref = lat_deg
        for _ in range(50):
            scale = math.cos(math.radians(lat_ref)) * EARTH_RADIUS_EQUA_M
            my = math.log(math.tan(math.radians(90.0 + lat_deg) / 2.0)) * scale - y
            new = 2.0 * math.degrees(math.atan(math.exp(my / scale))) - 90.0
            if not -85.0 < new < 85.0:
                raise ValueError(f"y: {y!r} m north of the point puts the reference latitude at {new:.3f} degrees, "
                                 "outside (-85, 85): the point's map coordinates do not fit its GNSS reading")
            done = abs(new - lat_ref) < 1e-13
            lat_ref = new
            if done:
                break
        lon_ref = lon_deg - math.degrees(x / (math.cos(math.radians(lat_ref)) * EARTH_RADIUS_EQUA_M))
        lon_ref = (lon_ref + 180.0) % 360.0 - 180.0
        return cls(lat_ref, lon_ref)

    def to_geo(self, x: float, y: float) -> tuple[float, float]:
        """(latitude, longitude) degrees of a map-frame point: what CARLA's GNSS reports there."""
        mx0, my0 = self._mercator(self.lat_deg, self.lon_deg)
        mx, my = mx0 + x, my0 + y
        lon = math.degrees(mx / self._scale_m)
        lat = 2.0 * math.degrees(math.atan(math.exp(my / self._scale_m))) - 90.0
        return lat, lon


@dataclass(frozen=True)
class LocalizationSettings:
    gnss_stddev_m: float = degrees_to_metres(LEADERBOARD_NOISE.gnss_deg)   # used when a fix has no covariance
    heading_stddev_rad: float = 0.01       # IMU orientation, when the message has no covariance
    speed_stddev_mps: float = 0.05         # speedometer
    gyro_noise_radps: float = 0.02         # process noise: yaw-rate error between IMU samples (rad/s)
    accel_noise_mps2: float = 0.5          # process noise: acceleration error between IMU samples (m/s^2)
    position_noise_mps: float = 0.05       # process noise: sideways motion the unicycle model misses (m/s)
    max_lag_s: float = 0.1                 # a measurement this much older than the filter is refused
    max_gap_s: float = 1.0                 # a gap longer than this (or time going back) restarts the filter
    initial_speed_stddev_mps: float = 5.0  # before the first speedometer reading

    def __post_init__(self):
        for f in ("gnss_stddev_m", "heading_stddev_rad", "speed_stddev_mps", "gyro_noise_radps",
                  "accel_noise_mps2", "position_noise_mps", "max_lag_s", "max_gap_s", "initial_speed_stddev_mps"):
            value = getattr(self, f)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{f}: must be a positive number, got {value!r}")


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
        self.counts: dict[str, int] = {"gnss": 0, "imu": 0, "speed": 0, "refused_late": 0, "restarts": 0}
        self.reset()

    def reset(self) -> None:
        self.state = FilterState()
        self.t: float | None = None
        self.covariance = np.diag([1e6, 1e6, math.pi ** 2, self.settings.initial_speed_stddev_mps ** 2])  # [4, 4]
        self.has_position = self.has_heading = self.has_speed = False

    @property
    def ready(self) -> bool:
        """A position, a heading and a speed measured since the last (re)start: before the first speedometer
        reading the speed is a guess, and a planner differentiating it would see a jump."""
        return self.has_position and self.has_heading and self.has_speed

    @property
    def _x(self) -> np.ndarray:
        s = self.state
        return np.array([s.x, s.y, s.yaw, s.speed])

    def _set(self, x: np.ndarray) -> None:
        s = self.state
        s.x, s.y, s.yaw, s.speed = float(x[X]), float(x[Y]), wrap_angle(float(x[YAW])), max(0.0, float(x[V]))

    # ------------------------------------------------------------------ time
    def _advance(self, t: float) -> bool:
        """Predict to ``t``; False: the measurement is too old to use."""
        st = self.settings
        if self.t is None:
            self.t = t
            return True
        dt = t - self.t
        if dt > st.max_gap_s or dt < -st.max_gap_s:
            self.reset()
            self.counts["restarts"] += 1
            self.t = t
            return True
        if dt < -st.max_lag_s:
            self.counts["refused_late"] += 1
            return False
        if dt > 0:
            self._predict(dt)
            self.t = t
        return True

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
        self.covariance = jac @ self.covariance @ jac.T + q
        self._set(x)

    def _update(self, h: np.ndarray, innovation: np.ndarray, r: np.ndarray) -> None:
        """Kalman update with measurement matrix ``h`` [m, 4], innovation [m], noise ``r`` [m, m] (Joseph form)."""
        p = self.covariance
        s = h @ p @ h.T + r
        gain = p @ h.T @ np.linalg.inv(s)                                   # [4, m]
        self._set(self._x + gain @ innovation)
        i_kh = np.eye(4) - gain @ h
        self.covariance = i_kh @ p @ i_kh.T + gain @ r @ gain.T

    # ------------------------------------------------------------------ measurements
    def gnss(self, t: float, x: float, y: float, covariance: np.ndarray | None = None) -> bool:
        """A GNSS position in the map frame (metres); ``covariance`` [2, 2] or None for the settings' figure."""
        if not (math.isfinite(x) and math.isfinite(y)) or not self._advance(t):
            return False
        r = np.eye(2) * self.settings.gnss_stddev_m ** 2 if covariance is None else np.asarray(covariance, float)
        if not self.has_position:                        # the first fix places the filter
            s = self.state
            s.x, s.y = x, y
            self.covariance[:2, :] = 0.0
            self.covariance[:, :2] = 0.0
            self.covariance[:2, :2] = r
            self.has_position = True
        else:
            h = np.zeros((2, 4))
            h[0, X] = h[1, Y] = 1.0
            self._update(h, np.array([x - self.state.x, y - self.state.y]), r)
        self.counts["gnss"] += 1
        return True

    def imu(self, t: float, yaw: float | None, yaw_rate: float, acceleration: float,
            yaw_variance: float | None = None) -> bool:
        """An IMU sample: orientation yaw (None: the IMU gives none), gyro z, accelerometer x (ego frame)."""
        if not (math.isfinite(yaw_rate) and math.isfinite(acceleration)) or not self._advance(t):
            return False
        self.state.yaw_rate, self.state.acceleration = yaw_rate, acceleration   # inputs from here on
        if yaw is not None and math.isfinite(yaw):
            var = self.settings.heading_stddev_rad ** 2 if yaw_variance is None else yaw_variance
            if not self.has_heading:
                self.state.yaw = wrap_angle(yaw)
                self.covariance[YAW, :] = 0.0
                self.covariance[:, YAW] = 0.0
                self.covariance[YAW, YAW] = var
                self.has_heading = True
            else:
                h = np.zeros((1, 4))
                h[0, YAW] = 1.0
                self._update(h, np.array([wrap_angle(yaw - self.state.yaw)]), np.array([[var]]))
        self.counts["imu"] += 1
        return True

    def speed(self, t: float, speed: float) -> bool:
        """A speedometer reading (m/s, its magnitude: the filter's speed is never negative)."""
        if not math.isfinite(speed) or not self._advance(t):
            return False
        h = np.zeros((1, 4))
        h[0, V] = 1.0
        self._update(h, np.array([abs(speed) - self.state.speed]),
                     np.array([[self.settings.speed_stddev_mps ** 2]]))
        self.has_speed = True
        self.counts["speed"] += 1
        return True

    def yaw_rate_variance(self) -> float:
        return self.settings.gyro_noise_radps ** 2
