"""eval-bag's PDM score (NAVSIM v1) on hand-built scene bags whose answers are known by construction.

The ego drives straight along its route at 8 m/s (rear axle at the odometry origin, front bumper 3.75 m
ahead of it); a car stands parked in the lane 55 m ahead of where the recording starts. Frames every
0.25 s for 0.5 s have 4 s of recorded future (32 m). Known answers, per plan:

- the recorded drive and the constant-velocity baseline (the same here) stop 7.25 m or more short of
  the car even with TTC's 0.9 s look-ahead: every sub-score 1, PDMS 1 (the recorded drive is the
  reference planner, so its EP is 1 by definition);
- a plan at 16 m/s runs into the parked car: at fault (the car stood), NC 0, PDMS 0;
- a plan braking at 2 m/s^2 to a stop 16 m ahead: NC, DAC, TTC, C 1 and EP = its progress over the
  recorded drive's (< 1), PDMS = (5 EP + 5 + 2) / 12;
- a plan swerving 4 m to the left leaves the 3.5 m corridor around the route: DAC 0, PDMS 0.

The live path (a policy run, ``evaluate_bags``) and the node's path (``--predictions``, through the CLI's
files and output) score the same plans alike.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from test.support.scripted_policy import ScriptedPolicy
from test.support.trajectory_messages import TOPIC, TYPE, trajectory
from wam_diff2_core.cli import main
from wam_diff2_core.evaluation.bag_pdm import AREA_RECORDED_DRIVE, AREA_ROUTE, DEFAULT_LANE_WIDTH_M
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.evaluation.bag_writer import write_bag
from wam_diff2_core.evaluation.bags import Bag
from wam_diff2_core.evaluation.metrics import PDM_SUBSCORES, summarize
from wam_diff2_core.evaluation.report import compare_runs, write_run_report
from wam_diff2_core.evaluation.bag_plan import EvalSettings, plan_bag
from wam_diff2_core.evaluation.predictions import evaluate_predictions
from wam_diff2_core.evaluation.runner import evaluate_bags
from test.support.scenes import circle_scene, straight_scene, write_scene_bag

SPEED, ORIGIN = 8.0, (10.0, -5.0)
T = np.arange(1, 9) * 0.5
PLANS = {"through": np.stack([16.0 * T, np.zeros(8)], 1),
         "short": np.stack([np.minimum(SPEED * T - T * T, 16.0), np.zeros(8)], 1),
         "off": np.stack([SPEED * T, 4.0 * np.minimum(T, 1.0)], 1)}
ORDER = ("through", "short", "off")          # the plan answered for frame 0, 1, 2


def parked(t: float) -> list[dict]:
    return [{"id": 3, "x": ORIGIN[0] + 55.0, "y": ORIGIN[1], "yaw": 0.0, "length_m": 4.5, "width_m": 1.85}]


def by_frame(i, ego, command):
    return PLANS[ORDER[i]]


@pytest.fixture(scope="module")
def scene_bag(tmp_path_factory):
    scene = straight_scene(SPEED, origin=ORIGIN, duration_s=4.5, camera_hz=4.0, objects=parked)
    return write_scene_bag(tmp_path_factory.mktemp("pdm") / "bag", scene)


def check_known_answers(frames):
    """The module docstring's answers, frame by frame (frame i answered ORDER[i]; None: not answered)."""
    for f in frames:
        assert f.pdm_area == AREA_ROUTE
        assert f.recorded_pdm["pdms"] == pytest.approx(1.0)
        assert all(f.recorded_pdm[k] == pytest.approx(1.0) for k in PDM_SUBSCORES)
        assert f.baseline_pdm["pdms"] == pytest.approx(1.0)
    through, short, off = frames
    assert (through.pdm["nc"], through.pdm["pdms"]) == (0.0, 0.0) and through.pdm["collision_time_s"] is not None
    s = short.pdm
    assert (s["nc"], s["dac"], s["ttc"], s["c"]) == (1.0, 1.0, 1.0, 1.0)
    assert s["reference_progress_m"] == pytest.approx(32.0, abs=0.05)       # the recorded drive's 4 s
    assert 0.4 < s["ep"] < 0.7 and s["ep"] == pytest.approx(s["progress_m"] / s["reference_progress_m"])
    assert s["pdms"] == pytest.approx((5 * s["ep"] + 5 + 2) / 12)
    assert (off.pdm["dac"], off.pdm["nc"], off.pdm["pdms"]) == (0.0, 1.0, 0.0)


