"""Candidate selection: N plan candidates in one batched decode, the best by the online PDM score.

The scorer on hand-built plans (a clear plan beats one through a parked car; ties go to the earliest;
nothing valid: no selection), the online scene (route corridor, constant-velocity objects, no ground
truth), and the policy: N = 1 is today's decode, row 1 of N is that same greedy decode, the published
plan is the best-scored candidate, and with no candidate parsing the plan is invalid as today.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from test.support import REPO_ROOT
from wam_diff2_core.candidate_selection import (CandidateSettings, TrackedObject, ego_start, online_scene)
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S
from wam_diff2_core.pdm.score import pdm_score
from wam_diff2_core.policy import DrivingPolicy

DEMO_B32 = REPO_ROOT / "models" / "wam-diff2-demo-b32"
T = np.arange(1, 9) * 0.5


def _straight(speed_mps: float, lateral_m: float = 0.0) -> np.ndarray:
    return np.stack([speed_mps * T, np.full(8, lateral_m)], axis=1)


def _route(length_m: float = 300.0) -> np.ndarray:
    return np.stack([np.linspace(-50.0, length_m, 200), np.zeros(200)], axis=1)


def test_a_clear_plan_beats_one_through_a_parked_car_and_ep_is_against_the_best_candidate():
    scene = online_scene((0.0, 0.0), 0.0, 8.0, route_xy=_route(), lane_width_m=7.0,
                         objects=[TrackedObject(x=36.0, y=0.0, yaw=0.0)])
    through, stopping, slow = _straight(8.0), _straight(0.0), _straight(4.0)
    selection = scene.select([through, None, stopping, slow])
    results = selection.results
    assert results[0].nc == 0.0 and results[0].pdms == 0.0          # hits the parked car
    assert results[1] is None and selection.valid == 3
    assert selection.index == 3 and results[3].nc == 1.0            # the slow plan stops short of it
    # EP's reference is the best progress x NC x DAC among the candidates (here the slow plan's own)
    assert results[3].reference_progress_m == pytest.approx(results[3].progress_m)
    assert results[3].ep == pytest.approx(1.0)


def test_with_the_first_candidate_as_progress_reference_planning_faster_than_it_gains_nothing():
    """EP against row 1's progress: a faster clear plan scores no better than the greedy one (the tie goes to
    row 1) and a slower one loses EP; when row 1 did not parse the reference is the best candidate's."""
    scene = online_scene((0.0, 0.0), 0.0, 8.0, route_xy=_route(), lane_width_m=7.0)
    greedy, faster, slower = _straight(8.0), _straight(10.0), _straight(4.0)
    best = scene.select([greedy, faster, slower])
    assert best.index == 1 and best.results[0].ep < 1.0               # "best": the faster plan sets EP
    first = scene.select([greedy, faster, slower], "first")
    assert first.index == 0 and first.results[1].ep == first.results[0].ep == pytest.approx(1.0)
    assert first.results[2].ep == pytest.approx(first.results[2].progress_m / first.results[0].progress_m)
    fallback = scene.select([None, faster, slower], "first")
    assert fallback.index == 1 and fallback.results[1].reference_progress_m == pytest.approx(
        fallback.results[1].progress_m)
    off_road = greedy.copy()
    off_road[:, 1] = np.linspace(0.5, 12.0, 8)             # row 1 leaves the corridor: no progress to offer
    fails = scene.select([off_road, faster, slower], "first")
    assert fails.results[0].dac == 0.0 and fails.index == 1          # the faster plan is not tied with the slower
    assert fails.results[2].ep == pytest.approx(fails.results[2].progress_m / fails.results[1].progress_m)
    with pytest.raises(ValueError, match="progress_reference"):
        scene.select([greedy], "fastest")


def test_ties_go_to_the_earliest_candidate_and_no_valid_candidate_selects_nothing():
    scene = online_scene((0.0, 0.0), 0.0, 8.0, route_xy=_route(), lane_width_m=7.0)
    plan = _straight(8.0)
    assert scene.select([plan, plan.copy(), plan.copy()]).index == 0
    assert scene.select([None, None]) is None
    off_road = _straight(8.0, lateral_m=0.0)
    off_road[:, 1] = np.linspace(0.5, 12.0, 8)                       # drifts out of the 7 m corridor
    selection = scene.select([off_road, plan])
    assert selection.results[0].dac == 0.0 and selection.index == 1


