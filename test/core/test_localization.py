"""The ROS-free odometry filter (GNSS + IMU + speedometer -> pose, heading, speed) and the demo world's sensors."""
import math
import re

import numpy as np
import pytest

from wam_diff2_core.localization.georeference import EARTH_RADIUS_EQUA_M, GeoReference, degrees_to_metres
from wam_diff2_core.localization.measurements import MeasurementRefused, heading_from_quaternion
from wam_diff2_core.localization.odometry_filter import LocalizationSettings, OdometryFilter
from wam_diff2_core.sim.protocol import DEFAULT_ROUTE_SEED
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


# ----------------------------------------------------------------------------- hostile inputs
def ready_filter(**settings) -> OdometryFilter:
    ekf = OdometryFilter(LocalizationSettings(**settings))
    ekf.gnss(10.0, 1.0, 2.0)
    ekf.imu(10.0, 0.5, 0.0, 0.0)
    ekf.speed(10.0, 3.0)
    assert ekf.ready
    return ekf


NAN, INF = math.nan, math.inf
HOSTILE = [   # (measurement, arguments after the stamp, reason code, words the message must have)
    ("gnss", (NAN, 2.0), "position", "x is nan"),
    ("gnss", (1.0, -INF), "position", "y is -inf"),
    ("gnss", (1.0, 2.0, np.array([[INF, 0.0], [0.0, 1.0]])), "covariance", "not finite"),
    ("gnss", (1.0, 2.0, np.array([[1e308, 1e308], [1e308, 1e308]])), "covariance", "not finite"),
    ("gnss", (1.0, 2.0, np.array([[-1.0, 0.0], [0.0, 1.0]])), "covariance", "east variance -1.0"),
    ("gnss", (1.0, 2.0, np.array([[1.0, 0.0], [0.0, 1e300]])), "covariance", "north variance 1e+300"),
    ("gnss", (1.0, 2.0, np.array([[1.0, 5.0], [5.0, 1.0]])), "covariance", "not positive definite"),
    ("gnss", (1.0, 2.0, np.zeros(3)), "covariance", "shape (3,)"),
    ("gnss", (1001.0, 2.0), "gate", "sigma (Mahalanobis)"),
    ("imu", (0.5, 1e308, 0.0), "rate", "angular_velocity.z 1e+308 is beyond +-10 (max_yaw_rate_radps)"),
    ("imu", (0.5, NAN, 0.0), "rate", "angular_velocity.z is nan"),
    ("imu", (0.5, 0.0, -1e308), "acceleration", "linear_acceleration.x -1e+308"),
    ("imu", (0.5, 0.0, INF), "acceleration", "linear_acceleration.x is inf"),
    ("imu", (NAN, 0.0, 0.0), "orientation", "orientation yaw is nan"),
    ("imu", (0.5, 0.0, 0.0, INF), "covariance", "orientation variance inf"),
    ("imu", (0.5, 0.0, 0.0, -0.1), "covariance", "orientation variance -0.1"),
    ("imu", (0.5, 0.0, 0.0, 1e-300), "covariance", "orientation variance 1e-300"),
    ("speed", (INF,), "speed", "speed is inf"),
    ("speed", (1e308,), "speed", "speed 1e+308 is beyond +-100 (max_speed_mps)"),
    ("speed", (-1e9,), "speed", "beyond"),
]


@pytest.mark.parametrize("kind, args, code, words", HOSTILE, ids=[f"{h[0]}-{h[2]}-{i}" for i, h in enumerate(HOSTILE)])
def test_a_hostile_measurement_is_refused_with_its_reason_and_leaves_the_state_alone(kind, args, code, words):
    ekf = ready_filter()
    before, covariance = vars(ekf.state).copy(), ekf.covariance.copy()
    assert getattr(ekf, kind)(10.0, *args) is False
    assert ekf.refusal.code == code and words in str(ekf.refusal), str(ekf.refusal)
    assert ekf.counts[f"refused_{code}"] == 1 and ekf.ready
    assert vars(ekf.state) == before and np.array_equal(ekf.covariance, covariance)
    assert getattr(ekf, kind)(10.0, *((1.0, 2.0) if kind == "gnss" else (0.5, 0.0, 0.0) if kind == "imu"
                                      else (3.0,))) is True and ekf.refusal is None       # a good one is used again


@pytest.mark.parametrize("stamp", [NAN, INF, -INF])
def test_a_stamp_that_is_not_a_number_is_refused(stamp):
    ekf = ready_filter()
    for kind, args in (("gnss", (1.0, 2.0)), ("imu", (0.5, 0.0, 0.0)), ("speed", (3.0,))):
        assert not getattr(ekf, kind)(stamp, *args) and ekf.refusal.code == "stamp"
    assert ekf.t == 10.0 and ekf.counts["refused_stamp"] == 3


@pytest.mark.parametrize("lat, lon, words", [(INF, 2.0, "latitude inf"), (100.0, 2.0, "latitude 100.0"),
                                             (-90.0, 2.0, "latitude -90.0"), (90.0, 2.0, "latitude 90.0"),
                                             (NAN, 2.0, "latitude nan"), (42.0, NAN, "longitude nan"),
                                             (42.0, 1e308, "longitude 1e+308")])
def test_the_projection_refuses_what_it_cannot_project_naming_it(lat, lon, words):
    """The fixes that raised 'math domain error' in the node's GNSS callback."""
    with pytest.raises(MeasurementRefused, match=re.escape(words)) as refused:
        GeoReference().to_local(lat, lon)
    assert refused.value.code == "position"


