"""The bag evaluator on bags written here (sqlite3 and mcap) from scenes with known ground truth.

A policy with scripted answers (same ``step`` signature as DrivingPolicy) makes every metric
exactly predictable; the end-to-end runs with the real tiny checkpoint are in
test_eval_cli.py.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from test.support.scripted_policy import ScriptedPolicy
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.evaluation.bag_writer import write_bag
from wam_diff2_core.evaluation.bags import Bag, BagTopics
from wam_diff2_core.evaluation.ground_truth import constant_velocity_waypoints
from wam_diff2_core.evaluation.record import record_predictions
from wam_diff2_core.evaluation.report import compare_runs, load_run, write_run_report
from wam_diff2_core.evaluation.bag_plan import EvalSettings
from wam_diff2_core.evaluation.runner import evaluate_bags
from test.support.scenes import (START_NS, accelerating_scene, circle_scene, frame_image, scene_messages,
                                              scene_topic_types, straight_scene, write_scene_bag)
from wam_diff2_core.geometry import ego_to_world

STORAGES = ("sqlite3", "mcap")
K = np.arange(1, 9)                       # waypoint index; t = 0.5 k
SPEED, YAW, ORIGIN = 8.0, 0.3, (10.0, -5.0)


def lateral(values):
    """[8, 2] offsets to the left of the ego by ``values`` metres."""
    return np.stack([np.zeros(8), np.asarray(values, float) * np.ones(8)], axis=1)


def offset_policy(offsets: dict[str, np.ndarray], invalid_every: int | None = None):
    def answer(i, ego, command):
        if invalid_every and i % invalid_every == 0:
            return "not_a_number: scripted failure"
        return constant_velocity_waypoints(ego.velocity) + offsets[command]
    return ScriptedPolicy(answer, forwards=lambda i: i % 3 + 1, tokens=lambda i: 4 * (i % 3 + 1),
                          latency_ms=lambda i: 10.0 * (i + 1))


def write_straight(path, storage):
    """6 s straight at 8 m/s, heading 0.3 rad; camera 20 Hz, odometry 50 Hz; commands left -> straight
    -> RoadOption 2 (right) at 0.0 / 0.6 / 1.2 s."""
    scene = straight_scene(SPEED, yaw=YAW, origin=ORIGIN, duration_s=6.0,
                           commands=[(0.0, "left"), (0.6, "straight"), (1.2, "2")])
    return write_scene_bag(path, scene, storage=storage)


@pytest.fixture(scope="module", params=STORAGES)
def straight_both(request, tmp_path_factory):
    """The straight scene in each storage format."""
    return write_straight(tmp_path_factory.mktemp(request.param) / "straight", request.param)


@pytest.fixture(scope="module")
def straight_bag(tmp_path_factory):
    """The straight scene as mcap (for what does not depend on the format)."""
    return write_straight(tmp_path_factory.mktemp("mcap") / "straight", "mcap")


def test_constant_velocity_scores_zero_and_frames_without_4s_are_excluded(straight_both):
    run = evaluate_bags([straight_both], ScriptedPolicy(), progress=False)
    counts = run.counts()
    # 121 frames at 0.00 .. 6.00 s; those at <= 2.00 s have 4 s of recorded future
    assert counts["images"] == 121 and counts["evaluated"] == 41 and counts["valid"] == 41
    assert counts["excluded_no_future"] == {"insufficient_future": 80} and counts["skipped"] == {}
    errors = np.array([f.errors for f in run.frames] + [f.baseline_errors for f in run.frames])
    assert errors.max() < 1e-9
    for f in run.frames:   # the recorded future in the ego frame: straight ahead at 8 m/s
        assert f.ground_truth == pytest.approx(np.stack([SPEED * 0.5 * K, np.zeros(8)], 1), abs=1e-9)
        assert f.velocity == (SPEED, 0.0) and f.acceleration == pytest.approx((0.0, 0.0))


def test_every_metric_pinned_per_command_with_parse_failures(straight_both, tmp_path):
    offsets = {"left": lateral(0.1 * K), "straight": lateral(np.zeros(8)), "right": lateral(-0.3)}
    run = evaluate_bags([straight_both], offset_policy(offsets, invalid_every=5), progress=False)
    frames = run.frames
    assert [f.command for f in frames] == ["left"] * 12 + ["straight"] * 12 + ["right"] * 17
    assert {f.command_source for f in frames} == {"command"}
    # calls 0, 5, ..., 40 fail to parse: 9 of 41; by command: left 0,5,10 / straight 15,20 / right 25..40
    metrics = write_run_report(tmp_path / "run", run, model={"path": "scripted"})
    o, per = metrics["overall"], metrics["per_command"]
    assert (o["frames"], o["valid"], o["parse_failures"]) == (41, 32, 9)
    assert o["parse_failure_rate"] == pytest.approx(9 / 41)
    assert o["invalid_reasons"] == {"not_a_number": 9}
    assert [(per[c]["frames"], per[c]["valid"]) for c in ("left", "straight", "right")] == [(12, 9), (12, 10), (17, 13)]

    left, straight, right = per["left"]["model"], per["straight"]["model"], per["right"]["model"]
    assert left["l2_at_t"] == pytest.approx({"1s": 0.2, "2s": 0.4, "3s": 0.6, "4s": 0.8})      # e_k = 0.1 k
    assert left["l2_avg_to_t"] == pytest.approx({"1s": 0.15, "2s": 0.25, "3s": 0.35, "4s": 0.45})
    assert (left["ade"], left["fde"]) == pytest.approx((0.45, 0.8))
    assert straight["ade"] == pytest.approx(0.0, abs=1e-9) and straight["fde"] == pytest.approx(0.0, abs=1e-9)
    assert right["l2_at_t"] == pytest.approx({h: 0.3 for h in ("1s", "2s", "3s", "4s")})
    assert right["l2_avg_to_t"] == pytest.approx({h: 0.3 for h in ("1s", "2s", "3s", "4s")})
    # overall: 9 left, 10 straight, 13 right valid frames
    curve = (9 * 0.1 * K + 10 * 0 + 13 * 0.3) / 32
    assert o["model"]["per_waypoint"] == pytest.approx(curve.tolist())
    assert o["model"]["l2_at_t"] == pytest.approx({"1s": curve[1], "2s": curve[3], "3s": curve[5], "4s": curve[7]})
    assert o["model"]["l2_avg_to_t"]["2s"] == pytest.approx(curve[:4].mean())
    assert o["model"]["ade"] == pytest.approx(curve.mean()) and o["model"]["fde"] == pytest.approx(curve[7])
    # the baseline, on the same 32 frames and on all 41, is exact here
    assert o["constant_velocity"]["frames"] == 32 and o["constant_velocity_all_frames"]["frames"] == 41
    assert o["constant_velocity"]["ade"] == pytest.approx(0.0, abs=1e-9)
    # decode statistics and latency: forwards i%3+1 (sum 81), tokens 4x, latency 10 (i+1) ms
    d = o["decode"]
    assert d["forwards_per_frame"]["mean"] == pytest.approx(81 / 41) and d["forwards_per_frame"]["p50"] == 2.0
    assert d["tokens_per_frame"]["mean"] == pytest.approx(4 * 81 / 41) and d["tokens_per_forward"] == 4.0
    assert o["latency_ms"] == pytest.approx({"count": 41, "mean": 210.0, "p50": 210.0, "p90": 370.0, "p99": 406.0,
                                             "max": 410.0})
    assert metrics["conventions"]["l2_at_t"].startswith("UniAD convention") and "ST-P3" in metrics["conventions"]["l2_avg_to_t"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "L2 at t (UniAD convention)" in report and "(ST-P3 / VAD convention)" in report and "| left | 12 | 9 |" in report


HORIZONS = ("1s", "2s", "3s", "4s")


def test_speed_error_on_a_constant_speed_drive_zero_when_kept_known_when_staying_put(straight_bag, tmp_path):
    """8 m/s all along. Plans that keep the speed: the profile holds 8 m/s, no error. Plans that stay put:
    the profile brakes at the 6 m/s^2 limit from the measured 8 m/s (2 m/s at 1 s, 0 from 1.4 s)."""
    keeps = evaluate_bags([straight_bag], ScriptedPolicy(), progress=False)
    stays = evaluate_bags([straight_bag], ScriptedPolicy(lambda i, ego, cmd: np.zeros((8, 2))), progress=False)
    for f in keeps.frames + stays.frames:
        assert f.recorded_speeds.tolist() == [SPEED] * 8
        assert f.baseline_speed_errors.tolist() == [0.0] * 8
    assert np.abs([f.speed_errors for f in keeps.frames]).max() < 1e-9
    for f in stays.frames:
        assert f.speed_errors == pytest.approx([3.0, 6.0, 8, 8, 8, 8, 8, 8])
    metrics = write_run_report(tmp_path / "stays", stays, model={"path": "scripted"})
    speed = metrics["overall"]["speed_profile"]
    assert speed["frames"] == 41
    assert speed["model"]["mean_at_t"] == pytest.approx({"1s": 6.0, "2s": 8.0, "3s": 8.0, "4s": 8.0})
    assert speed["model"]["p50_at_t"] == pytest.approx({"1s": 6.0, "2s": 8.0, "3s": 8.0, "4s": 8.0})
    assert speed["constant_speed"]["mean_at_t"] == {h: 0.0 for h in HORIZONS}
    assert metrics["per_command"]["left"]["speed_profile"]["frames"] == 12
    report = (tmp_path / "stays" / "report.md").read_text()
    assert "## Speed error of the speed profile" in report
    assert "| model | 41 | 6.000 | 8.000 | 8.000 | 8.000 | 6.000 |" in report
    # what frames.jsonl holds comes back as it was
    _, loaded = load_run(tmp_path / "stays")
    assert loaded[5].speed_errors == pytest.approx(stays.frames[5].speed_errors)
    assert loaded[5].recorded_speeds.tolist() == [SPEED] * 8


def test_speed_error_on_an_accelerating_drive(tmp_path):
    """From 4 m/s at 1 m/s^2: the recorded speed at +t is the measured one + t. A plan at the measured
    speed is off by t, as the constant-speed baseline; a plan of the recorded future is close, up to the
    last half-second, whose speed the profile takes as that half-second's mean: 0.25 m/s short at 4 s."""
    scene = accelerating_scene(4.0, 1.0, yaw=YAW, duration_s=6.0)
    bag = write_scene_bag(tmp_path / "accelerating", scene, storage="mcap")
    t = 0.5 * K

    def recorded_future(i, ego, command):
        return np.stack([ego.velocity[0] * t + 0.5 * t * t, np.zeros(8)], axis=1)

    def measured_speed_kept(i, ego, command):
        return np.stack([ego.velocity[0] * t, np.zeros(8)], axis=1)

    follows = evaluate_bags([bag], ScriptedPolicy(recorded_future), progress=False)
    keeps = evaluate_bags([bag], ScriptedPolicy(measured_speed_kept), progress=False)
    assert len(follows.frames) == len(keeps.frames) == 41
    for f, g in zip(follows.frames, keeps.frames):
        v0 = 4.0 + (f.stamp_ns - START_NS) / 1e9
        assert f.velocity[0] == pytest.approx(v0, abs=1e-9)
        assert f.recorded_speeds == pytest.approx(v0 + t, abs=1e-9)
        assert f.baseline_speed_errors == pytest.approx(t, abs=1e-9)
        assert g.speed_errors == pytest.approx(t, abs=1e-9)
        assert f.speed_errors[:7].max() < 0.02 and f.speed_errors[7] == pytest.approx(0.25, abs=1e-6)
    speed = {name: write_run_report(tmp_path / name, run, model={"path": name})["overall"]["speed_profile"]
             for name, run in (("follows", follows), ("keeps", keeps))}
    assert speed["keeps"]["model"]["mean_at_t"] == pytest.approx({"1s": 1.0, "2s": 2.0, "3s": 3.0, "4s": 4.0})
    assert speed["keeps"]["constant_speed"]["mean_at_t"] == pytest.approx(speed["keeps"]["model"]["mean_at_t"])
    assert speed["follows"]["model"]["mean_at_t"]["4s"] == pytest.approx(0.25, abs=1e-6)
    assert max(speed["follows"]["model"]["mean_at_t"][h] for h in ("1s", "2s", "3s")) < 0.02


