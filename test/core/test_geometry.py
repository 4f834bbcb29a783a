"""wam_diff2_core.geometry: route -> command, RoadOptions, frames, ego state, camera projection."""
from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from wam_diff2_core import geometry
from wam_diff2_core.geometry import (AccelerationEstimator, CameraMount, EgoHistory, EgoSample, PinholeCamera,
                                     RouteCommandSettings, command_from_road_option, command_from_route, ego_to_world,
                                     path_headings, project_ego_points, quaternion_from_yaw, world_to_ego,
                                     yaw_from_quaternion)

SETTINGS = RouteCommandSettings(lookahead_m=30.0, turn_angle_deg=30.0, lateral_offset_m=2.0, max_distance_m=10.0)


def test_doctests():
    assert doctest.testmod(geometry).failed == 0


# ----------------------------------------------------------------------------- routes in the ego frame
def straight(length=60.0, step=2.0):
    return np.stack([np.arange(0.0, length, step), np.zeros(int(length / step))], axis=1)


def turn(sign: float, before=10.0, radius=10.0, after=20.0, step=1.0):
    """Straight ahead for ``before`` metres, a quarter circle (sign +1 left, -1 right), then straight."""
    a = np.stack([np.arange(-5.0, before, step), np.zeros(int((before + 5.0) / step))], axis=1)
    theta = np.linspace(0.0, math.pi / 2, 20)
    arc = np.stack([before + radius * np.sin(theta), sign * radius * (1 - np.cos(theta))], axis=1)
    out = np.stack([np.full(int(after / step), before + radius), sign * (radius + np.arange(1.0, after + 1.0, step))],
                   axis=1)
    return np.concatenate([a, arc, out])


def lane_change(offset: float, start=5.0, length=20.0, total=60.0):
    x = np.arange(-5.0, total, 1.0)
    s = np.clip((x - start) / length, 0.0, 1.0)
    return np.stack([x, offset * (3 * s**2 - 2 * s**3)], axis=1)     # smooth step of ``offset`` metres


@pytest.mark.parametrize("route, expected", [
    (straight(), "straight"),
    (turn(+1), "left"),
    (turn(-1), "right"),
    (lane_change(+3.5), "left"),        # a full lane to the left within the look-ahead
    (lane_change(-3.5), "right"),
    (lane_change(+0.8), "straight"),    # lane-centring wiggle: below lateral_offset_m
    (lane_change(-1.5), "straight"),
])
def test_route_command_in_ego_frame(route, expected):
    assert command_from_route(route, (0.0, 0.0), 0.0, SETTINGS) == expected


def test_small_oscillations_stay_straight():
    x = np.arange(0.0, 60.0, 1.0)
    route = np.stack([x, 0.4 * np.sin(x / 3.0)], axis=1)
    assert command_from_route(route, (0.0, 0.0), 0.0, SETTINGS) == "straight"


@pytest.mark.parametrize("expected, sign", [("left", +1), ("right", -1)])
def test_route_command_with_ego_pose_in_map_frame(expected, sign):
    """The same turn placed anywhere in the map, ego on it facing along it, gives the same command."""
    ego_xy, ego_yaw = np.array([120.0, -40.0]), math.radians(135.0)
    route_map = ego_to_world(turn(sign), ego_xy, ego_yaw)
    assert command_from_route(route_map, ego_xy, ego_yaw, SETTINGS) == expected
    # an ego heading error does not change the answer: the route's own tangent is the reference
    assert command_from_route(route_map, ego_xy, ego_yaw + math.radians(20), SETTINGS) == expected


def test_only_the_route_ahead_counts():
    # the turn lies 40 m ahead: beyond a 30 m look-ahead it is still straight, within 50 m it is left
    route = turn(+1, before=40.0)
    assert command_from_route(route, (0.0, 0.0), 0.0, SETTINGS) == "straight"
    wide = RouteCommandSettings(lookahead_m=60.0)
    assert command_from_route(route, (0.0, 0.0), 0.0, wide) == "left"
    # past the turn (on the leg after it) the route ahead is straight again
    ego = np.array([20.0, 15.0])
    assert command_from_route(turn(+1), ego, math.pi / 2, SETTINGS) == "straight"


