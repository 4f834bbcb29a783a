"""The PDM score (NAVSIM v1) on hand-built scenes whose answers are known.

The road runs along x in the ego frame: lanes 3.5 m wide centred on y = 0 (the ego's), 3.5 and 7.0;
the drivable area is the three of them (y from -1.75 to 8.75); progress is measured along y = 0. The
ego is the demo world's car (4.7 x 1.9 m, rear axle 0.95 m ahead of its rear bumper, front bumper
3.75 m ahead of the axle). A plan at the ego's own constant speed is tracked exactly, so its progress
is speed x 4 s. ``reference_progress_m`` is what a rule-based planner made good; 0 makes EP = 1 for
any plan that gets more than 5 m (it is then the best of the two), with NC x DAC = 1.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from wam_diff2_core.pdm.comfort import _local_polynomial
from wam_diff2_core.pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S, AgentTrack, Area, EgoStart, PdmScene, Vehicle
from wam_diff2_core.pdm.score import pdm_score, reference_progress
from wam_diff2_core.pdm.tracking import plan_headings, speed_and_curvature_profiles, track_plan

T = np.arange(1, 9) * 0.5                                   # [8] waypoint times, s
AGENT_T = np.arange(OBSERVATION_SAMPLES) * SIM_DT_S         # [50] agent box times, s
LINE = np.array([[-50.0, 0.0], [300.0, 0.0]])
LANES = [Area.corridor(LINE + [0.0, 3.5 * k], 3.5) for k in range(3)]


def scene(agents=(), lanes=LANES) -> PdmScene:
    return PdmScene(centreline=LINE, drivable=Area.corridor(LINE + [0.0, 3.5], 10.5), agents=agents, lanes=lanes)


def straight(speed_mps: float) -> np.ndarray:
    return np.stack([speed_mps * T, np.zeros(8)], axis=1)


def weighted(ep: float, ttc: float, c: float) -> float:
    return (5 * ep + 5 * ttc + 2 * c) / 12


def test_a_perfect_plan_scores_one_everywhere():
    result = pdm_score(straight(10.0), EgoStart(10.0), scene(), reference_progress_m=40.0)
    assert (result.nc, result.dac, result.ttc, result.c) == (1.0, 1.0, 1.0, 1.0)
    assert result.progress_m == pytest.approx(40.0, abs=1e-9)           # the reference's 40 m, to rounding
    assert result.ep == pytest.approx(1.0, abs=1e-12) and result.pdms == pytest.approx(1.0, abs=1e-12)
    assert result.collision_time_s is None and result.ttc_time_s is None
    assert all(result.comfort.values())


def test_a_plan_through_a_parked_car_is_an_at_fault_collision_and_scores_zero():
    parked = AgentTrack.moving(x=25.1, y=0.0, yaw=0.0, speed_mps=0.0)   # rear bumper at 22.85 m
    result = pdm_score(straight(10.0), EgoStart(10.0), scene([parked]), reference_progress_m=40.0)
    assert result.nc == 0.0                  # a vehicle (an agent): 0, not 0.5
    assert result.collision_time_s == pytest.approx(2.0)     # front bumper 3.75 + 10 t passes 22.85 m after 1.91 s
    assert result.ttc == 0.0
    assert result.ep == 0.0                  # progress x NC
    assert result.pdms == 0.0


def test_hitting_a_static_object_halves_nc_and_the_progress_that_counts():
    cone = AgentTrack.moving(x=25.1, y=0.0, yaw=0.0, speed_mps=0.0, length_m=0.5, width_m=0.5, kind="static")
    result = pdm_score(straight(10.0), EgoStart(10.0), scene([cone]), reference_progress_m=40.0)
    assert (result.nc, result.dac, result.ttc, result.c) == (0.5, 1.0, 0.0, 1.0)
    assert result.ep == pytest.approx(0.5, abs=1e-12)        # 40 m x NC 0.5 against the reference's 40 m
    assert result.pdms == pytest.approx(0.5 * weighted(0.5, 0.0, 1.0), abs=1e-12)     # 0.1875


def test_leaving_the_drivable_area_scores_zero():
    plan = np.stack([10.0 * T, -0.5 * T * T], axis=1)         # 8 m to the right by 4 s
    result = pdm_score(plan, EgoStart(10.0), scene(), reference_progress_m=40.0)
    assert (result.nc, result.dac) == (1.0, 0.0)
    assert result.pdms == 0.0


def test_too_close_behind_a_braking_car_fails_ttc_without_a_collision():
    # the ego brakes at 2.5 m/s^2 from 10 m/s; the car 14 m ahead (bumper to bumper) brakes at 6 m/s^2
    lead = AgentTrack.moving(x=3.75 + 14.0 + 2.25, y=0.0, yaw=0.0, speed_mps=10.0, acceleration_mps2=-6.0)
    plan = np.stack([10.0 * T - 1.25 * T * T, np.zeros(8)], axis=1)
    result = pdm_score(plan, EgoStart(10.0), scene([lead]), reference_progress_m=0.0)
    gap = (lead.xy[:41, 0] - 2.25) - (result.rollout.x + 3.75)
    assert gap.min() > 0.5                                    # never touches it
    assert (result.nc, result.dac, result.ttc, result.ep, result.c) == (1.0, 1.0, 0.0, 1.0, 1.0)
    assert result.collision_time_s is None and result.ttc_time_s is not None
    assert result.pdms == pytest.approx(weighted(1.0, 0.0, 1.0), abs=1e-12)   # 7 / 12


def test_a_jerky_plan_fails_comfort():
    plan = np.stack([10.0 * T + np.where(np.arange(8) % 2 == 0, 1.5, -1.5), np.zeros(8)], axis=1)
    result = pdm_score(plan, EgoStart(10.0), scene(), reference_progress_m=0.0)
    assert (result.nc, result.dac, result.ttc, result.ep, result.c) == (1.0, 1.0, 1.0, 1.0, 0.0)
    assert not result.comfort["lon_acceleration"]
    assert result.pdms == pytest.approx(weighted(1.0, 1.0, 0.0), abs=1e-12)   # 10 / 12


def test_a_slow_plan_gets_its_share_of_the_reference_progress():
    result = pdm_score(straight(5.0), EgoStart(5.0), scene(), reference_progress_m=40.0)
    assert result.progress_m == pytest.approx(20.0, abs=1e-9)
    assert result.ep == pytest.approx(0.5, abs=1e-12)
    assert result.pdms == pytest.approx(weighted(0.5, 1.0, 1.0), abs=1e-12)   # 9.5 / 12


def test_standing_still_makes_no_progress_and_both_under_5_m_count_as_full_progress():
    stand = pdm_score(np.zeros((8, 2)), EgoStart(0.0), scene(), reference_progress_m=40.0)
    assert (stand.nc, stand.dac, stand.ttc, stand.ep, stand.c) == (1.0, 1.0, 1.0, 0.0, 1.0)
    assert stand.progress_m == 0.0 and stand.pdms == pytest.approx(7 / 12, abs=1e-12)
    assert np.all(stand.rollout.x == 0.0) and np.all(stand.rollout.speed == 0.0)
    at_a_red_light = pdm_score(np.zeros((8, 2)), EgoStart(0.0), scene(), reference_progress_m=3.0)
    assert at_a_red_light.ep == 1.0 and at_a_red_light.pdms == 1.0


def test_a_car_running_into_the_ego_from_behind_is_not_the_egos_fault():
    chaser = AgentTrack.moving(x=-10.0, y=0.0, yaw=0.0, speed_mps=8.0)   # catches the 2 m/s ego after 1.1 s
    result = pdm_score(straight(2.0), EgoStart(2.0), scene([chaser]), reference_progress_m=0.0)
    assert (result.nc, result.ttc, result.pdms) == (1.0, 1.0, 1.0)


def test_a_lateral_hit_is_the_egos_fault_only_while_it_straddles_lanes():
    # a car drifts from the next lane into the ego's side while the ego keeps its lane: not at fault
    drifting = AgentTrack(xy=np.stack([1.4 + 10.0 * AGENT_T, np.maximum(3.5 - AGENT_T, 1.5)], axis=1),
                          yaw=np.zeros(OBSERVATION_SAMPLES))
    kept_lane = pdm_score(straight(10.0), EgoStart(10.0), scene([drifting]), reference_progress_m=0.0)
    assert kept_lane.nc == 1.0 and kept_lane.collision_time_s is None
    # the ego changes lanes into the side of a car driving beside it, 2 m further back (its front edge
    # never touches it): at fault while the ego straddles the two lanes; with no lanes known it never does
    beside = AgentTrack.moving(x=1.4 - 2.0, y=3.5, yaw=0.0, speed_mps=10.0)
    s = np.clip((T - 0.5) / 3.0, 0.0, 1.0)
    plan = np.stack([10.0 * T, 3.5 * (3 * s * s - 2 * s ** 3)], axis=1)
    changed = pdm_score(plan, EgoStart(10.0), scene([beside]), reference_progress_m=0.0)
    assert changed.dac == 1.0 and changed.nc == 0.0 and changed.pdms == 0.0
    assert changed.collision_time_s == pytest.approx(2.0)
    no_lanes = pdm_score(plan, EgoStart(10.0), scene([beside], lanes=()), reference_progress_m=0.0)
    assert no_lanes.nc == 1.0 and no_lanes.collision_time_s is None
    assert pdm_score(plan, EgoStart(10.0), scene(), reference_progress_m=0.0).nc == 1.0


def test_an_agent_the_ego_already_overlaps_at_the_start_is_ignored():
    # boxes that disagree with the recording (NAVSIM ignores what the ego touches at t = 0)
    touching = AgentTrack.moving(x=1.4, y=1.5, yaw=0.0, speed_mps=0.0)
    result = pdm_score(straight(10.0), EgoStart(10.0), scene([touching]), reference_progress_m=40.0)
    assert (result.nc, result.ttc) == (1.0, 1.0) and result.pdms == pytest.approx(1.0, abs=1e-12)


def test_no_agents_and_an_agent_far_away_score_the_same():
    far = AgentTrack.moving(x=200.0, y=7.0, yaw=math.pi, speed_mps=10.0)
    alone = pdm_score(straight(10.0), EgoStart(10.0), scene(), reference_progress_m=40.0)
    with_far = pdm_score(straight(10.0), EgoStart(10.0), scene([far]), reference_progress_m=40.0)
    assert alone.as_dict() == with_far.as_dict()


def test_reference_progress_is_the_reference_plans_progress_times_its_nc_and_dac():
    assert reference_progress(straight(10.0), EgoStart(10.0), scene()) == pytest.approx(40.0, abs=1e-9)
    parked = AgentTrack.moving(x=25.1, y=0.0, yaw=0.0, speed_mps=0.0)
    assert reference_progress(straight(10.0), EgoStart(10.0), scene([parked])) == 0.0


# ----------------------------------------------------------------------------- the tracker and the smoothing
def test_the_tracker_drives_a_constant_speed_plan_exactly_and_fits_a_circles_profiles():
    rollout = track_plan(straight(10.0), EgoStart(10.0))
    assert np.allclose(rollout.x, 10.0 * rollout.t_s, atol=1e-9) and np.allclose(rollout.y, 0.0)
    assert np.allclose(rollout.speed, 10.0, atol=1e-9)
    radius, speed = 30.0, 8.0
    t = np.arange(41) * SIM_DT_S
    poses = np.stack([radius * np.sin(speed * t / radius), radius * (1 - np.cos(speed * t / radius)),
                      speed * t / radius], axis=1)
    speeds, curvatures = speed_and_curvature_profiles(poses)
    assert np.allclose(speeds, speed, atol=2e-3) and np.allclose(curvatures, 1 / radius, atol=1e-4)
    # on the circle it turns left, steering towards atan(L / R) (NAVSIM's LQR lags behind it)
    circle = track_plan(poses[5::5, :2], EgoStart(speed), Vehicle())
    assert 0.0 < circle.steering[-1] < math.atan(Vehicle().wheelbase_m / radius)
    assert circle.heading[-1] > 0.5 * speed * 4.0 / radius


def test_the_tracker_drives_as_navsims_own_does():
    """NAVSIM v1.1's BatchLQRTracker + BatchKinematicBicycleModel (run from its repository with nuPlan's
    types stubbed) on this plan's reference poses (``reference_poses``), from 10 m/s and 0.5 m/s^2:
    x, y and speed at 1, 2, 3 and 4 s."""
    navsim = np.array([[10.671872907662, 0.231696469291, 10.16419323071],
                       [20.95142614327, 1.606250457842, 9.84327053309],
                       [30.879543534484, 3.851477496396, 9.62257065817],
                       [38.304057600663, 6.482666390236, 6.202826597552]])
    plan = np.stack([10.0 * T + np.where(np.arange(8) % 2 == 0, 1.5, -1.5), 0.3 * T * T], axis=1)
    rollout = track_plan(plan, EgoStart(10.0, acceleration_mps2=0.5))
    ours = np.stack([rollout.x, rollout.y, rollout.speed], axis=1)[10::10]
    assert np.allclose(ours, navsim, atol=1e-9)


def test_waypoint_headings_are_the_paths_tangent_on_a_line_and_an_arc():
    angle = 8.0 * T / 30.0
    arc = np.stack([30.0 * np.sin(angle), 30.0 * (1 - np.cos(angle))], axis=1)
    assert np.allclose(plan_headings(arc), angle, atol=1e-12)
    assert np.allclose(plan_headings(straight(10.0)), 0.0)
    assert np.allclose(plan_headings(np.zeros((8, 2))), 0.0)          # standing still keeps the ego's heading


def test_the_smoothing_reproduces_polynomials_and_reads_an_even_window_half_a_sample_late():
    t = np.arange(41) * SIM_DT_S
    quadratic = 1.0 + 2.0 * t - 3.0 * t * t
    assert np.allclose(_local_polynomial(quadratic, 41, 2, 0, SIM_DT_S), quadratic)
    assert np.allclose(_local_polynomial(quadratic, 41, 2, 1, SIM_DT_S), 2.0 - 6.0 * t)
    assert np.allclose(_local_polynomial(quadratic, 5, 3, 2, SIM_DT_S), -6.0)
    ramp = _local_polynomial(t, 8, 2, 0, SIM_DT_S)
    assert np.allclose(ramp[4:-4], t[4:-4] + 0.5 * SIM_DT_S)    # scipy's even window, inside
    assert np.allclose(ramp[:4], t[:4]) and np.allclose(ramp[-4:], t[-4:])     # ... and at the ends


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("plan, message", [
    (np.full((8, 2), np.nan), r"waypoint\(s\) \[0, 1, 2, 3, 4, 5, 6, 7\]"),
    (np.vstack([straight(10.0)[:3], [[np.inf, 0.0]], straight(10.0)[4:]]), r"waypoint\(s\) \[3\]"),
    (np.zeros((7, 2)), r"plan must be \[8, 2\]"),
    (np.zeros(16), r"plan must be \[8, 2\]"),
])
def test_a_plan_that_is_not_8_finite_waypoints_is_refused_naming_what_is_wrong(plan, message):
    with pytest.raises(ValueError, match=message):
        pdm_score(plan, EgoStart(10.0), scene(), reference_progress_m=40.0)


def test_bad_scene_inputs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="reference_progress_m"):
        pdm_score(straight(10.0), EgoStart(10.0), scene(), reference_progress_m=float("nan"))
    with pytest.raises(ValueError, match="EgoStart must be finite"):
        EgoStart(float("nan"))
    with pytest.raises(ValueError, match=r"agent 'short': 10 boxes; the score needs 50"):
        AgentTrack(xy=np.zeros((10, 2)), yaw=np.zeros(10), name="short")
    with pytest.raises(ValueError, match="kind 'tree'"):
        AgentTrack.moving(x=0.0, y=0.0, yaw=0.0, speed_mps=0.0, kind="tree")
    with pytest.raises(ValueError, match="corridor width_m"):
        Area.corridor(LINE, 0.0)
    with pytest.raises(ValueError, match="PdmScene.centreline"):
        PdmScene(centreline=np.zeros((1, 2)), drivable=Area.corridor(LINE, 3.5))


# ----------------------------------------------------------------------------- the demo world's frames
@pytest.fixture(scope="module")
def world_frame():
    """Frame 3 of demo episode (0, 0): the expert drives 6.4 m/s on a straight with an oncoming car
    about 30 m ahead in the other lane (3.5 m to the left)."""
    from wam_diff2_core.sim.episode import EpisodeSettings, simulate_episode
    from wam_diff2_core.sim.pdm_scenes import frame_pdm_inputs

    episode = simulate_episode(seed=0, index=0, settings=EpisodeSettings(frames=4, frame_stride=10))
    return episode, 3, frame_pdm_inputs(episode, 3)


def test_the_demo_worlds_expert_is_the_reference_and_scores_one(world_frame):
    from wam_diff2_core.sim.pdm_scenes import score_frame_plan

    episode, frame, inputs = world_frame
    expert = episode.future_waypoints(episode.settings.frame_tick(frame))
    result = score_frame_plan(episode, frame, expert, inputs)
    assert result.progress_m == inputs.reference_progress_m > 20.0
    assert (result.nc, result.dac, result.ttc, result.ep, result.c, result.pdms) == (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def test_a_demo_world_plan_into_the_oncoming_car_or_off_the_road_scores_zero(world_frame):
    from wam_diff2_core.sim.pdm_scenes import score_frame_plan

    episode, frame, inputs = world_frame
    speed = inputs.ego.speed_mps
    s = np.clip(T / 1.5, 0.0, 1.0)
    swerve = 3 * s * s - 2 * s ** 3                                            # 0 -> 1 over 1.5 s
    head_on = score_frame_plan(episode, frame, np.stack([speed * T, 2.8 * swerve], axis=1), inputs)
    assert (head_on.nc, head_on.dac, head_on.pdms) == (0.0, 1.0, 0.0)      # still on the road: the car
    off_road = score_frame_plan(episode, frame, np.stack([speed * T, -8.0 * swerve], axis=1), inputs)
    assert (off_road.nc, off_road.dac, off_road.pdms) == (1.0, 0.0, 0.0)   # 8 m right of the ego lane


def test_demo_world_agents_are_the_worlds_boxes_then_move_on_at_their_last_speed(world_frame):
    from wam_diff2_core.geometry import world_to_ego

    episode, frame, inputs = world_frame
    tick = episode.settings.frame_tick(frame)
    x, y, yaw = episode.track.pose(tick)
    last_stored = len(episode.traffic) - 1                                  # the last tick the episode keeps
    for agent in inputs.scene.agents:
        vehicle_id = int(agent.name.split()[-1])
        for k in (0, 20):
            box = next(b for b in episode.traffic[tick + 2 * k] if b.id == vehicle_id)
            assert np.allclose(agent.xy[k], world_to_ego(np.array([[box.x, box.y]]), (x, y), yaw)[0])
            assert agent.yaw[k] == pytest.approx(box.yaw - yaw)
        last = next((b for b in episode.traffic[last_stored] if b.id == vehicle_id), None)
        if last is not None and (last_stored - tick) % 2 == 0:
            k_last = (last_stored - tick) // 2
            moved = np.hypot(*(agent.xy[-1] - agent.xy[k_last]))
            assert moved == pytest.approx(last.speed * (len(agent.xy) - 1 - k_last) * SIM_DT_S)
    assert len(inputs.scene.agents) == len(episode.traffic[tick])


def test_a_live_worlds_scene_is_the_recorded_episodes_at_the_same_tick(world_frame):
    """world_pdm_inputs (the closed loop) rolls a copy of the world forward instead of reading recorded ticks:
    the same world at the same tick gives the same scene, reference and scores, and the world is unchanged."""
    from wam_diff2_core.sim.episode import make_world
    from wam_diff2_core.sim.pdm_scenes import world_pdm_inputs

    episode, frame, recorded = world_frame
    world, _ = make_world(episode.seed, episode.index, episode.settings)
    for _ in range(episode.settings.frame_tick(frame)):
        world.step()
    before = (world.ego, world.tick, [(v.id, v.s, v.speed) for v in world.traffic])
    live = world_pdm_inputs(world)
    assert before == (world.ego, world.tick, [(v.id, v.s, v.speed) for v in world.traffic])
    assert live.ego == recorded.ego and live.reference_progress_m == pytest.approx(recorded.reference_progress_m)
    assert [a.name for a in live.scene.agents] == [a.name for a in recorded.scene.agents]
    for a, b in zip(live.scene.agents, recorded.scene.agents):
        assert np.allclose(a.xy[:20], b.xy[:20]) and np.allclose(a.yaw[:20], b.yaw[:20])
    speed = recorded.ego.speed_mps
    for plan in (episode.future_waypoints(episode.settings.frame_tick(frame)), np.stack([speed * T, 0 * T], 1),
                 np.stack([speed * T, 2.8 * np.clip(T / 1.5, 0, 1)], 1)):
        assert live.score(plan).pdms == pytest.approx(recorded.score(plan).pdms)


def test_a_frame_the_episode_lacks_is_refused(world_frame):
    from wam_diff2_core.sim.pdm_scenes import frame_pdm_inputs

    episode, _, _ = world_frame
    with pytest.raises(ValueError, match=r"frame 4 is not in the episode \(0 ... 3\)"):
        frame_pdm_inputs(episode, 4)


def test_a_data_sets_manifest_gives_back_its_settings_and_sample_ids_their_frames():
    import dataclasses
    import json

    from wam_diff2_core.sim.dataset_export import (MANIFEST_FORMAT, ExportSettings, planning_sample_frame,
                                                   sample_stem, settings_from_manifest)
    from wam_diff2_core.sim.episode import EpisodeSettings, RecoverySettings

    settings = ExportSettings(episodes=3, seed=7, formats=("json",), commands=("left", "right"),
                              episode=EpisodeSettings(frames=11, frame_stride=5, recovery=RecoverySettings(0.5)))
    manifest = json.loads(json.dumps({"format": MANIFEST_FORMAT, "settings": dataclasses.asdict(settings)}))
    assert settings_from_manifest(manifest) == settings
    manifest["settings"]["episode"]["world"]["fog"] = 1
    with pytest.raises(ValueError, match=r"manifest settings.episode.world: unknown field\(s\) \['fog'\]"):
        settings_from_manifest(manifest)
    with pytest.raises(ValueError, match="not a wam-diff2-synth/1 manifest"):
        settings_from_manifest({"format": "other"})
    assert planning_sample_frame(sample_stem(7, 2, 10) + "-plan") == (7, 2, 10)
    assert planning_sample_frame(sample_stem(7, 2, 10) + "-plan-recovery") is None      # a displaced ego
    assert planning_sample_frame("s0") is None
