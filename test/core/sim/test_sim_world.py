"""Demo world: vehicle model, expert, traffic, commands, and the ground truth of simulated episodes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from wam_diff2_core.geometry import world_to_ego
from wam_diff2_core.sim import (Actuation, BicycleParams, Crossing, Curve, EgoState, EpisodeSettings, RecoverySettings,
                                KinematicBicycle, RoadSettings, RouteSettings, Straight, VehicleControl, World,
                                WorldSettings, build_road, make_world, route_command, simulate_episode)
from wam_diff2_core.sim.camera import CameraSettings
from wam_diff2_core.sim.expert import ExpertSettings
from wam_diff2_core.sim.truth import CommandSettings
from wam_diff2_core.sim.vehicles import VEHICLE_SHAPES, SpeedEvent, TrafficVehicle
from wam_diff2_core.sim.world import boxes_overlap

SMALL_CAMERA = CameraSettings(width=96, height=54)


def _world_on(pieces, *, ego_speed=8.0, cruise=10.0, traffic=(), start_s=5.0, yaw=0.3) -> World:
    road = build_road(pieces, RoadSettings(), start_xy=(12.0, -7.0), start_yaw=yaw)
    x, y, heading = road.lane.pose_at(start_s)
    settings = WorldSettings()
    return World(road, EgoState(x, y, heading, ego_speed), list(traffic), settings,
                 ExpertSettings(cruise_speed_mps=cruise))


# ----------------------------------------------------------------------------- bicycle model
@pytest.mark.parametrize("steer", [0.2, -0.35])
def test_constant_steering_drives_a_circle_of_radius_wheelbase_over_tan_steer(steer):
    params = BicycleParams(wheelbase_m=2.8)
    model = KinematicBicycle(params)
    radius = params.wheelbase_m / math.tan(abs(steer))
    state = EgoState(x=3.0, y=-2.0, yaw=0.7, speed=4.0)
    side = 1.0 if steer > 0 else -1.0            # left turns circle around a centre on the left
    centre = np.array([3.0 - side * radius * math.sin(0.7), -2.0 + side * radius * math.cos(0.7)])
    travelled = 0.0
    for k in range(400):
        accel = 0.5 if k < 200 else -0.3          # speed changes must not leave the circle
        before = state
        state = model.step(state, Actuation(accel, steer), 0.05)
        travelled += 0.5 * (before.speed + state.speed) * 0.05
        assert math.hypot(state.x - centre[0], state.y - centre[1]) == pytest.approx(radius, abs=1e-9)
    assert state.yaw - 0.7 == pytest.approx(side * travelled / radius, rel=1e-9)
    # yaw rate over the last step: the mean speed of the step over the radius
    assert state.yaw_rate == pytest.approx(side * 0.5 * (before.speed + state.speed) / radius, rel=1e-9)


def test_braking_stops_without_reversing_after_v_squared_over_2a():
    model = KinematicBicycle(BicycleParams())
    state = EgoState(0.0, 0.0, 0.0, speed=10.0)
    for _ in range(100):
        state = model.step(state, Actuation(-4.0, 0.0), 0.05)
        assert state.speed >= 0.0
    assert state.speed == 0.0
    assert state.x == pytest.approx(10.0**2 / (2 * 4.0), abs=1e-9)


def test_carla_control_signs_and_limits():
    model = KinematicBicycle(BicycleParams())
    start = EgoState(0.0, 0.0, 0.0, speed=5.0)
    right = model.step(start, model.actuation_from_control(VehicleControl(throttle=0.3, steer=0.5), 5.0), 0.05)
    assert right.yaw < 0 and right.y < 0                     # CARLA: + steer turns right
    faster = model.step(start, model.actuation_from_control(VehicleControl(throttle=1.0), 5.0), 0.05)
    slower = model.step(start, model.actuation_from_control(VehicleControl(brake=1.0), 5.0), 0.05)
    coast = model.step(start, model.actuation_from_control(VehicleControl(), 5.0), 0.05)
    assert faster.speed > 5.0 > coast.speed > slower.speed
    with pytest.raises(ValueError, match="steer"):
        VehicleControl(steer=1.5)
    with pytest.raises(ValueError, match="throttle"):
        VehicleControl(throttle=float("nan"))


# ----------------------------------------------------------------------------- world
def test_world_is_deterministic_by_seed():
    def run(seed):
        world = World.generate(np.random.default_rng(seed), WorldSettings(), duration_s=20.0)
        for _ in range(120):
            world.step()
        return world

    a, b, c = run(5), run(5), run(6)
    assert np.array_equal(a.road.centreline.points, b.road.centreline.points)
    assert a.ego == b.ego
    assert [(v.id, v.s, v.speed) for v in a.traffic] == [(v.id, v.s, v.speed) for v in b.traffic]
    assert not np.array_equal(a.road.centreline.points, c.road.centreline.points)
    assert a.ego != c.ego


def test_mirror_turns_builds_the_same_world_up_to_the_first_crossing_with_each_turn_swapped():
    swapped = {"left": "right", "straight": "straight", "right": "left"}
    mirror = WorldSettings(route=RouteSettings(mirror_turns=True))
    turning = 0
    for seed in range(8):
        a = World.generate(np.random.default_rng(seed), WorldSettings(), duration_s=20.0)
        b = World.generate(np.random.default_rng(seed), mirror, duration_s=20.0)
        assert [swapped[c.turn] for c in a.road.crossings] == [c.turn for c in b.road.crossings]
        assert a.ego == b.ego and a.expert.settings == b.expert.settings   # the same start and cruise speed
        if not a.road.crossings or a.road.crossings[0].turn == "straight":
            assert np.array_equal(a.road.lane.points, b.road.lane.points)
            continue
        turning += 1
        entry = a.road.crossings[0].lane_s_entry
        assert b.road.crossings[0].lane_s_entry == entry
        before = a.road.lane.s < entry
        assert np.array_equal(a.road.lane.points[before], b.road.lane.points[b.road.lane.s < entry])
        # past the crossing the routes part: one turns left of the other
        exit_a, exit_b = a.road.lane.pose_at(entry + 30.0), b.road.lane.pose_at(entry + 30.0)
        assert math.hypot(exit_a[0] - exit_b[0], exit_a[1] - exit_b[1]) > 10.0
    assert turning >= 2


def test_expert_keeps_its_lane_and_never_collides_across_seeds():
    braked = accelerated = turned = 0
    for seed in range(6):
        world = World.generate(np.random.default_rng([seed, 1]), WorldSettings(), duration_s=30.0)
        for _ in range(600):
            world.step()
            status = world.status()
            assert status.collision_with is None, f"seed {seed}: collided at t={world.time_s:.2f}"
            assert abs(status.lateral_offset_m) < 0.6, f"seed {seed}: {status}"
            assert not status.off_lane
            braked += world.ego.acceleration < -0.8
            accelerated += world.ego.acceleration > 0.8
            lane = world.lanes["lane"]
            in_lane = sorted((v.s, v.shape.length_m) for v in world.traffic if v.path_name == "lane")
            for (s0, l0), (s1, l1) in zip(in_lane, in_lane[1:]):
                assert s1 - l1 / 2 > s0 + l0 / 2, "traffic in one lane overlaps"
            assert lane.length > world.lane_s
        turned += bool(world.road.crossings)
    # the episodes exercise the speed range: braking and accelerating both happen
    assert braked > 50 and accelerated > 50 and turned >= 2


def test_expert_follows_a_slow_leader_and_stops_behind_a_stopping_one():
    road = build_road([Straight(600.0)], RoadSettings())
    car = VEHICLE_SHAPES["car"]
    lead = TrafficVehicle(id=1, shape=car, colour=(200, 0, 0), path_name="lane", s=45.0, speed=4.0, cruise_mps=4.0,
                          events=(SpeedEvent(20.0, 100.0, 0.0),))
    x, y, yaw = road.lane.pose_at(5.0)
    world = World(road, EgoState(x, y, yaw, 12.0), [lead], WorldSettings(), ExpertSettings(cruise_speed_mps=12.0))
    min_gap = math.inf
    for _ in range(int(19.0 / 0.05)):
        world.step()
        min_gap = min(min_gap, world.leader().gap_m)
    assert world.ego.speed == pytest.approx(4.0, abs=0.5)    # settled behind the 4 m/s leader
    assert min_gap > 3.0
    for _ in range(int(20.0 / 0.05)):                      # the leader stops at t = 20 s
        world.step()
        assert world.status().collision_with is None
    assert world.traffic[0].speed == 0.0
    assert world.ego.speed < 0.05
    assert 1.0 < world.leader().gap_m < 8.0


def test_world_step_takes_control_actuation_or_override_but_only_one():
    world = _world_on([Straight(300.0)], ego_speed=5.0)
    start = world.ego
    world.step(VehicleControl(throttle=1.0))
    assert world.ego.speed > start.speed
    world.step(actuation=Actuation(-2.0, 0.1))
    assert world.ego.yaw > start.yaw
    override = EgoState(world.ego.x + 1.0, world.ego.y, world.ego.yaw, 3.0)
    world.step(ego_override=override)
    assert world.ego == override and world.tick == 3
    assert world.time_s == pytest.approx(0.15)
    with pytest.raises(ValueError, match="at most one"):
        world.step(VehicleControl(), actuation=Actuation(0.0, 0.0))


def test_status_reports_lane_departure_and_collision():
    car = VEHICLE_SHAPES["car"]
    parked = TrafficVehicle(id=7, shape=car, colour=(0, 0, 200), path_name="lane", s=30.0, speed=0.0,
                            cruise_mps=0.0, parked=True)
    world = _world_on([Straight(300.0)], ego_speed=8.0, traffic=[parked])
    for _ in range(200):   # full throttle straight ahead, no braking: it must hit the parked car
        world.step(VehicleControl(throttle=0.6))
        if world.status().collision_with is not None:
            break
    assert world.status().collision_with == 7
    world = _world_on([Straight(300.0)], ego_speed=8.0)
    for _ in range(40):
        world.step(VehicleControl(throttle=0.3, steer=-0.3))   # steer left off the lane
    status = world.status()
    assert status.off_lane and status.lateral_offset_m > 1.0
    assert 0.0 < status.route_completion < 1.0


def test_boxes_overlap_separating_axes():
    square = np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
    assert boxes_overlap(square, square + [1.5, 0.0])
    assert not boxes_overlap(square, square + [2.1, 0.0])
    diamond = np.array([[0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [1.0, 0.0]]) * 1.2 + [2.3, 2.3]
    assert not boxes_overlap(square, diamond)


# ----------------------------------------------------------------------------- commands
@pytest.mark.parametrize("turn", ["left", "straight", "right"])
def test_command_follows_the_route_at_constructed_intersections(turn):
    road = build_road([Straight(150.0), Crossing(turn), Straight(100.0)], RoadSettings(), start_yaw=-1.0)
    crossing = road.crossings[0]
    settings = CommandSettings()

    def command_at(s):
        return route_command(road, s, road.lane.pose_at(s), settings)[0]

    assert command_at(crossing.lane_s_entry - settings.crossing_distance_m - 5.0) == "straight"
    for before in (settings.crossing_distance_m - 1.0, 20.0, 1.0):
        assert command_at(crossing.lane_s_entry - before) == turn
    assert command_at(0.5 * (crossing.lane_s_entry + crossing.lane_s_exit)) == turn
    assert command_at(crossing.lane_s_exit + 5.0) == "straight"

    # the expert's future agrees: the last waypoint of a frame just before the box lies on that side
    world = _world_on([Straight(150.0), Crossing(turn), Straight(100.0)], ego_speed=4.0, start_s=100.0, yaw=-1.0)
    poses = []
    for _ in range(int(14.0 / 0.05)):
        poses.append((world.ego.x, world.ego.y, world.ego.yaw, world.lane_s))
        world.step()
    tick = next(i for i, p in enumerate(poses) if p[3] >= crossing.lane_s_entry - 8.0)
    x, y, yaw, _ = poses[tick]
    final = world_to_ego(np.array([poses[tick + 80][:2]]), (x, y), yaw)[0]
    lateral = {"left": final[1] > 5.0, "straight": abs(final[1]) < 1.0, "right": final[1] < -5.0}
    assert lateral[turn], final


def test_command_from_curves_sharp_turns_but_gentle_bends_stay_straight():
    sharp = build_road([Straight(100.0), Curve(25.0, 90.0), Straight(80.0)], RoadSettings())
    s = 100.0 - 10.0
    assert route_command(sharp, s, sharp.lane.pose_at(s), CommandSettings()) == ("left", "route")
    sharp_right = build_road([Straight(100.0), Curve(25.0, -90.0), Straight(80.0)], RoadSettings())
    assert route_command(sharp_right, s, sharp_right.lane.pose_at(s), CommandSettings())[0] == "right"
    gentle = build_road([Straight(100.0), Curve(220.0, 25.0), Straight(80.0)], RoadSettings())
    assert route_command(gentle, s, gentle.lane.pose_at(s), CommandSettings())[0] == "straight"


# ----------------------------------------------------------------------------- episode ground truth
@pytest.fixture(scope="module")
def episode():
    return simulate_episode(3, 2, EpisodeSettings(frames=40, frame_stride=4, camera=SMALL_CAMERA))


def test_future_waypoints_equal_an_independent_rerun_of_the_world(episode):
    settings = episode.settings
    world, _ = make_world(3, 2, settings)
    positions = [(world.ego.x, world.ego.y, world.ego.yaw)]
    for _ in range(settings.total_ticks - 1):
        world.step()
        positions.append((world.ego.x, world.ego.y, world.ego.yaw))
    positions = np.array(positions)
    for frame in (0, 17, settings.frames - 1):
        truth = episode.truth(frame, [])
        tick = settings.warmup_ticks + frame * settings.frame_stride
        assert truth.tick == tick
        assert truth.stamp_s == pytest.approx(settings.start_time_s + tick * 0.05)
        x, y, yaw = positions[tick]
        future = positions[tick + 10:tick + 81:10, :2]       # +0.5 s ... +4.0 s
        expected = np.stack([np.cos(yaw) * (future[:, 0] - x) + np.sin(yaw) * (future[:, 1] - y),
                             -np.sin(yaw) * (future[:, 0] - x) + np.cos(yaw) * (future[:, 1] - y)], 1)
        np.testing.assert_allclose(truth.waypoints, expected, atol=1e-9)
        assert truth.pose == pytest.approx(tuple(positions[tick]))


def test_velocity_and_acceleration_match_finite_differences(episode):
    tr = episode.track
    dt = 0.05
    p = np.stack([tr.x, tr.y], 1)
    v_world = np.diff(p, axis=0) / dt                                   # velocity over [k, k+1]
    heading_mid = 0.5 * (tr.yaw[1:] + tr.yaw[:-1])
    forward = v_world[:, 0] * np.cos(heading_mid) + v_world[:, 1] * np.sin(heading_mid)
    sideways = -v_world[:, 0] * np.sin(heading_mid) + v_world[:, 1] * np.cos(heading_mid)
    np.testing.assert_allclose(forward, 0.5 * (tr.speed[1:] + tr.speed[:-1]), atol=2e-3)
    assert np.abs(sideways).max() < 2e-3                               # a rear axle does not slide
    a_world = np.diff(v_world, axis=0) / dt                             # acceleration at ticks 1 .. T-2
    yaw = tr.yaw[1:-1]
    ax = a_world[:, 0] * np.cos(yaw) + a_world[:, 1] * np.sin(yaw)
    ay = -a_world[:, 0] * np.sin(yaw) + a_world[:, 1] * np.cos(yaw)
    checked = 0
    for frame in range(episode.settings.frames):
        truth = episode.truth(frame, [])
        k = truth.tick - 1
        # the truth is the step into the tick, the finite difference is centred on it
        truth_ax = 0.5 * (tr.acceleration[truth.tick] + tr.acceleration[truth.tick + 1])
        assert truth.acceleration[0] == pytest.approx(tr.acceleration[truth.tick])
        assert ax[k] == pytest.approx(truth_ax, abs=0.05)
        assert ay[k] == pytest.approx(truth.acceleration[1], abs=0.1 + 0.05 * abs(truth.acceleration[1]))
        assert truth.velocity == (pytest.approx(tr.speed[truth.tick]), 0.0)
        checked += 1
    assert checked == episode.settings.frames
    assert np.abs(tr.accel_estimated[:, 0]).max() > 0.05     # the node-style estimate is populated


def test_question_answers_agree_with_the_ground_truth(episode):
    for frame in range(0, episode.settings.frames, 5):
        rendering = episode.render(frame)
        truth = episode.truth(frame, rendering.boxes)
        n = len(rendering.boxes)
        assert truth.qa["count"] == ("No vehicles." if n == 0 else "1 vehicle." if n == 1 else f"{n} vehicles.")
        lead_visible = truth.leader is not None and truth.leader.vehicle_id in {b.id for b in rendering.boxes}
        if lead_visible and truth.leader.gap_m <= 60:
            assert truth.qa["lead"].startswith(f"Yes, a {truth.leader_label} about")
        else:
            assert truth.qa["lead"] == "No."
        assert truth.qa["action"].endswith(("follow the lane.", "turn left.", "turn right."))


def test_recovery_copies_start_displaced_and_drive_back_to_the_lane_centre():
    plain = EpisodeSettings(frames=30, frame_stride=5, camera=SMALL_CAMERA)
    with_recovery = EpisodeSettings(frames=30, frame_stride=5, camera=SMALL_CAMERA,
                                    recovery=RecoverySettings(fraction=0.5, max_offset_m=1.0, max_yaw_deg=10.0))
    episode, reference = simulate_episode(4, 1, with_recovery), simulate_episode(4, 1, plain)
    np.testing.assert_array_equal(episode.track.x, reference.track.x)     # the episode itself is unchanged
    assert not reference.recoveries and 5 <= len(episode.recoveries) <= 25
    for frame, rec in episode.recoveries.items():
        x, y, yaw = rec.pose
        tick_pose = episode.track.pose(episode.settings.frame_tick(frame))
        assert math.degrees(yaw - tick_pose[2]) == pytest.approx(rec.yaw_deg)
        assert abs(rec.offset_m) <= 1.0 and abs(rec.yaw_deg) <= 10.0
        s, lateral = episode.road.lane.project((x, y))[:2]
        assert lateral == pytest.approx(rec.offset_m, abs=0.05)
        # the expert's future from there, back in the map frame, ends on the lane centre
        c, si = math.cos(yaw), math.sin(yaw)
        end = (x + c * rec.waypoints[-1, 0] - si * rec.waypoints[-1, 1],
               y + si * rec.waypoints[-1, 0] + c * rec.waypoints[-1, 1])
        assert abs(episode.road.lane.project(end, s)[1]) < 0.35
        rgb = episode.render_recovery(frame).rgb
        assert rgb.shape == (54, 96, 3) and not np.array_equal(rgb, episode.render(frame).rgb)


def test_recovery_copies_can_start_from_rest_or_slowed_down():
    settings = EpisodeSettings(frames=30, frame_stride=5, camera=SMALL_CAMERA, traffic=False,
                               recovery=RecoverySettings(fraction=1.0, standstill_probability=0.4, slow_probability=0.4))
    episode = simulate_episode(4, 1, settings)
    kinds = {"rest": 0, "slow": 0, "same": 0}
    for frame, rec in episode.recoveries.items():
        speed = episode.track.speed[episode.settings.frame_tick(frame)]
        if not rec.speed_changed:
            kinds["same"] += 1
            assert rec.speed == speed
        elif rec.speed == 0.0:
            kinds["rest"] += 1          # the expert drives off from rest on an empty road
            assert 0.0 < rec.waypoints[0, 0] < 0.5 and rec.waypoints[-1, 0] > 5.0
        else:
            kinds["slow"] += 1
            assert 0.0 < rec.speed < speed
            # the expert speeds up again: it covers more than the slowed speed would in 4 s
            assert rec.waypoints[-1, 0] > 4.0 * rec.speed
    assert all(n >= 3 for n in kinds.values()), kinds