def test_a_policy_run_scores_the_known_answers(scene_bag, tmp_path):
    run = evaluate_bags([scene_bag], ScriptedPolicy(by_frame), EvalSettings(), progress=False)
    assert len(run.frames) == 3
    check_known_answers(run.frames)
    pdm = summarize(run.frames)["overall"]["pdm"]
    short = run.frames[1].pdm
    assert pdm["frames"] == 3 and pdm["areas"] == {AREA_ROUTE: 3}
    assert pdm["model"]["pdms"] == pytest.approx(short["pdms"] / 3)
    assert pdm["model"]["nc"] == pytest.approx(2 / 3) and pdm["model"]["dac"] == pytest.approx(2 / 3)
    assert pdm["recorded"]["pdms"] == pytest.approx(1.0) and pdm["constant_velocity"]["pdms"] == pytest.approx(1.0)

    metrics = write_run_report(tmp_path / "out", run, model={"path": "scripted"})
    assert metrics["settings"]["lane_width_m"] == DEFAULT_LANE_WIDTH_M
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## PDM score (NAVSIM v1)" in report
    assert f"a {DEFAULT_LANE_WIDTH_M:g} m corridor (--lane-width-m) around the route on 3 frames, not a map" in report
    assert "EP's reference planner is the recorded drive" in report
    assert "| recorded drive | 3 | 3 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 |" in report
    record = json.loads((tmp_path / "out" / "frames.jsonl").read_text().splitlines()[2])
    assert record["pdm"]["dac"] == 0.0 and record["pdm_area"] == AREA_ROUTE

    # --compare against a run that answers the recorded drive (constant velocity here): PDMS side by side
    write_run_report(tmp_path / "cv", evaluate_bags([scene_bag], ScriptedPolicy(), progress=False), model={"path": "cv"})
    compared = compare_runs(tmp_path / "out", tmp_path / "cv", tmp_path / "both")["pdm"]
    name_a, name_b = list(compared["runs"])
    assert compared["runs"][name_a]["pdms"] == pytest.approx(short["pdms"] / 3)
    common = compared["common_valid_frames"]
    assert common[name_b]["pdms"] == pytest.approx(1.0) and common[name_a]["pdm_samples"] == 3
    assert "## PDM score (NAVSIM v1)" in (tmp_path / "both" / "compare.md").read_text()


def test_an_unparsed_plan_scores_zero_and_counts_apart(scene_bag):
    policy = ScriptedPolicy(lambda i, ego, command: "not_a_number: garbage" if i == 0 else PLANS["short"])
    frames = evaluate_bags([scene_bag], policy, EvalSettings(), progress=False).frames
    assert frames[0].pdm == {"pdms": 0.0, "parsed": False} and frames[0].recorded_pdm["pdms"] == pytest.approx(1.0)
    pdm = summarize(frames)["overall"]["pdm"]["model"]
    assert (pdm["pdm_samples"], pdm["pdm_parsed"]) == (3, 2)
    assert pdm["pdms"] == pytest.approx(2 * frames[1].pdm["pdms"] / 3) and pdm["nc"] == 1.0


def test_without_a_route_the_corridor_follows_the_recorded_drive(tmp_path):
    """A left curve (30 m radius, 6 m/s) with no route in the bag: the recorded drive, tracked from the
    steering its yaw rate gives, stays in its own corridor (PDMS 1); constant velocity runs straight
    off it (DAC 0); a --lane-width-m narrower than the ego puts even the recorded drive off (DAC 0)."""
    far = lambda t: [{"id": 1, "x": -80.0, "y": -80.0, "yaw": 0.0, "length_m": 4.5, "width_m": 1.85}]  # noqa: E731
    bag = write_scene_bag(tmp_path / "bag", circle_scene(30.0, 6.0, duration_s=4.5, camera_hz=2.0, objects=far))
    frames = evaluate_bags([bag], ScriptedPolicy(), EvalSettings(), progress=False).frames
    assert len(frames) == 2
    for f in frames:
        assert f.pdm_area == AREA_RECORDED_DRIVE
        assert f.recorded_pdm["pdms"] == pytest.approx(1.0)
        assert (f.baseline_pdm["dac"], f.pdm["dac"]) == (0.0, 0.0)
    narrow = evaluate_bags([bag], ScriptedPolicy(), EvalSettings(lane_width_m=1.0), progress=False).frames
    assert narrow[0].recorded_pdm["dac"] == 0.0