def test_quaternions_give_a_heading_only_when_they_are_unit_and_finite():
    assert heading_from_quaternion(0.0, 0.0, math.sin(0.25), math.cos(0.25)) == pytest.approx(0.5)
    assert heading_from_quaternion(0.0, 0.0, 1.001 * math.sin(0.25), 1.001 * math.cos(0.25)) == pytest.approx(0.5)
    for q, words in [((0.0, 0.0, 0.0, 0.0), "norm 0.0"), ((0.0, 0.0, 0.0, 2.0), "norm 2.0"),
                     ((0.0, 0.0, NAN, 1.0), "orientation.z is nan"), ((1e308, 1e308, 0.0, 0.0), "norm inf")]:
        with pytest.raises(MeasurementRefused, match=re.escape(words)) as refused:
            heading_from_quaternion(*q)
        assert refused.value.code == "orientation"


def test_a_1_km_jump_is_gated_and_followed_after_gnss_reacquire_s():
    """The issue's jump: the estimate moved 348 m in one second. Now the fixes are refused for
    gnss_reacquire_s, counted, and then the position follows them (a real jump does not lock the
    filter out); the heading and the speed are kept."""
    ekf = ready_filter()
    for k in range(1, 11):                                 # 0.5 s at 20 Hz, standing still
        t = 10.0 + 0.05 * k
        ekf.speed(t, 0.0)
        ekf.imu(t, 0.5, 0.0, 0.0)
        assert ekf.gnss(t, 1.0, 2.0)
    refused = 0
    for k in range(11, 40):
        t = 10.0 + 0.05 * k
        ekf.imu(t, 0.5, 0.0, 0.0)
        if not ekf.gnss(t, 1001.0, 2.0):
            refused += 1
            assert ekf.refusal.code == "gate" and ekf.state.x == pytest.approx(1.0, abs=0.1)
            assert f"({refused} in a row)" in str(ekf.refusal)
    assert refused == 20                                   # 1.0 s of fixes, then the 21st places the filter
    assert ekf.counts["refused_gate"] == 20 and ekf.counts["gnss_reacquired"] == 1 and ekf.gate_refused_in_row == 0
    assert ekf.state.x == pytest.approx(1001.0, abs=0.5) and ekf.state.yaw == pytest.approx(0.5) and ekf.ready


def test_a_single_outlier_among_good_fixes_never_moves_the_estimate():
    ekf, rng = ready_filter(), np.random.default_rng(0)
    for k in range(1, 200):
        t = 10.0 + 0.05 * k
        ekf.imu(t, 0.5, 0.0, 0.0)
        ekf.speed(t, 0.0)
        x, y = 1.0 + rng.normal(0.0, 0.5), 2.0 + rng.normal(0.0, 0.5)
        if k % 10 == 0:
            assert not ekf.gnss(t, x + 50.0, y) and ekf.refusal.code == "gate"
        else:
            assert ekf.gnss(t, x, y)
        assert math.hypot(ekf.state.x - 1.0, ekf.state.y - 2.0) < 1.0
    assert ekf.counts["refused_gate"] == 19 and ekf.counts["gnss_reacquired"] == 0


def test_a_state_that_stops_being_finite_restarts_the_filter_and_is_never_kept():
    """The inputs are checked, so only a bug could make the state non-finite; this one is planted."""
    ekf = ready_filter()
    ekf.covariance[0, 0] = math.inf
    assert not ekf.imu(10.05, 0.5, 0.0, 0.0)               # the prediction meets the planted inf
    assert ekf.refusal.code == "non_finite" and "the prediction gave a non-finite state" in str(ekf.refusal)
    assert ekf.counts["restarts_non_finite"] == 1 and not ekf.ready and ekf.last_restart
    assert np.isfinite(ekf.covariance).all() and all(math.isfinite(v) for v in vars(ekf.state).values())
    ekf.gnss(10.1, 1.0, 2.0)
    ekf.imu(10.1, 0.5, 0.0, 0.0)
    ekf.speed(10.1, 3.0)
    assert ekf.ready


def test_filter_on_noisy_demo_routes_beats_raw_gnss_and_tracks_the_truth():
    """Held-out routes (the closed loop's default routes) with traffic, driven by the expert, the
    sensors with the leaderboard's GNSS / IMU noise. The exact figures are in docs/carla.md; loose bounds here."""
    s = expert_drive_errors(seed=DEFAULT_ROUTE_SEED, routes=2, route_length_m=150.0)
    assert s["ticks"] > 500
    assert s["position_median_m"] < 0.25 and s["position_p95_m"] < 0.5
    assert s["position_median_m"] < 0.5 * s["gnss_raw_median_m"]          # filtering, not passing GNSS through
    assert s["heading_median_deg"] < 0.5 and s["heading_p95_deg"] < 1.5
    assert s["speed_median_mps"] < 0.05 and s["speed_p95_mps"] < 0.15


def test_covariance_is_symmetric_positive_and_consistent_with_the_error():
    run = RouteRun(3, ClosedLoopSettings(seed=DEFAULT_ROUTE_SEED, route_length_m=120.0, traffic=True))
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
    run = RouteRun(0, ClosedLoopSettings(seed=DEFAULT_ROUTE_SEED, route_length_m=50.0))
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