def test_a_run_written_before_the_recorded_speed_still_loads_summarizes_and_compares(straight_bag, tmp_path):
    run = evaluate_bags([straight_bag], ScriptedPolicy(), EvalSettings(every=4), progress=False)
    for name in ("old", "new"):
        write_run_report(tmp_path / name, run, model={"path": name})
    lines = (tmp_path / "old" / "frames.jsonl").read_text().splitlines()
    new_keys = ("recorded_speeds", "speed_errors", "baseline_speed_errors")
    old = [{k: v for k, v in json.loads(line).items() if k not in new_keys} for line in lines]
    (tmp_path / "old" / "frames.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    metrics = json.loads((tmp_path / "old" / "metrics.json").read_text())
    for group in (metrics["overall"], *metrics["per_command"].values()):
        del group["speed_profile"]
    (tmp_path / "old" / "metrics.json").write_text(json.dumps(metrics))
    _, frames = load_run(tmp_path / "old")
    assert len(frames) == 11 and all(f.recorded_speeds is None and f.speed_errors is None for f in frames)
    from wam_diff2_core.evaluation.metrics import summarize
    assert summarize(frames)["overall"]["speed_profile"] is None
    result = compare_runs(tmp_path / "old", tmp_path / "new", tmp_path / "cmp")
    assert result["speed_profile"] is None and result["common_valid_frames"]["frames"] == 11
    assert "Speed error" not in (tmp_path / "cmp" / "compare.md").read_text()


def test_every_nth_frame(straight_bag):
    run = evaluate_bags([straight_bag], ScriptedPolicy(), EvalSettings(every=4), progress=False)
    c = run.counts()
    # frames 0, 4, ..., 120 are selected (31); those at <= 2.0 s (0 .. 40) are evaluated
    assert (c["not_selected"], c["evaluated"], sum(c["excluded_no_future"].values())) == (90, 11, 20)
    assert [f.index for f in run.frames] == list(range(0, 41, 4))
    assert [f.stamp_ns - START_NS for f in run.frames] == [i * 50_000_000 for i in range(0, 41, 4)]


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_curved_ego_future_is_interpolated_and_rotated_into_the_ego_frame(tmp_path, left):
    radius, speed = 30.0, 6.0
    omega = (1 if left else -1) * speed / radius
    scene = circle_scene(radius, speed, left=left, duration_s=6.0, camera_hz=20.0, odometry_hz=50.0)
    bag = write_scene_bag(tmp_path / "circle", scene, storage="mcap")

    def arc(i, ego, command):   # the exact future on the circle, in the ego frame
        a = omega * 0.5 * K
        return np.stack([radius * np.sin(np.abs(a)), np.sign(omega) * radius * (1 - np.cos(a))], axis=1)

    run = evaluate_bags([bag], ScriptedPolicy(arc), progress=False)
    assert len(run.frames) == 41
    f10 = run.frames[10]                   # t = 0.5 s: +0.5 s is 0.1 rad further round the circle
    expected = [radius * math.sin(0.1), (1 if left else -1) * radius * (1 - math.cos(0.1))]
    assert f10.ground_truth[0] == pytest.approx(expected, abs=1e-9)
    assert f10.velocity == (6.0, 0.0) and f10.command == "straight"   # no route or command: the default
    for f in run.frames:
        on_grid = (f.stamp_ns - START_NS) % 100_000_000 == 0   # frame and future stamps are odometry stamps
        # off the 50 Hz grid the chord of 0.004 rad deviates from the arc by R (1 - cos 0.002) ~ 6e-5 m
        assert f.errors.max() < (1e-9 if on_grid else 2e-4)
    left_ay = np.array([f.acceleration[1] for f in run.frames])
    assert np.all(np.sign(left_ay[1:]) == np.sign(omega))              # centripetal, towards the turn


def test_record_writes_trajectories_with_the_frame_stamps(straight_bag, tmp_path):
    offsets = {"left": lateral(0.1 * K), "straight": lateral(np.zeros(8)), "right": lateral(-0.3)}
    run = evaluate_bags([straight_bag], offset_policy(offsets, invalid_every=5), progress=False)
    b = run.bags[0]
    out = record_predictions(tmp_path / "preds", b.frames, b.plan.trajectory, odometry_frame=b.plan.odometry_frame,
                             storage="sqlite3")
    assert not list(tmp_path.glob(".preds.partial-*"))
    with Bag(out) as bag:
        assert bag.topic_types == {"/wam_diff2/trajectory": "wam_diff2_ros/msg/Trajectory",
                                   "/wam_diff2/path": "nav_msgs/msg/Path", "/wam_diff2/path_odom": "nav_msgs/msg/Path",
                                   "/wam_diff2/ground_truth/path": "nav_msgs/msg/Path"}
        trajectories = list(bag.messages(["/wam_diff2/trajectory"]))
        paths_odom = [m for _, _, m in bag.messages(["/wam_diff2/path_odom"])]
    assert len(trajectories) == 41 and len(paths_odom) == 32
    for (_, log_ns, msg), frame in zip(trajectories, b.frames):
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        assert stamp == frame.stamp_ns and log_ns == frame.bag_time_ns and msg.header.frame_id == "base_link"
        assert msg.valid == frame.valid and msg.command == frame.command and msg.raw_text == frame.raw_text
        assert len(msg.points) == (8 if frame.valid else 0)
        assert (msg.candidates, msg.valid_candidates, msg.selected_candidate) == (1, int(frame.valid), 0)
        assert math.isnan(msg.pdms)                                  # one candidate: no selection
        assert msg.stats.forwards == frame.stats["forwards"] and msg.stats.latency_ms == pytest.approx(frame.latency_ms)
        if frame.valid:
            assert [p.x for p in msg.points] == pytest.approx(frame.predicted[:, 0].tolist())
            assert msg.points[-1].time_from_start.sec == 4
    # the odometry-frame path: the prediction placed with the recorded pose at the frame time
    valid = [f for f in b.frames if f.valid]
    f, p = valid[0], paths_odom[0]
    t = (f.stamp_ns - START_NS) / 1e9
    pose = (ORIGIN[0] + math.cos(YAW) * SPEED * t, ORIGIN[1] + math.sin(YAW) * SPEED * t)
    world = ego_to_world(f.predicted, pose, YAW)
    np.testing.assert_allclose([[q.pose.position.x, q.pose.position.y] for q in p.poses], world, atol=1e-9)
    assert p.header.frame_id == "map"


def test_interrupted_report_leaves_nothing_that_looks_complete(straight_bag, tmp_path, monkeypatch):
    import wam_diff2_core.evaluation.report as report

    run = evaluate_bags([straight_bag], ScriptedPolicy(), EvalSettings(max_frames=3), progress=False)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_error_histogram", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_run_report(tmp_path / "out", run, model={"path": "scripted"})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_run_report(tmp_path / "out", run, model={"path": "scripted"})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bev_samples.png", "error_histogram.png", "frames.jsonl", "metrics.json", "per_waypoint_error.png", "report.md"]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["complete"] is True