@pytest.fixture(scope="module")
def node_bag(scene_bag, tmp_path_factory):
    """What a node published for the three frames: the same plans as the policy run."""
    with Bag(scene_bag) as b:
        stamps = [p.stamp_ns for p in plan_bag(b, EvalSettings()).planned]
    types = default_typestore().types
    msgs = [(TOPIC, s + 300_000_000, trajectory(types, s, PLANS[name])) for s, name in zip(stamps, ORDER)]
    return write_bag(tmp_path_factory.mktemp("node") / "node_out", {TOPIC: TYPE}, msgs, storage="mcap")


def test_the_nodes_predictions_score_the_same(scene_bag, node_bag):
    check_known_answers(evaluate_predictions([scene_bag], [node_bag]).frames)


def test_cli_prints_and_writes_the_pdm_score(scene_bag, node_bag, tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval-bag", str(scene_bag), "--predictions", str(node_bag), "--no-progress"]
    assert main([*args, "--out", str(out), "--lane-width-m", "4"]) == 0
    printed = capsys.readouterr().out
    assert "PDM score (NAVSIM v1) on 3 frames; drivable area: a 4 m corridor (--lane-width-m) around the route" \
           in printed and "EP reference: the recorded drive" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith(("  node ", "  recorded"))}
    assert rows["recorded"][2:] == ["1.000"] * 6 + ["3"]
    m = json.loads((out / "metrics.json").read_text())
    assert m["settings"]["lane_width_m"] == 4.0
    pdm = m["overall"]["pdm"]
    assert pdm["frames"] == 3 and pdm["model"]["dac"] == pytest.approx(2 / 3)
    assert pdm["model"]["pdms"] == pytest.approx(float(rows["node"][1]), abs=5e-4)
    frames = [json.loads(line) for line in (out / "frames.jsonl").read_text().splitlines()]
    assert [f["pdm"]["nc"] for f in frames] == [0.0, 1.0, 1.0]
    report = (out / "report.md").read_text()
    assert "| node | 3 | 3 |" in report and "a 4 m corridor (--lane-width-m) around the route on 3 frames" in report

    for bad in ("0", "-1", "nan"):
        assert main([*args, "--out", str(tmp_path / "bad"), "--lane-width-m", bad]) == 2
        assert "lane_width_m (--lane-width-m): must be a finite width > 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_agents_are_the_recorded_boxes_and_move_on_at_their_last_speed_where_the_recording_stops():
    """A car 20 m ahead driving away at 5 m/s is recorded for 1 s only: its boxes follow the recording,
    then go on at 5 m/s (the speed of its last two boxes) to 4.9 s; a car that appears after the frame
    is not an agent of it."""
    from wam_diff2_core.evaluation.bag_pdm import bag_pdm_inputs
    from wam_diff2_core.evaluation.collision import EgoFootprint
    from wam_diff2_core.evaluation.derived_objects import ObjectSnapshot, ObjectTrack
    from wam_diff2_core.evaluation.ground_truth import EgoTrajectory
    from wam_diff2_core.pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S

    t0 = 10**12
    snapshots = []
    for k in range(11):                                               # 0 ... 1 s every 0.1 s
        ids, boxes = [7], [[120.0 + 5.0 * 0.1 * k, 50.0, 0.0, 4.5, 1.85]]
        if k >= 5:                                                    # appears at 0.5 s
            ids, boxes = ids + [8], boxes + [[110.0, 55.0, 0.0, 4.5, 1.85]]
        snapshots.append(ObjectSnapshot(t0 + k * 10**8, "map", np.array(ids), np.array(boxes)))
    stamps = [t0 + k * 10**8 for k in range(60)]                     # the ego: 6 s at 8 m/s along x from (100, 50)
    trajectory = EgoTrajectory(stamps, np.array([[100.0 + 0.8 * k, 50.0] for k in range(60)]), [0.0] * 60)
    gt = np.stack([SPEED * T, np.zeros(8)], 1)
    inputs = bag_pdm_inputs(ObjectTrack(snapshots), trajectory, None, t0, (SPEED, 0.0), (0.0, 0.0), gt, EgoFootprint())
    (agent,) = inputs.scene.agents
    expected_x = 20.0 + 5.0 * np.arange(OBSERVATION_SAMPLES) * SIM_DT_S
    np.testing.assert_allclose(agent.xy, np.stack([expected_x, np.zeros(OBSERVATION_SAMPLES)], 1), atol=1e-9)
    assert inputs.area == AREA_RECORDED_DRIVE and inputs.reference_progress_m == pytest.approx(32.0, abs=0.05)
    assert bag_pdm_inputs(ObjectTrack(snapshots), trajectory, None, t0 + 2 * 10**9, (SPEED, 0.0), (0.0, 0.0), gt,
                          EgoFootprint()) is None                      # no objects message near the frame
