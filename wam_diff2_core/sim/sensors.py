"""The demo world's GNSS, IMU and speedometer, as the leaderboard's SENSORS track gives them (the quantities
carla-ros-bridge's messages carry); and a benchmark of the odometry filter on them against the truth.

    sensors = DemoSensors(DEMO_NOISE, GeoReference(), np.random.default_rng(0))
    reading = sensors.read(world.ego)           # latitude / longitude, IMU, speed of this tick

    python -m wam_diff2_core.sim.sensors --routes 10     # filter error vs truth on the default routes: median, p95

GNSS: the rear axle (the odometry's origin) through :meth:`GeoReference.to_geo` (CARLA's projection). IMU:
orientation = the heading, gyro z = the yaw rate, accelerometer = (dv/dt, v x yaw rate, g). Speedometer: the
speed, never negative. White noise on each: the leaderboard's where CARLA has noise; where CARLA is exact
(orientation, speed) a little (``DEMO_NOISE``), so the filter is not handed the truth.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from ..geometry import wrap_angle
from ..localization.georeference import GeoReference
from ..localization.measurements import LEADERBOARD_NOISE, SensorNoise
from ..localization.odometry_filter import OdometryFilter
from .protocol import DEFAULT_ROUTE_SEED, ROUTE_LENGTH_M
from .vehicles import EgoState

GRAVITY_MPS2 = 9.81
DEMO_NOISE = replace(LEADERBOARD_NOISE, compass_rad=0.01, speed_mps=0.05)


@dataclass(frozen=True)
class SensorReading:
    latitude_deg: float
    longitude_deg: float
    yaw: float                       # IMU orientation (REP-103 map frame)
    gyro: tuple[float, float, float]           # rad/s, ego frame
    accel: tuple[float, float, float]          # m/s^2, ego frame (specific force: +g on z)
    speed_mps: float


class DemoSensors:
    def __init__(self, noise: SensorNoise = DEMO_NOISE, reference: GeoReference = GeoReference(),
                 rng: np.random.Generator | None = None):
        self.noise, self.reference = noise, reference
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def read(self, ego: EgoState) -> SensorReading:
        n, rng = self.noise, self.rng
        lat, lon = self.reference.to_geo(ego.x, ego.y)
        ax, ay = ego.acceleration, ego.speed * ego.yaw_rate           # ego frame: dv/dt, centripetal
        return SensorReading(
            latitude_deg=lat + rng.normal(0.0, n.gnss_deg), longitude_deg=lon + rng.normal(0.0, n.gnss_deg),
            yaw=wrap_angle(ego.yaw + rng.normal(0.0, n.compass_rad)),
            gyro=tuple(float(g) for g in np.array([0.0, 0.0, ego.yaw_rate]) + rng.normal(0.0, n.gyro_radps, 3)),
            accel=tuple(float(a) for a in np.array([ax, ay, GRAVITY_MPS2]) + rng.normal(0.0, n.accel_mps2, 3)),
            speed_mps=max(0.0, ego.speed + rng.normal(0.0, n.speed_mps)))


def route_sensors(seed: int, index: int) -> DemoSensors:
    """The sensors of route (seed, index): their noise is a function of the route, like the route itself."""
    return DemoSensors(rng=np.random.default_rng([seed, index, 7]))


def feed(ekf: OdometryFilter, reference: GeoReference, t: float, reading: SensorReading) -> None:
    """One tick's readings into the filter, in the order the ROS loop publishes them."""
    ekf.gnss(t, *reference.to_local(reading.latitude_deg, reading.longitude_deg))
    ekf.speed(t, reading.speed_mps)
    ekf.imu(t, reading.yaw, reading.gyro[2], reading.accel[0])


def pose_errors(ekf: OdometryFilter, ego: EgoState) -> tuple[float, float]:
    """(position error m, absolute heading error rad) of the filter's estimate against the truth."""
    s = ekf.state
    return math.hypot(s.x - ego.x, s.y - ego.y), abs(wrap_angle(s.yaw - ego.yaw))


def _spread(name: str, values) -> dict[str, float]:
    """``<name>_median_<unit>`` and ``<name>_p95_<unit>`` of ``values`` (``name``: ``what_unit``)."""
    what, unit = name.rsplit("_", 1)
    return {f"{what}_median_{unit}": float(np.median(values)), f"{what}_p95_{unit}": float(np.percentile(values, 95))}


def error_summary(position_m, heading_rad) -> dict[str, float]:
    return {"ticks": int(np.asarray(position_m).size), **_spread("position_m", np.asarray(position_m)),
            **_spread("heading_deg", np.degrees(np.asarray(heading_rad)))}


def expert_drive_errors(seed: int, routes: int, route_length_m: float = ROUTE_LENGTH_M,
                        traffic: bool = True) -> dict[str, float]:
    """The filter on the demo world's expert drive of routes (seed, 0 .. routes-1), one fresh filter per
    route, errors on every tick once the filter is ready; also the speed error and the raw GNSS position error."""
    from .route_runs import ClosedLoopSettings, RouteRun      # the routes the closed loop drives

    position, heading, raw, speed = [], [], [], []
    for index in range(routes):
        run = RouteRun(index, ClosedLoopSettings(seed=seed, route_length_m=route_length_m, traffic=traffic))
        sensors, ekf = route_sensors(seed, index), OdometryFilter()
        limit = run.settings.route_timeout_s / run.settings.world.dt_s
        while run.world.lane_s < run.end_s and run.world.tick < limit:
            reading = sensors.read(run.world.ego)
            feed(ekf, sensors.reference, run.stamp_s, reading)
            if ekf.ready:
                p, h = pose_errors(ekf, run.world.ego)
                position.append(p)
                heading.append(h)
                speed.append(abs(ekf.state.speed - run.world.ego.speed))
                gx, gy = sensors.reference.to_local(reading.latitude_deg, reading.longitude_deg)
                raw.append(math.hypot(gx - run.world.ego.x, gy - run.world.ego.y))
            run.world.step()                                   # the expert drives
    return {**error_summary(position, heading), **_spread("speed_mps", speed), **_spread("gnss_raw_m", raw)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the odometry filter on the demo world's expert drives: "
                                                 "estimate vs truth")
    parser.add_argument("--seed", type=int, default=DEFAULT_ROUTE_SEED,
                        help=f"route seed (default {DEFAULT_ROUTE_SEED}: the closed loop's default routes)")
    parser.add_argument("--routes", type=int, default=10)
    parser.add_argument("--route-length-m", type=float, default=ROUTE_LENGTH_M)
    parser.add_argument("--no-traffic", action="store_true")
    args = parser.parse_args(argv)
    s = expert_drive_errors(args.seed, args.routes, args.route_length_m, traffic=not args.no_traffic)
    print(f"localization: {args.routes} routes (seed {args.seed}), {s['ticks']} ticks: position error median "
          f"{s['position_median_m']:.3f} m, p95 {s['position_p95_m']:.3f} m; heading error median "
          f"{s['heading_median_deg']:.3f} deg, p95 {s['heading_p95_deg']:.3f} deg; speed error median "
          f"{s['speed_median_mps']:.3f} m/s, p95 {s['speed_p95_mps']:.3f} m/s (raw GNSS: median "
          f"{s['gnss_raw_median_m']:.3f} m, p95 {s['gnss_raw_p95_m']:.3f} m)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