def test_compare_two_runs_side_by_side_and_on_common_frames(straight_bag, tmp_path):
    zero = {c: lateral(np.zeros(8)) for c in ("left", "straight", "right")}
    half = {c: lateral(0.5) for c in ("left", "straight", "right")}
    run_a = evaluate_bags([straight_bag], offset_policy(zero, invalid_every=5), EvalSettings(every=2), progress=False)
    run_b = evaluate_bags([straight_bag], offset_policy(half, invalid_every=3), EvalSettings(every=2), progress=False)
    write_run_report(tmp_path / "a", run_a, model={"path": "A", "decoding": {"block_size": 1}}, label="AR")
    write_run_report(tmp_path / "b", run_b, model={"path": "B", "decoding": {"block_size": 32}}, label="Block-32")
    result = compare_runs(tmp_path / "a", tmp_path / "b", tmp_path / "cmp")
    # 21 frames each; A fails on calls 0,5,10,15,20; B on 0,3,...,18: both valid on 1,2,4,7,8,11,13,14,16,17,19
    common = result["common_valid_frames"]
    assert common["frames"] == 11
    assert common["AR"]["ade"] == pytest.approx(0.0, abs=1e-9) and common["Block-32"]["ade"] == pytest.approx(0.5)
    assert common["Block-32"]["l2_at_t"]["4s"] == pytest.approx(0.5)
    assert result["overall"]["AR"]["valid"] == 16 and result["overall"]["Block-32"]["valid"] == 14
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| valid plans | 16 | 14 |" in md and "On the 11 frames where both have a valid plan" in md
    # speed errors on all frames and on the common ones; at 4 s the profile has the plan's last half-second speed,
    # 8 m/s with or without the lateral offset
    speed = result["speed_profile"]
    assert speed["runs"]["AR"]["frames"] == 16 and speed["common_valid_frames"]["Block-32"]["frames"] == 11
    assert speed["common_valid_frames"]["Block-32"]["mean_at_t"]["4s"] == pytest.approx(0.0, abs=1e-9)
    assert result["overall"]["AR"]["speed_profile"]["constant_speed"]["frames"] == 16
    assert "## Speed error of the speed profile" in md and "| constant speed | 11 |" in md
    assert (tmp_path / "cmp" / "per_waypoint_compare.png").stat().st_size > 1000


