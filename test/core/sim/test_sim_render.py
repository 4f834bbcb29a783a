"""Demo-world camera: the rendered image agrees with the geometry the ground truth is computed from.

The checks project with ``wam_diff2_core.geometry`` (the camera model the planner node uses
for its debug image), not with the renderer's own code path.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from wam_diff2_core.geometry import project_ego_points, world_to_ego
from wam_diff2_core.sim import (CameraSettings, Curve, EpisodeSettings, Palette, Renderer, RoadSettings, Straight,
                                build_road, simulate_episode)
from wam_diff2_core.sim.world import VehicleBox

CAMERA = CameraSettings(width=160, height=90)


def is_grass(rgb: np.ndarray) -> np.ndarray:
    """Colour class: green-dominant pixels are grass (asphalt is neutral grey, markings white/yellow)."""
    rgb = rgb.astype(np.int32)
    return (rgb[..., 1] > rgb[..., 0] + 12) & (rgb[..., 1] > rgb[..., 2] + 12)


def is_road(rgb: np.ndarray) -> np.ndarray:
    """Road surface: grey asphalt or a bright marking (low saturation), never green."""
    rgb = rgb.astype(np.int32)
    spread = rgb.max(-1) - rgb.min(-1)
    yellow = (rgb[..., 0] > 150) & (rgb[..., 1] > 120) & (rgb[..., 2] < 110)
    return ((spread < 20) | yellow) & ~is_grass(rgb)


def _pixels(waypoints: np.ndarray, renderer: Renderer):
    points = np.concatenate([waypoints, np.zeros((len(waypoints), 1))], 1)
    uv, in_front = project_ego_points(points, renderer.camera, renderer.mount)
    cam = renderer.camera
    keep = in_front & (uv[:, 0] >= 0) & (uv[:, 0] <= cam.width - 1) & (uv[:, 1] >= 0) & (uv[:, 1] <= cam.height - 1)
    return np.round(uv[keep]).astype(int)


@pytest.mark.parametrize("seed,traffic", [(11, True), (12, False), (13, True)])
def test_future_waypoints_project_onto_road_pixels(seed, traffic):
    episode = simulate_episode(seed, 0, EpisodeSettings(frames=30, frame_stride=10, camera=CAMERA, traffic=traffic))
    checked = off_road_shifted = shifted_checked = 0
    for frame in episode.frames():
        for u, v in _pixels(frame.truth.waypoints, episode.renderer):
            if frame.vehicle_ids[v, u] >= 0:
                continue                                   # a vehicle in front of that road point
            assert is_road(frame.rgb[v, u]), (
                f"frame {frame.truth.frame}: waypoint pixel {(u, v)} is {frame.rgb[v, u]}, not road")
            checked += 1
        # negative control: the same path 10 m to the side leaves the road (into grass)
        for u, v in _pixels(frame.truth.waypoints + [0.0, 10.0], episode.renderer):
            if frame.vehicle_ids[v, u] < 0 and v > episode.renderer.camera.cy + 3:
                shifted_checked += 1
                off_road_shifted += bool(is_grass(frame.rgb[v, u]))
    assert checked >= 100
    assert shifted_checked >= 20 and off_road_shifted >= 0.8 * shifted_checked


def test_waypoints_stay_on_road_pixels_through_turns_and_curves():
    """A constructed route through a left turn, a sharp right curve and a right turn."""
    from wam_diff2_core.sim import EgoState, ExpertSettings, World, WorldSettings
    from wam_diff2_core.sim.road import Crossing

    road = build_road([Straight(30.0), Crossing("left"), Straight(30.0), Curve(30.0, -90.0), Straight(30.0),
                       Crossing("right"), Straight(120.0)], RoadSettings(), start_yaw=2.0)
    x, y, yaw = road.lane.pose_at(5.0)
    world = World(road, EgoState(x, y, yaw, 6.0), [], WorldSettings(), ExpertSettings(cruise_speed_mps=9.0))
    poses = [(world.ego.x, world.ego.y, world.ego.yaw)]
    for _ in range(int(30.0 / 0.05)):
        world.step()
        poses.append((world.ego.x, world.ego.y, world.ego.yaw))
    poses = np.array(poses)
    renderer = Renderer(road, CAMERA, Palette())
    checked = turning = 0
    for tick in range(0, len(poses) - 80, 10):
        px, py, pyaw = poses[tick]
        waypoints = world_to_ego(poses[tick + 10:tick + 81:10, :2], (px, py), pyaw)
        turning += abs(poses[tick + 80, 2] - pyaw) > math.radians(45)
        rgb = renderer.render((px, py, pyaw), []).rgb
        for u, v in _pixels(waypoints, renderer):
            assert is_road(rgb[v, u]), f"tick {tick}: waypoint pixel {(u, v)} is {rgb[v, u]}"
            checked += 1
    assert turning >= 8 and checked >= 250


def test_curvature_is_visible_left_and_right_bend_the_road_image_opposite_ways():
    centroids = {}
    for name, angle in (("left", 60.0), ("right", -60.0), ("straight", None)):
        pieces = [Straight(10.0), Curve(60.0, angle), Straight(100.0)] if angle else [Straight(200.0)]
        road = build_road(pieces, RoadSettings())
        renderer = Renderer(road, CAMERA, Palette())
        rgb = renderer.render(road.lane.pose_at(5.0), []).rgb
        row = int(renderer.camera.cy + 3)                  # a row some 40 m ahead, 13 m to the side of the bend
        columns = np.flatnonzero(is_road(rgb[row]))
        centroids[name] = columns.mean()
    assert centroids["left"] < centroids["straight"] - 10 < centroids["right"] - 20


def test_ego_lane_position_is_visible():
    road = build_road([Straight(200.0)], RoadSettings())
    renderer = Renderer(road, CAMERA, Palette())
    x, y, yaw = road.lane.pose_at(5.0)
    row = renderer.camera.height - 5
    centred = np.flatnonzero(is_road(renderer.render((x, y, yaw), []).rgb[row])).mean()
    shifted = np.flatnonzero(is_road(renderer.render((x - 1.5 * math.sin(yaw), y + 1.5 * math.cos(yaw), yaw),
                                                     []).rgb[row])).mean()
    assert shifted > centred + 5            # moving left shifts the road to the right in the image


def _corners_3d(box: VehicleBox) -> np.ndarray:
    ground = box.corners()
    return np.concatenate([np.c_[ground, np.zeros(4)], np.c_[ground, np.full(4, box.height_m)]])


def test_boxes_lie_in_the_image_and_around_the_projected_vehicle():
    episode = simulate_episode(21, 1, EpisodeSettings(frames=40, frame_stride=6, camera=CAMERA))
    cam = episode.renderer.camera
    seen = fully_in_front = 0
    for frame in episode.frames():
        vehicles = {v.id: v for v in episode.snapshots[frame.truth.frame]}
        x, y, yaw = frame.truth.pose
        for box in frame.truth.boxes:
            x0, y0, x1, y1 = box.box
            assert 0 <= x0 < x1 <= cam.width and 0 <= y0 < y1 <= cam.height
            ax0, ay0, ax1, ay1 = box.amodal_box
            # OpenCV's polygon fill takes in boundary pixels: up to a pixel beyond the exact outline
            assert ax0 - 1.5 <= x0 and ay0 - 1.5 <= y0 and x1 <= ax1 + 1.5 and y1 <= ay1 + 1.5
            rows, cols = np.nonzero(frame.vehicle_ids == box.id)
            assert len(rows) == box.visible_pixels >= CAMERA.min_visible_pixels
            assert cols.min() == x0 and cols.max() + 1 == x1 and rows.min() == y0 and rows.max() + 1 == y1
            # independent projection of the vehicle's 3-D corners
            world = _corners_3d(vehicles[box.id])
            ego_xy = world_to_ego(world[:, :2], (x, y), yaw)
            uv, in_front = project_ego_points(np.c_[ego_xy, world[:, 2]], cam, episode.renderer.mount)
            seen += 1
            if in_front.all():
                fully_in_front += 1
                lo = np.clip(uv.min(0) + 0.5, 0, [cam.width, cam.height])
                hi = np.clip(uv.max(0) + 0.5, 0, [cam.width, cam.height])
                np.testing.assert_allclose([ax0, ay0, ax1, ay1], [*lo, *hi], atol=1.0)
            assert box.label == vehicles[box.id].label
        for vid in np.unique(frame.vehicle_ids):
            if vid >= 0 and vid not in {b.id for b in frame.truth.boxes}:
                # unannotated vehicles are the tiny ones
                rows, cols = np.nonzero(frame.vehicle_ids == vid)
                assert len(rows) < CAMERA.min_visible_pixels or min(np.ptp(rows), np.ptp(cols)) + 1 < 4
    assert seen >= 20 and fully_in_front >= 10


def test_nearer_vehicle_occludes_a_farther_one():
    road = build_road([Straight(200.0)], RoadSettings())
    renderer = Renderer(road, CAMERA, Palette())
    x, y, yaw = road.lane.pose_at(5.0)

    def car(vid, ahead, colour):
        cx, cy, heading = road.lane.pose_at(5.0 + ahead)
        return VehicleBox(vid, "car", cx, cy, heading, 4.5, 1.85, 1.5, colour, False, "lane")

    far_alone = renderer.render((x, y, yaw), [car(2, 30.0, (0, 0, 255))])
    both = renderer.render((x, y, yaw), [car(2, 30.0, (0, 0, 255)), car(1, 12.0, (255, 0, 0))])
    far_box = next(b for b in far_alone.boxes if b.id == 2)
    near_box = next(b for b in both.boxes if b.id == 1)
    assert far_box.visible_fraction > 0.9
    # the far car sits inside the near car's image: hidden (or nearly)
    hidden = [b for b in both.boxes if b.id == 2]
    assert not hidden or hidden[0].visible_pixels < 0.2 * far_box.visible_pixels
    cx, cy = (int((near_box.box[0] + near_box.box[2]) / 2), int((near_box.box[1] + near_box.box[3]) / 2))
    assert both.vehicle_ids[cy, cx] == 1


def test_rendering_is_deterministic_and_seed_dependent():
    settings = EpisodeSettings(frames=4, frame_stride=15, camera=CAMERA)
    a = [f.rgb for f in simulate_episode(4, 0, settings).frames()]
    b = [f.rgb for f in simulate_episode(4, 0, settings).frames()]
    c = [f.rgb for f in simulate_episode(5, 0, settings).frames()]
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not any(np.array_equal(p, q) for p, q in zip(a, c))
