"""The ROS-free odometry filter (GNSS + IMU + speedometer -> pose, heading, speed) and the demo world's sensors."""
import math

import numpy as np
import pytest

from wam_diff2_core.localization import (EARTH_RADIUS_EQUA_M, GeoReference, LocalizationSettings, OdometryFilter,
                                         degrees_to_metres)
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun
from wam_diff2_core.sim.sensors import DEMO_NOISE, DemoSensors, expert_drive_errors, feed, pose_errors


# ----------------------------------------------------------------------------- GNSS -> metres
def test_the_default_reference_is_carlas_and_the_leaderboards():
    ref = GeoReference()
    assert (ref.lat_deg, ref.lon_deg) == (42.0, 2.0)            # where the OpenDRIVE header names none
    assert ref.to_geo(0.0, 0.0) == pytest.approx((42.0, 2.0), abs=1e-12)
    # a degree of longitude there is shortened by cos(42 deg): 1e-3 deg is 82.73 m east
    assert ref.to_local(42.0, 2.001)[0] == pytest.approx(82.73, abs=0.01)


def test_projection_matches_carla_mercator_at_the_equator():
    ref = GeoReference(0.0, 0.0)
    # along the equator a degree of longitude is 2 pi R / 360; north is +y in the ROS map frame (CARLA -y)
    x, y = ref.to_local(0.0, 1e-3)
    assert x == pytest.approx(math.radians(1e-3) * EARTH_RADIUS_EQUA_M, rel=1e-9) and y == pytest.approx(0.0)
    x, y = ref.to_local(1e-3, 0.0)
    assert x == pytest.approx(0.0) and y == pytest.approx(111.319, abs=0.01)


@pytest.mark.parametrize("lat_ref, lon_ref", [(0.0, 0.0), (49.0, 8.0), (-33.9, 151.2)])
def test_projection_round_trips_and_scales_with_the_reference_latitude(lat_ref, lon_ref):
    ref = GeoReference(lat_ref, lon_ref)
    assert ref.to_local(lat_ref, lon_ref) == pytest.approx((0.0, 0.0), abs=1e-6)
    for x, y in [(123.4, -56.7), (-2000.0, 1500.0)]:
        assert ref.to_local(*ref.to_geo(x, y)) == pytest.approx((x, y), abs=1e-6)
    # a small step in longitude is scale x R x angle (Mercator scaled to the reference latitude)
    x, _ = ref.to_local(lat_ref, lon_ref + 1e-4)
    assert x == pytest.approx(degrees_to_metres(1e-4, lat_ref), rel=1e-6)


@pytest.mark.parametrize("truth", [GeoReference(), GeoReference(49.0, 8.0), GeoReference(-33.9, 151.2),
                                   GeoReference(0.0, 179.999)])
@pytest.mark.parametrize("x, y", [(0.0, 0.0), (338.2, -105.7), (-4500.0, 5200.0)])
def test_the_georeference_is_solved_from_one_point_known_in_both_frames(truth, x, y):
    """What an agent does with the route's first point: its GNSS reading and its map position give back
    the reference CARLA projected with (round trip through the same projection)."""
    lat, lon = truth.to_geo(x, y)
    solved = GeoReference.solve(lat, lon, x, y)
    assert solved.lat_deg == pytest.approx(truth.lat_deg, abs=1e-9)
    assert solved.lon_deg == pytest.approx(truth.lon_deg, abs=1e-9)
    assert solved.to_local(lat, lon) == pytest.approx((x, y), abs=1e-4)


def test_solving_the_georeference_names_bad_input():
    with pytest.raises(ValueError, match="lat_deg"):
        GeoReference.solve(math.nan, 2.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="y"):
        GeoReference.solve(42.0, 2.0, 0.0, math.inf)
    with pytest.raises(ValueError, match="outside"):
        GeoReference.solve(84.9, 2.0, 0.0, -1e7)                # 10,000 km south of a point at 84.9 N


def test_bad_reference_and_settings_name_the_field():
    with pytest.raises(ValueError, match="lat_deg"):
        GeoReference(95.0, 0.0)
    with pytest.raises(ValueError, match="gnss_stddev_m"):
        LocalizationSettings(gnss_stddev_m=0.0)


# ----------------------------------------------------------------------------- the filter
def test_filter_is_ready_only_with_position_heading_and_speed():
    ekf = OdometryFilter()
    ekf.gnss(0.0, 10.0, 20.0)
    assert not ekf.ready
    ekf.imu(0.0, 0.5, 0.0, 0.0)
    assert not ekf.ready                              # the speed is still a guess
    ekf.speed(0.0, 3.0)
    assert ekf.ready
    assert (ekf.state.x, ekf.state.y, ekf.state.yaw) == pytest.approx((10.0, 20.0, 0.5))
    assert ekf.state.speed == pytest.approx(3.0, abs=0.01)


