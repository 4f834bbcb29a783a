"""Collision rate of eval-bag on a hand-built scene whose answer is known.

The ego drives straight at 8 m/s; a car keeps pace 3.5 m to its left (centres side by side). A
scripted plan drifts left by 0, 0.25 and 0.5 m at 0.5, 1 and 1.5 s, then 2 m from 2 s on: its ego
box (4.7 x 1.9 m, centred 1.4 m ahead of the rear axle, heading along the path) clears the car up
to 1.5 s (centres 2.9 m apart sideways against 2.0 m of half extents) and overlaps it from 2 s on
(1.5 m or less apart sideways against at least 1.875 m). The constant-velocity baseline and
the recorded drive stay 3.5 m away: no collision.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from test.support.scripted_policy import ScriptedPolicy
from wam_diff2_core.evaluation.collision import EgoFootprint, collision_flags
from wam_diff2_core.evaluation.ground_truth import WAYPOINT_OFFSETS_NS, constant_velocity_waypoints
from wam_diff2_core.evaluation.metrics import collision_metrics, summarize
from wam_diff2_core.evaluation.report import compare_runs, write_run_report
from wam_diff2_core.evaluation.bag_plan import EvalSettings
from wam_diff2_core.evaluation.runner import evaluate_bags
from test.support.scenes import straight_scene, write_scene_bag

SPEED = 8.0
ORIGIN = (10.0, -5.0)
CENTRE = EgoFootprint().centre_ahead_m
T = np.asarray(WAYPOINT_OFFSETS_NS) / 1e9
DRIFT = np.array([0.0, 0.25, 0.5, 2.0, 2.0, 2.0, 2.0, 2.0])     # [8] metres to the left at 0.5 ... 4 s


def companion(t: float) -> list[dict]:
    return [{"id": 7, "x": ORIGIN[0] + SPEED * t + CENTRE, "y": ORIGIN[1] + 3.5, "yaw": 0.0,
             "length_m": 4.5, "width_m": 1.85}]


def drifting(i, ego, command):
    return constant_velocity_waypoints(ego.velocity) + np.stack([np.zeros(8), DRIFT], 1)


@pytest.fixture(scope="module")
def scene_bag(tmp_path_factory):
    scene = straight_scene(SPEED, origin=ORIGIN, duration_s=5.0, camera_hz=4.0, objects=companion)
    return write_scene_bag(tmp_path_factory.mktemp("collision") / "bag", scene)


def test_flags_by_hand():
    """The ego box against one box: clear at 1 s, hit at 2 s."""
    plan = np.stack([SPEED * T, DRIFT], 1)
    obstacles = [np.asarray([[[x + CENTRE + 2.25, 4.425], [x + CENTRE - 2.25, 4.425], [x + CENTRE - 2.25, 2.575],
                              [x + CENTRE + 2.25, 2.575]]]) for x in SPEED * T]
    flags = collision_flags(plan, obstacles, EgoFootprint())
    assert flags == [False, False, False, True, True, True, True, True]
    assert collision_flags(np.stack([SPEED * T, np.zeros(8)], 1), obstacles, EgoFootprint()) == [False] * 8
    assert collision_flags(plan, [None] * 8, EgoFootprint()) == [None] * 8


def test_rates_in_both_conventions_by_hand():
    m = collision_metrics([[False, False, False, True, True, True, True, True], [False] * 8])
    assert m["at_t"] == {"1s": 0.0, "2s": 0.5, "3s": 0.5, "4s": 0.5}
    # VAD: per frame the share of colliding waypoints up to t: 0, 1/4, 3/6, 5/8 and 0; then the mean
    assert m["avg_to_t"] == pytest.approx({"1s": 0.0, "2s": 0.125, "3s": 0.25, "4s": 0.3125})
    assert m["frames_colliding"] == 1
    unknown = collision_metrics([[None] * 8])
    assert unknown["at_t"]["1s"] is None and unknown["frames_known_at_t"]["1s"] == 0


def test_eval_bag_reports_the_known_collision_times(scene_bag, tmp_path):
    run = evaluate_bags([scene_bag], ScriptedPolicy(drifting), EvalSettings(), progress=False)
    frames = run.frames
    assert len(frames) == 5                                       # 0 ... 1 s at 4 Hz: 4 s of future each
    for f in frames:
        assert f.collisions == [False, False, False, True, True, True, True, True]
        assert f.baseline_collisions == [False] * 8 and f.recorded_collisions == [False] * 8
    c = summarize(frames)["overall"]["collision"]
    assert c["model"]["at_t"] == {"1s": 0.0, "2s": 1.0, "3s": 1.0, "4s": 1.0}
    assert c["model"]["avg_to_t"] == pytest.approx({"1s": 0.0, "2s": 0.25, "3s": 0.5, "4s": 0.625})
    assert c["constant_velocity"]["at_t"] == {"1s": 0.0, "2s": 0.0, "3s": 0.0, "4s": 0.0}
    assert c["recorded"]["frames_colliding"] == 0

    a = write_run_report(tmp_path / "a", run, model={"path": "scripted"})
    assert a["overall"]["collision"]["model"]["at_t"]["2s"] == 1.0
    report = (tmp_path / "a" / "report.md").read_text()
    assert "Collision rate" in report and "UniAD" in report and "VAD" in report
    assert (tmp_path / "a" / "collision_rate.png").stat().st_size > 0
    record = json.loads((tmp_path / "a" / "frames.jsonl").read_text().splitlines()[0])
    assert record["collisions"][3] is True and record["collisions"][1] is False

    # a second run that keeps straight: --compare puts both rates side by side
    b = evaluate_bags([scene_bag], ScriptedPolicy(), EvalSettings(), progress=False)
    write_run_report(tmp_path / "b", b, model={"path": "cv"})
    compare_runs(tmp_path / "a", tmp_path / "b", tmp_path / "ab")
    compared = json.loads((tmp_path / "ab" / "compare.json").read_text())
    name_a, name_b = list(compared["runs"])
    both = compared["collision"]["common_valid_frames"]
    assert both[name_a]["at_t"]["2s"] == 1.0 and both[name_b]["at_t"]["2s"] == 0.0
    assert (tmp_path / "ab" / "collision_compare.png").stat().st_size > 0
    assert "Collision rate" in (tmp_path / "ab" / "compare.md").read_text()


def test_a_step_the_recorded_ego_collides_at_does_not_count(tmp_path):
    """The car drives right where the ego is (ST-P3 / UniAD / VAD ignore such steps)."""
    scene = straight_scene(SPEED, origin=ORIGIN, duration_s=4.5, camera_hz=2.0,
                           objects=lambda t: [{"id": 1, "x": ORIGIN[0] + SPEED * t + CENTRE, "y": ORIGIN[1],
                                               "yaw": 0.0, "length_m": 4.5, "width_m": 1.85}])
    bag = write_scene_bag(tmp_path / "bag", scene)
    run = evaluate_bags([bag], ScriptedPolicy(), EvalSettings(), progress=False)
    f = run.frames[0]
    assert f.recorded_collisions == [True] * 8 and f.baseline_collisions == [False] * 8


def test_a_bag_without_objects_reports_no_collision_rate_nor_pdm_score(tmp_path):
    bag = write_scene_bag(tmp_path / "bag", straight_scene(SPEED, duration_s=4.5, camera_hz=2.0))
    run = evaluate_bags([bag], ScriptedPolicy(), EvalSettings(), progress=False)
    assert run.frames[0].collisions is None and summarize(run.frames)["overall"]["collision"] is None
    assert run.frames[0].pdm is None and summarize(run.frames)["overall"]["pdm"] is None    # no agents known
    write_run_report(tmp_path / "out", run, model={"path": "cv"})
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Collision rate" not in report and "PDM score" not in report