def test_the_scene_is_in_the_ego_frame_with_objects_moved_on_at_constant_velocity():
    # ego at (100, 50) heading north; an object 10 m ahead (north) driving east at 4 m/s, measured 0.5 s ago
    obj = TrackedObject(x=100.0, y=60.0, yaw=0.0, vx=4.0, vy=0.0, age_s=0.5, length_m=4.0, width_m=2.0, name="a")
    scene = online_scene((100.0, 50.0), math.pi / 2, 5.0, route_xy=np.array([[100.0, 0.0], [100.0, 400.0]]),
                         objects=[obj])
    agent = scene.scene.agents[0]
    assert len(agent.xy) == OBSERVATION_SAMPLES
    # ego frame: x forward (north), y left (west); east is -y
    assert agent.xy[0] == pytest.approx([10.0, -2.0])                # moved on by the message's age
    assert agent.xy[10] == pytest.approx([10.0, -2.0 - 4.0 * 10 * SIM_DT_S])
    assert agent.yaw == pytest.approx(np.full(OBSERVATION_SAMPLES, -math.pi / 2))
    assert (agent.length_m, agent.width_m) == (4.0, 2.0)
    assert agent.initial_speed_mps == pytest.approx(4.0)
    # the corridor follows the route, which runs along the ego's heading: x forward in the ego frame
    assert np.allclose(scene.scene.centreline[:, 1], 0.0, atol=1e-9)
    assert scene.scene.drivable.contains(np.array([[20.0, 1.7], [20.0, -1.7]])).all()
    assert not scene.scene.drivable.contains(np.array([[20.0, 1.8]])).any()
    # a slower car ahead in the lane (north at 1 m/s): a plan that keeps 5 m/s runs into it, a stopping one does not
    ahead = TrackedObject(x=100.0, y=62.0, yaw=math.pi / 2, vx=0.0, vy=1.0)
    scene = online_scene((100.0, 50.0), math.pi / 2, 5.0, route_xy=np.array([[100.0, 0.0], [100.0, 400.0]]),
                         objects=[ahead])
    results = scene.score_all([_straight(5.0), _straight(0.0)])
    assert results[0].nc == 0.0 and results[1].nc == 1.0


def test_agents_far_from_every_plan_are_left_out_and_change_no_score():
    near = [TrackedObject(x=30.0, y=0.0, yaw=0.0),                                  # on the path
            TrackedObject(x=60.0, y=-30.0, yaw=math.pi / 2, vx=0.0, vy=8.0),       # crosses it later
            TrackedObject(x=6.0, y=-12.0, yaw=0.0)]                                 # beside it, within reach
    far = [TrackedObject(x=-80.0, y=40.0, yaw=0.0), TrackedObject(x=20.0, y=-60.0, yaw=0.0, vx=-3.0)]
    scene = online_scene((0.0, 0.0), 0.0, 8.0, route_xy=_route(), lane_width_m=7.0, objects=near + far)
    plans = [_straight(8.0), _straight(4.0), _straight(12.0)]
    kept = scene.near_agents(plans)
    assert len(kept) == 3 and all(k is a for k, a in zip(kept, scene.scene.agents[:3]))
    for plan, result in zip(plans, scene.score_all(plans)):
        full = pdm_score(plan, scene.ego, scene.scene, result.reference_progress_m)   # every agent
        assert (result.nc, result.ttc, result.pdms, result.collision_time_s, result.ttc_time_s) == \
            (full.nc, full.ttc, full.pdms, full.collision_time_s, full.ttc_time_s)
    assert scene.near_agents([None]) == ()


def test_without_a_route_the_area_is_unknown_and_progress_runs_along_the_heading():
    scene = online_scene((3.0, 4.0), 1.0, 6.0)
    plan = _straight(6.0, 0.0)
    plan[:, 1] = np.linspace(0.0, 30.0, 8)                           # far sideways: no lane is known
    result = scene.score_all([plan])[0]
    assert result.dac == 1.0
    assert result.progress_m == pytest.approx(pdm_score(plan, scene.ego, scene.scene, 0.0).progress_m)