def test_policy_sees_rgb_from_bgra8_and_from_compressed_png(tmp_path):
    import cv2

    scene = straight_scene(8.0, duration_s=4.4, camera_hz=5.0, odometry_hz=20.0)
    raw = write_scene_bag(tmp_path / "raw", scene, storage="mcap")
    store = default_typestore()
    compressed_topic = scene.topics.image + "/compressed"

    def compressed():
        for topic, t_ns, msg in scene_messages(scene, store.types):
            if topic == scene.topics.image:
                bgr = frame_image(scene, round((t_ns - START_NS) / 2e8))[..., :3]
                ok, png = cv2.imencode(".png", bgr)
                yield compressed_topic, t_ns, store.types["sensor_msgs/msg/CompressedImage"](
                    header=msg.header, format="png", data=png.reshape(-1))
            else:
                yield topic, t_ns, msg

    types = dict(scene_topic_types(scene))
    del types[scene.topics.image]
    types[compressed_topic] = "sensor_msgs/msg/CompressedImage"
    png_bag = write_bag(tmp_path / "png", types, compressed(), storage="sqlite3", typestore=store)
    seen = {}
    for name, bag, topic in (("raw", raw, scene.topics.image), ("png", png_bag, compressed_topic)):
        policy = ScriptedPolicy(keep_frames=True)
        settings = EvalSettings(topics=BagTopics.carla(image=topic))
        run = evaluate_bags([bag], policy, settings, progress=False)
        assert len(run.frames) == 3          # 0.0 / 0.2 / 0.4 s have 4 s of future
        seen[name] = policy.frames
    for i, (a, b) in enumerate(zip(seen["raw"], seen["png"])):
        expected = frame_image(scene, i)[..., [2, 1, 0]]          # bgra8 -> RGB
        assert a.dtype == np.uint8 and a.shape == (32, 48, 3)
        assert np.array_equal(a, expected) and np.array_equal(b, expected)