def test_filter_predicts_a_circle_from_gyro_and_speed_between_fixes():
    ekf = OdometryFilter()
    ekf.gnss(0.0, 0.0, 0.0)
    ekf.speed(0.0, 5.0)
    ekf.imu(0.0, None, 0.5, 0.0)
    ekf.imu(0.0, 0.0, 0.5, 0.0)                       # heading 0, turning left at 0.5 rad/s
    for k in range(1, 21):                            # 1 s with no GNSS: dead reckoning
        ekf.speed(k * 0.05, 5.0)
        ekf.imu(k * 0.05, None, 0.5, 0.0)
    radius = 5.0 / 0.5
    assert ekf.state.yaw == pytest.approx(0.5, abs=1e-6)
    assert (ekf.state.x, ekf.state.y) == pytest.approx((radius * math.sin(0.5), radius * (1 - math.cos(0.5))),
                                                       abs=0.02)
    # uncertainty grows without fixes
    assert ekf.covariance[0, 0] > degrees_to_metres(5e-6) ** 2


def test_late_measurements_are_refused_and_a_time_jump_restarts():
    ekf = OdometryFilter()
    ekf.gnss(10.0, 1.0, 1.0)
    ekf.imu(10.0, 0.0, 0.0, 0.0)
    assert not ekf.gnss(9.5, 50.0, 50.0)              # 0.5 s late (> max_lag_s): refused, nothing moved
    assert ekf.counts["refused_late"] == 1 and ekf.state.x == pytest.approx(1.0)
    ekf.gnss(100.0, 7.0, 8.0)                         # a gap: a new run
    assert ekf.counts["restarts"] == 1 and not ekf.ready and (ekf.state.x, ekf.state.y) == (7.0, 8.0)


def test_filter_on_noisy_demo_routes_beats_raw_gnss_and_tracks_the_truth():
    """Held-out routes (seed 2000, the closed loop's evaluation routes) with traffic, driven by the expert, the
    sensors with the leaderboard's GNSS / IMU noise. The exact figures are in docs/carla.md; loose bounds here."""
    s = expert_drive_errors(seed=2000, routes=2, route_length_m=150.0)
    assert s["ticks"] > 500
    assert s["position_median_m"] < 0.25 and s["position_p95_m"] < 0.5
    assert s["position_median_m"] < 0.5 * s["gnss_raw_median_m"]          # filtering, not passing GNSS through
    assert s["heading_median_deg"] < 0.5 and s["heading_p95_deg"] < 1.5
    assert s["speed_median_mps"] < 0.05 and s["speed_p95_mps"] < 0.15


def test_covariance_is_symmetric_positive_and_consistent_with_the_error():
    run = RouteRun(3, ClosedLoopSettings(seed=2000, route_length_m=120.0, traffic=True))
    sensors, ekf, ref = DemoSensors(DEMO_NOISE, GeoReference(), np.random.default_rng(5)), OdometryFilter(), \
        GeoReference()
    normalized = []
    while run.world.lane_s < run.end_s and run.world.tick < 2000:
        feed(ekf, ref, run.stamp_s, sensors.read(run.world.ego))
        p = ekf.covariance
        assert np.allclose(p, p.T) and np.all(np.linalg.eigvalsh(p) > 0)
        if run.world.tick > 20:
            dx = np.array([ekf.state.x - run.world.ego.x, ekf.state.y - run.world.ego.y])
            normalized.append(float(dx @ np.linalg.solve(p[:2, :2], dx)))      # chi-square, 2 dof
        run.world.step()
    # a consistent filter has a mean normalized error near 2; an overconfident one far above
    assert 0.2 < np.mean(normalized) < 6.0


def test_demo_sensors_are_noisy_around_the_truth():
    run = RouteRun(0, ClosedLoopSettings(seed=2000, route_length_m=50.0))
    for _ in range(40):
        run.world.step()
    sensors, ref, ego = DemoSensors(rng=np.random.default_rng(1)), GeoReference(), run.world.ego
    readings = [sensors.read(ego) for _ in range(400)]
    xy = np.array([ref.to_local(r.latitude_deg, r.longitude_deg) for r in readings])
    assert np.allclose(xy.mean(axis=0), [ego.x, ego.y], atol=0.1)
    # noise in degrees: east it is shortened by cos(reference latitude), north (Mercator) it is not
    assert xy.std(axis=0) == pytest.approx([degrees_to_metres(DEMO_NOISE.gnss_deg, ref.lat_deg),
                                            degrees_to_metres(DEMO_NOISE.gnss_deg)], rel=0.2)
    speeds = np.array([r.speed_mps for r in readings])
    assert speeds.mean() == pytest.approx(ego.speed, abs=0.02) and speeds.std() > 0.0
    assert pose_errors(OdometryFilter(), ego)[0] > 0      # an unfed filter is not at the truth by accident