def test_route_edge_cases():
    assert command_from_route(straight() + [0.0, 12.0], (0.0, 0.0), 0.0, SETTINGS) is None   # 12 m off the route
    assert command_from_route(np.zeros((0, 2)), (0.0, 0.0), 0.0, SETTINGS) is None
    assert command_from_route(np.array([[1.0, 0.0], [1.0, 0.0]]), (0.0, 0.0), 0.0, SETTINGS) is None  # one point
    assert command_from_route(np.array([[np.nan, 0.0], [5.0, 0.0]]), (0.0, 0.0), 0.0, SETTINGS) is None
    # the route ends where the ego is: nothing ahead to turn on
    assert command_from_route(np.array([[-10.0, 0.0], [0.0, 0.0]]), (0.0, 0.0), 0.0, SETTINGS) == "straight"


# ----------------------------------------------------------------------------- RoadOption
@pytest.mark.parametrize("text, expected", [
    ("left", "left"), ("Straight", "straight"), (" right ", "right"),
    ("LEFT", "left"), ("RIGHT", "right"), ("STRAIGHT", "straight"), ("LANEFOLLOW", "straight"),
    ("CHANGELANELEFT", "left"), ("CHANGELANERIGHT", "right"), ("VOID", "straight"), ("RoadOption.LEFT", "left"),
    ("1", "left"), ("2", "right"), ("3", "straight"), ("4", "straight"), ("5", "left"), ("6", "right"),
    ("-1", "straight"),
])
def test_road_options(text, expected):
    assert command_from_road_option(text) == expected


@pytest.mark.parametrize("text", ["", "forward", "7", "0", "1.5", "LEFTISH"])
def test_unknown_commands_are_rejected(text):
    with pytest.raises(ValueError, match="RoadOption"):
        command_from_road_option(text)


# ----------------------------------------------------------------------------- frames
def test_ego_world_round_trip_and_quaternions():
    pts = np.array([[1.0, 0.0], [0.0, 2.0]])
    world = ego_to_world(pts, (10.0, 5.0), math.pi / 2)
    np.testing.assert_allclose(world, [[10.0, 6.0], [8.0, 5.0]], atol=1e-12)
    np.testing.assert_allclose(world_to_ego(world, (10.0, 5.0), math.pi / 2), pts, atol=1e-12)
    for yaw in (-3.0, -0.5, 0.0, 1.0, 3.1):
        assert yaw_from_quaternion(*quaternion_from_yaw(yaw)) == pytest.approx(yaw)


def test_path_headings():
    h = path_headings(np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 1.0]]))
    np.testing.assert_allclose(h, [0.0, math.pi / 2, math.pi / 2, math.pi])


# ----------------------------------------------------------------------------- ego state
def test_acceleration_from_velocity_straight_and_turning():
    est = AccelerationEstimator(time_constant_s=0.0)
    est.update(0.0, 5.0, 0.0, 0.0)
    assert est.update(0.1, 5.2, 0.0, 0.0) == pytest.approx((2.0, 0.0))
    # constant speed on a right-hand circle: centripetal acceleration v * omega to the right
    est = AccelerationEstimator(time_constant_s=0.0)
    est.update(0.0, 10.0, 0.0, -0.2)
    assert est.update(0.05, 10.0, 0.0, -0.2) == pytest.approx((0.0, -2.0))