def test_ego_start_steering_from_yaw_rate():
    assert ego_start(10.0, 0.5, 0.0).steering_angle_rad == 0.0
    assert ego_start(10.0, 0.5, 0.2).steering_angle_rad == pytest.approx(math.atan(2.8 * 0.2 / 10.0))
    assert ego_start(0.1, 0.0, 0.5).steering_angle_rad == 0.0        # too slow to read steering from it


@pytest.mark.parametrize("kwargs,match", [
    ({"count": 0}, "candidates"), ({"count": 2.0}, "candidates"), ({"count": 99}, "candidates"),
    ({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"seed": -1}, "seed"),
    ({"lane_width_m": float("nan")}, "lane_width_m"), ({"progress_reference": "fastest"}, "progress_reference")])
def test_bad_candidate_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CandidateSettings(**kwargs)


def test_bad_objects_and_poses_are_refused():
    with pytest.raises(ValueError, match="finite"):
        TrackedObject(x=float("nan"), y=0.0, yaw=0.0)
    with pytest.raises(ValueError, match="ego pose"):
        online_scene((0.0, float("inf")), 0.0, 5.0)
    with pytest.raises(ValueError, match="route_xy"):
        online_scene((0.0, 0.0), 0.0, 5.0, route_xy=np.zeros((3, 3)))


# ----------------------------------------------------------------------------- the policy
@pytest.fixture(scope="module")
def demo_frame():
    from wam_diff2_core.sim.episode import EpisodeSettings, simulate_episode
    from wam_diff2_core.sim.protocol import DEMO_DRIVE_SEED
    episode = simulate_episode(seed=DEMO_DRIVE_SEED, index=0, settings=EpisodeSettings(frames=10))
    frame = list(episode.frames())[8]
    return frame.rgb, frame.truth


@pytest.fixture(scope="module")
def demo_loaded():
    return load_checkpoint(DEMO_B32, device="cpu", dtype="float32")


def test_one_candidate_is_todays_decode_and_row_one_of_n_is_that_same_greedy_decode(demo_loaded, demo_frame):
    rgb, truth = demo_frame
    ego = EgoMotion(velocity=truth.velocity, acceleration=truth.acceleration_estimated)
    today = DrivingPolicy(demo_loaded).step(rgb, ego, truth.command)
    assert today.candidates == 1 and today.selection is None and today.plan_candidates == ()
    assert today.plan.valid and today.valid_candidates == 1
    scene = online_scene(truth.pose[:2], truth.pose[2], truth.velocity[0])
    four = DrivingPolicy(demo_loaded, candidates=CandidateSettings(count=4, temperature=1.5, top_p=1.0))
    out = four.step(rgb, ego, truth.command, scene=scene)
    assert out.candidates == 4 and len(out.plan_candidates) == 4
    assert out.plan_candidates[0].raw_text == today.plan.raw_text       # row 1: the greedy decode
    assert len({c.raw_text for c in out.plan_candidates}) > 1            # rows 2..N: sampled
    selection = out.selection
    assert selection.valid == out.valid_candidates == sum(c.valid for c in out.plan_candidates)
    assert out.plan is out.plan_candidates[selection.index]
    scores = scene.score_all([c.waypoints if c.valid else None for c in out.plan_candidates])
    assert [None if r is None else r.pdms for r in scores] == \
        [None if r is None else r.pdms for r in selection.results]
    best = max(r.pdms for r in scores if r is not None)
    assert selection.best.pdms == best
    assert selection.index == min(i for i, r in enumerate(scores) if r is not None and r.pdms == best)


def test_no_valid_candidate_is_todays_invalid_plan(tiny_checkpoint, rgb_frame):
    policy = DrivingPolicy(load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32",
                                           overrides={"max_new_tokens": 32}),
                           candidates=CandidateSettings(count=3))
    out = policy.step(rgb_frame, EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0)), "straight")
    assert out.candidates == 3 and out.selection is None and out.valid_candidates == 0
    assert not out.plan.valid and out.plan.waypoints is None
    assert out.plan.stats.retries == 1                               # decoded again, as one candidate is


def test_candidates_need_the_plan_task(tiny_checkpoint):
    with pytest.raises(ValueError, match="plan task"):
        DrivingPolicy(load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32"), tasks=("detect",),
                      candidates=CandidateSettings(count=2))