def test_acceleration_is_smoothed_and_resets():
    est = AccelerationEstimator(time_constant_s=0.5)
    est.update(0.0, 0.0, 0.0, 0.0)
    ax, _ = est.update(0.1, 0.1, 0.0, 0.0)          # raw 1 m/s^2, filtered part of it
    assert 0.0 < ax < 1.0
    for k in range(2, 60):
        ax, _ = est.update(0.1 * k, 0.1 * k, 0.0, 0.0)
    assert ax == pytest.approx(1.0, abs=1e-3)
    assert est.update(0.1 * 60 + 5.0, 0.0, 0.0, 0.0) == (0.0, 0.0)   # a gap resets
    assert est.update(1.0, 0.0, 0.0, 0.0) == (0.0, 0.0)              # time going back resets


def test_ego_history_interpolates_at_stamps():
    hist = EgoHistory(max_samples=10)
    assert hist.at(1.0, 0.5) is None
    hist.add(EgoSample(1.0, 0.0, 0.0, math.radians(170), 1.0, 0.0))
    hist.add(EgoSample(2.0, 10.0, 2.0, math.radians(-170), 3.0, 0.0))
    mid = hist.at(1.5, 0.5)
    assert (mid.x, mid.y, mid.vx) == pytest.approx((5.0, 1.0, 2.0))
    assert hist.at(1.5, 0.1) is None          # inside a gap wider than the tolerance: no state
    assert math.degrees(mid.yaw) == pytest.approx(-180.0) or math.degrees(mid.yaw) == pytest.approx(180.0)
    assert hist.at(2.3, 0.5).x == 10.0        # held within the tolerance
    assert hist.at(2.6, 0.5) is None          # too far past the newest
    assert hist.at(0.4, 0.5) is None          # too far before the oldest
    for k in range(20):
        hist.add(EgoSample(3.0 + k, 0.0, 0.0, 0.0, 0.0, 0.0))
    assert len(hist) == 10
    hist.add(EgoSample(0.0, 0.0, 0.0, 0.0, 0.0, 0.0))   # a replay restart clears the history
    assert len(hist) == 1


# ----------------------------------------------------------------------------- camera
def test_projection_of_ground_points():
    cam = PinholeCamera.from_horizontal_fov(160, 90, 90.0)
    assert (cam.fx, cam.cx, cam.cy) == pytest.approx((80.0, 80.0, 45.0))
    mount = CameraMount(x_m=2.0, z_m=2.0)
    pts = np.array([[12.0, 0.0, 2.0],     # straight ahead at camera height: the principal point
                    [12.0, 0.0, 0.0],     # on the ground 10 m ahead: below it by f * 2 / 10
                    [12.0, 1.0, 0.0],     # left: smaller u
                    [1.0, 0.0, 0.0]])     # behind the camera
    uv, visible = project_ego_points(pts, cam, mount)
    np.testing.assert_allclose(uv[0], [80.0, 45.0])
    np.testing.assert_allclose(uv[1], [80.0, 45.0 + 80.0 * 2.0 / 10.0])
    np.testing.assert_allclose(uv[2], [80.0 - 8.0, 61.0])
    assert visible.tolist() == [True, True, True, False] and np.isnan(uv[3]).all()


def test_projection_with_mount_rotation():
    cam = PinholeCamera(100.0, 100.0, 50.0, 50.0, 100, 100)
    # pitched down by 45 deg at 2 m height: the ground point 2 m ahead lies on the optical axis
    uv, _ = project_ego_points(np.array([[2.0, 0.0, 0.0]]), cam, CameraMount(z_m=2.0, pitch_deg=45.0))
    np.testing.assert_allclose(uv[0], [50.0, 50.0], atol=1e-9)
    # yawed 90 deg left: a point to the left appears at the centre
    uv, _ = project_ego_points(np.array([[0.0, 5.0, 0.0]]), cam, CameraMount(yaw_deg=90.0))
    np.testing.assert_allclose(uv[0], [50.0, 50.0], atol=1e-9)
    scaled = cam.scaled_to(200, 50)
    assert (scaled.fx, scaled.fy, scaled.cx, scaled.cy) == (200.0, 50.0, 100.0, 25.0)
