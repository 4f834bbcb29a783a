"""Demo-world exports: the JSON set loads in the sample reader, the bags look like carla-ros-bridge's."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test.support import REPO_ROOT as ROOT, default_sigint
from wam_diff2_core.data.samples import SampleError, iter_samples, load_images
from wam_diff2_core.outputs.parsing import parse_boxes, parse_waypoints
from wam_diff2_core.outputs.prompts import format_detection_prompt, format_planning_prompt
from wam_diff2_core.sim import CameraSettings, EpisodeSettings, simulate_episode
from wam_diff2_core.sim import dataset_export as export_module
from wam_diff2_core.sim.episode_bags import TOPIC_TYPES, topic_names
from wam_diff2_core.sim.dataset_export import ExportSettings, export

CAMERA = CameraSettings(width=160, height=90)
EPISODE = EpisodeSettings(frames=8, frame_stride=5, camera=CAMERA)
SETTINGS = ExportSettings(episodes=3, seed=7, episode=EPISODE, val_fraction=0.34, role="hero", vqa_per_frame=2)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "set"
    manifest = export(out, SETTINGS, progress=False)
    return out, manifest


def _frames(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "frames.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- JSON set
def test_json_export_loads_in_the_sample_reader_and_answers_parse(exported):
    out, manifest = exported
    assert manifest["complete"] and manifest["splits"] == {"train": [0, 1], "val": [2]}
    truth = {(f["episode"], f["frame"]): f for f in _frames(out)}
    assert len(truth) == 3 * EPISODE.frames
    seen_tasks, episodes_by_split = {}, {"train": set(), "val": set()}
    for split in ("train", "val"):
        for sample in iter_samples(out / f"{split}.json", out):
            assert not isinstance(sample, SampleError), sample
            (image,) = load_images(sample)
            assert image.size == (CAMERA.width, CAMERA.height)
            task = sample.raw["task"]
            seen_tasks[task] = seen_tasks.get(task, 0) + 1
            episode, frame = (int(part[1:]) for part in sample.id.split("-")[1:3])
            episodes_by_split[split].add(episode)
            gt = truth[(episode, frame)]
            assert gt["split"] == split and sample.raw["image"] == [gt["image"]]
            prompt = sample.prompt_messages[0]["content"]
            text = "".join(c.get("text", "<image>") if c["type"] == "text" else "<image>" for c in prompt)
            if task == "plan":
                assert text == format_planning_prompt(gt["command"], gt["velocity"], gt["acceleration_estimated"])
                plan = parse_waypoints(sample.answer)
                assert plan.ok, plan.error
                np.testing.assert_allclose(plan.waypoints, gt["waypoints"], atol=0.0051)
            elif task == "detect":
                assert text == format_detection_prompt()
                found = parse_boxes(sample.answer, image.size)
                assert found.ok and len(found.boxes) == len(gt["boxes"])
                for box, expected in zip(found.boxes, gt["boxes"]):
                    assert box.label == expected["label"]
                    np.testing.assert_allclose([box.x_min, box.y_min, box.x_max, box.y_max], expected["box"],
                                               atol=CAMERA.width / 1000 + 1e-6)
            else:
                key = task.removeprefix("vqa-")
                assert sample.answer == gt["qa"][key]
    assert episodes_by_split == {"train": {0, 1}, "val": {2}}        # split by episode, never by frame
    n = 3 * EPISODE.frames
    assert seen_tasks.pop("plan") == n and seen_tasks.pop("detect") == n
    assert sum(seen_tasks.values()) == 2 * n and set(seen_tasks) <= {"vqa-lead", "vqa-road", "vqa-count", "vqa-action"}
    counts = manifest["counts"]
    assert counts["train_samples"] + counts["val_samples"] == 4 * n


def test_frames_jsonl_agrees_with_a_fresh_simulation(exported):
    out, _ = exported
    records = [r for r in _frames(out) if r["episode"] == 1]
    episode = simulate_episode(SETTINGS.seed, 1, EPISODE)
    for record, frame in zip(records, episode.frames()):
        assert record["waypoints"] == frame.truth.waypoints.tolist()
        assert record["command"] == frame.truth.command
        assert [b["box"] for b in record["boxes"]] == [list(b.box) for b in frame.truth.boxes]
        assert record["stamp_ns"] == round((EPISODE.start_time_s + frame.truth.tick * 0.05) * 1e9)


def test_export_is_deterministic_and_seed_dependent(exported, tmp_path):
    out, _ = exported
    small = ExportSettings(episodes=1, seed=7, episode=EPISODE, formats=("json",), val_fraction=0.0)
    again = tmp_path / "again"
    export(again, small, progress=False)
    first = [r for r in _frames(out) if r["episode"] == 0]
    second = [{k: v for k, v in r.items()} for r in _frames(again)]
    for a, b in zip(first, second):
        a.pop("split"), b.pop("split")
        assert a == b
    assert (again / "images/e0000/00003.jpg").read_bytes() == (out / "images/e0000/00003.jpg").read_bytes()
    other = tmp_path / "other"
    export(other, ExportSettings(episodes=1, seed=8, episode=EPISODE, formats=("json",), val_fraction=0.0),
           progress=False)
    assert _frames(other)[3]["waypoints"] != second[3]["waypoints"]
    assert (other / "images/e0000/00003.jpg").read_bytes() != (again / "images/e0000/00003.jpg").read_bytes()


def test_parallel_workers_write_the_same_set(exported, tmp_path):
    out, _ = exported
    parallel = tmp_path / "parallel"
    export(parallel, ExportSettings(**{**SETTINGS.__dict__, "workers": 2, "formats": ("json",)}), progress=False)
    assert (parallel / "train.json").read_text() == (out / "train.json").read_text()
    assert (parallel / "frames.jsonl").read_text() == (out / "frames.jsonl").read_text()


# ----------------------------------------------------------------------------- bags
@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bags_open_with_rosbags_and_look_like_carla_ros_bridge(exported, storage):
    from rosbags.highlevel import AnyReader
    from rosbags.interfaces import QosDurability

    out, manifest = exported
    bag = out / "bags" / storage / "e0001"
    topics = topic_names("hero")
    expected_types = {topics[k]: t for k, t in TOPIC_TYPES.items()}
    ticks = EPISODE.total_ticks
    expected_counts = {topics["clock"]: ticks, topics["tf"]: ticks, topics["odometry"]: ticks,
                       topics["objects"]: ticks, topics["route"]: 1,
                       topics["command"]: EPISODE.frames, topics["camera_info"]: EPISODE.frames,
                       topics["image"]: EPISODE.frames}
    records = [r for r in _frames(out) if r["episode"] == 1]
    episode = simulate_episode(SETTINGS.seed, 1, EPISODE)
    with AnyReader([bag]) as reader:
        assert {c.topic: c.msgtype for c in reader.connections} == expected_types
        assert {c.topic: c.msgcount for c in reader.connections} == expected_counts
        route_conn = next(c for c in reader.connections if c.topic == topics["route"])
        assert [q.durability for q in route_conn.ext.offered_qos_profiles] == [QosDurability.TRANSIENT_LOCAL]
        last_stamp: dict[str, int] = {}
        objects_conn = next(c for c in reader.connections if c.topic == topics["objects"])
        # stored as a bridge recording stores it: the real type name and both definitions
        assert objects_conn.msgtype == "derived_object_msgs/msg/ObjectArray"
        assert "MSG: derived_object_msgs/Object" in objects_conn.msgdef.data
        assert "shape_msgs/SolidPrimitive shape" in objects_conn.msgdef.data
        images = infos = ticks_seen = 0
        odometry = []
        for index, (conn, bag_ns, raw) in enumerate(reader.messages()):
            msg = reader.deserialize(raw, conn.msgtype)
            if index == 0:
                assert conn.topic == topics["route"]        # the latched route comes first
            assert bag_ns >= last_stamp.get(conn.topic, -1)
            if conn.topic in last_stamp and conn.topic not in (topics["route"],):
                assert bag_ns > last_stamp[conn.topic]         # strictly increasing per topic
            last_stamp[conn.topic] = bag_ns
            header = getattr(msg, "header", None)
            if header is not None:
                assert header.stamp.sec * 10**9 + header.stamp.nanosec == bag_ns
            if conn.topic == topics["image"]:
                assert (msg.encoding, msg.step, msg.width, msg.height) == ("bgra8", 4 * CAMERA.width, CAMERA.width,
                                                                          CAMERA.height)
                assert len(msg.data) == msg.step * msg.height and msg.header.frame_id == "hero/rgb_front"
                record = records[images]
                assert bag_ns == record["stamp_ns"]
                bgra = np.asarray(msg.data).reshape(msg.height, msg.width, 4)
                rendered = episode.render(images).rgb
                assert np.array_equal(bgra[..., 2::-1], rendered) and (bgra[..., 3] == 255).all()
                images += 1
            elif conn.topic == topics["camera_info"]:
                cam = manifest["camera"]
                assert list(msg.k) == [cam["fx"], 0, cam["cx"], 0, cam["fy"], cam["cy"], 0, 0, 1]
                assert msg.p[0] == cam["fx"] and msg.header.frame_id == "hero/rgb_front"
                infos += 1
            elif conn.topic == topics["odometry"]:
                assert (msg.header.frame_id, msg.child_frame_id) == ("map", "hero")
                odometry.append((bag_ns, msg.pose.pose.position.x, msg.pose.pose.position.y,
                                 msg.twist.twist.linear.x, msg.twist.twist.linear.y))
            elif conn.topic == topics["command"]:
                assert msg.data in ("left", "straight", "right")
            elif conn.topic == topics["objects"]:
                # every other vehicle of the tick, as the world holds it (box centre, yaw, size, velocity)
                truth = episode.traffic[ticks_seen]
                assert msg.header.frame_id == "map" and [o.id for o in msg.objects] == [v.id for v in truth]
                for o, v in zip(msg.objects, truth):
                    assert o.shape.type == 1 and list(o.shape.dimensions) == [v.length_m, v.width_m, v.height_m]
                    assert (o.pose.position.x, o.pose.position.y) == (v.x, v.y)
                    assert np.isclose(2 * np.arctan2(o.pose.orientation.z, o.pose.orientation.w) - v.yaw, 0)
                    assert np.isclose(np.hypot(o.twist.linear.x, o.twist.linear.y), v.speed)
                    assert o.classification == {"car": 6, "truck": 7, "bus": 9}[v.label]
                ticks_seen += 1
        assert images == infos == EPISODE.frames and ticks_seen == ticks
        assert any(len(t) for t in episode.traffic)
    # odometry holds the track the ground truth comes from: the recorded future gives the waypoints
    odometry = np.array(odometry)
    np.testing.assert_allclose(odometry[:, 1], episode.track.x)
    np.testing.assert_allclose(odometry[:, 3], episode.track.speed)
    assert (odometry[:, 4] == 0).all()
    assert np.all(np.diff(odometry[:, 0]) == 50_000_000)                  # 20 Hz


def test_the_bag_evaluators_inputs_reproduce_the_prompts_of_the_json_set(exported):
    """What the planner node / eval-bag derive from a bag is what the JSON set was built from."""
    from wam_diff2_core.evaluation.bags import Bag
    from wam_diff2_core.frame_inputs import FrameInputTracker

    out, _ = exported
    topics = topic_names("hero")
    records = {r["stamp_ns"]: r for r in _frames(out) if r["episode"] == 2}
    tracker = FrameInputTracker()
    matched = 0
    with Bag(out / "bags" / "sqlite3" / "e0002") as bag:
        for topic, _, msg in bag.messages([topics["odometry"], topics["route"], topics["command"], topics["image"]]):
            if topic == topics["odometry"]:
                tracker.on_odometry(msg)
            elif topic == topics["route"]:
                tracker.on_route(msg)
            elif topic == topics["command"]:
                tracker.on_command(msg)
            else:
                stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
                inputs = tracker.inputs_at(stamp)
                record = records[stamp]
                assert inputs.command == record["command"] and inputs.command_source == "command"
                np.testing.assert_allclose(inputs.ego.velocity, record["velocity"], atol=1e-9)
                np.testing.assert_allclose(inputs.ego.acceleration, record["acceleration_estimated"], atol=1e-9)
                np.testing.assert_allclose([inputs.odometry.x, inputs.odometry.y],
                                           [record["pose"]["x"], record["pose"]["y"]], atol=1e-9)
                matched += 1
    assert matched == EPISODE.frames


def test_bag_route_is_the_ego_lane(exported):
    from rosbags.highlevel import AnyReader

    out, _ = exported
    episode = simulate_episode(SETTINGS.seed, 0, EPISODE)
    with AnyReader([out / "bags" / "mcap" / "e0000"]) as reader:
        conn = next(c for c in reader.connections if c.topic == topic_names("hero")["route"])
        (_, _, raw), = list(reader.messages([conn]))
        path = reader.deserialize(raw, conn.msgtype)
    points = np.array([[p.pose.position.x, p.pose.position.y] for p in path.poses])
    assert path.header.frame_id == "map" and len(points) > 10
    for point in points[::7]:
        assert abs(episode.road.lane.project(point)[1]) < 1e-6
    assert np.all(np.hypot(*np.diff(points, axis=0).T) <= 2.0 + 1e-9)


# ----------------------------------------------------------------------------- atomicity, CLI
def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
    real = export_module.export_episode
    calls = []

    def failing(root, index, *args, **kwargs):
        calls.append(index)
        if index == 1:
            assert any(root.rglob("*.jpg"))                  # something was written before the failure
            raise RuntimeError("disk full")
        return real(root, index, *args, **kwargs)

    monkeypatch.setattr(export_module, "export_episode", failing)
    out = tmp_path / "set"
    with pytest.raises(RuntimeError, match="disk full"):
        export(out, ExportSettings(episodes=3, episode=EPISODE, formats=("json", "mcap")), progress=False)
    assert calls == [0, 1]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_interrupted_cli_run_leaves_no_output(tmp_path):
    out = tmp_path / "set"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wam_diff2_core.cli", "synth", str(out), "--episodes", "50",
                             "--frames", "100", "--width", "96", "--height", "54", "--no-progress"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 60
        while not any(tmp_path.glob(".set.partial-*/images/e0000/*.jpg")):   # wait until it is writing
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert b"interrupted" in stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_writes_a_set_and_rejects_bad_settings(tmp_path, capsys):
    from wam_diff2_core.cli import main

    out = tmp_path / "cli"
    assert main(["synth", str(out), "--episodes", "1", "--frames", "2", "--width", "64", "--height", "36",
                 "--formats", "json,sqlite3", "--no-traffic", "--no-progress", "--role", "ego_vehicle"]) == 0
    assert "1 episodes, 2 frames" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["formats"] == ["json", "sqlite3"] and manifest["camera"]["width"] == 64
    assert manifest["topics"]["image"]["name"] == "/carla/ego_vehicle/rgb_front/image"
    assert (out / "bags/sqlite3/e0000/metadata.yaml").exists() and not (out / "bags/mcap").exists()
    assert main(["synth", str(out), "--episodes", "1"]) == 2                     # exists, no --overwrite
    assert "already exists" in capsys.readouterr().err
    assert main(["synth", str(tmp_path / "bad"), "--formats", "json,avi"]) == 2
    assert "formats" in capsys.readouterr().err
    assert main(["synth", str(tmp_path / "bad"), "--frames", "0"]) == 2
    assert "frames" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_min_visible_pixels_labels_only_the_vehicles_that_many_pixels_show(tmp_path, capsys):
    from wam_diff2_core.cli import main

    def boxes(threshold):
        out = tmp_path / f"t{threshold}"
        assert main(["synth", str(out), "--episodes", "1", "--frames", "20", "--frame-stride", "5", "--formats", "json", "--val-fraction",
                     "0", "--vqa-per-frame", "0", "--no-progress", "--min-visible-pixels", str(threshold)]) == 0
        frames = [json.loads(line) for line in (out / "frames.jsonl").read_text().splitlines()]
        answers = [json.loads(s["conversations"][1]["value"])
                   for s in json.loads((out / "train.json").read_text()) if s["task"] == "detect"]
        assert [len(a) for a in answers] == [len(f["boxes"]) for f in frames]    # the answers are the labels
        return [b for f in frames for b in f["boxes"]]

    low, high = boxes(20), boxes(100)
    assert high and min(b["visible_pixels"] for b in high) >= 100
    assert any(b["visible_pixels"] < 100 for b in low)                          # the threshold removed some
    assert sorted(b["id"] for b in high) == sorted(b["id"] for b in low if b["visible_pixels"] >= 100)
    assert main(["synth", str(tmp_path / "bad"), "--min-visible-pixels", "0"]) == 2
    assert "--min-visible-pixels" in capsys.readouterr().err


def test_recovery_samples_are_training_only_plan_samples_with_their_own_images(tmp_path):
    from wam_diff2_core.sim.episode import RecoverySettings
    settings = ExportSettings(episodes=2, seed=7, val_fraction=0.5, formats=("json",), vqa_per_frame=0, detection=False,
                              episode=EpisodeSettings(frames=8, frame_stride=5, camera=CAMERA,
                                                      recovery=RecoverySettings(fraction=1.0)))
    export(tmp_path / "set", settings, progress=False)
    train = json.loads((tmp_path / "set" / "train.json").read_text())
    val = json.loads((tmp_path / "set" / "val.json").read_text())
    recovery = [s for s in train if "recovery" in s]
    assert len(recovery) == 8 and len(train) == 16 and len(val) == 8
    assert not any("recovery" in s for s in val)
    episode = simulate_episode(7, 0, settings.episode)
    plain = {s["id"]: s for s in train}
    for s in recovery:
        assert s["task"] == "plan" and s["id"].endswith("-plan-recovery")
        frame = int(s["id"].split("-f")[1][:5])
        original = plain[s["id"].removesuffix("-recovery")]
        assert s["conversations"][0] == original["conversations"][0]        # same prompt, displaced image
        np.testing.assert_allclose(parse_waypoints(s["conversations"][1]["value"]).waypoints,
                                   episode.recoveries[frame].waypoints, atol=0.006)
        assert (tmp_path / "set" / s["image"][0]).is_file() and s["image"] != original["image"]
    assert len(list(iter_samples(tmp_path / "set" / "train.json"))) == 16


def test_commands_keep_only_the_json_samples_of_frames_under_those_commands(tmp_path):
    base = dict(episodes=2, seed=0, formats=("json",), val_fraction=0.0, vqa_per_frame=0, detection=False,
                episode=EpisodeSettings(frames=8, frame_stride=10, camera=CAMERA, traffic=False))
    export(tmp_path / "all", ExportSettings(**base), progress=False)
    export(tmp_path / "turns", ExportSettings(**base, commands=("left", "right")), progress=False)
    everything = json.loads((tmp_path / "all" / "train.json").read_text())
    turns = json.loads((tmp_path / "turns" / "train.json").read_text())
    under_turns = re.compile(r"information is: (left|right)\n")
    assert turns == [s for s in everything if under_turns.search(s["conversations"][0]["value"])]
    frames = _frames(tmp_path / "turns")
    assert frames == [{**f, "image": f["image"] if f["command"] != "straight" else None}
                      for f in _frames(tmp_path / "all")]                       # every frame's ground truth
    assert 0 < len(turns) < len(frames)
    images = {p.relative_to(tmp_path / "turns").as_posix() for p in (tmp_path / "turns" / "images").rglob("*.jpg")}
    assert images == {f["image"] for f in frames if f["image"]}
    with pytest.raises(ValueError, match="commands"):
        ExportSettings(**base, commands=("up",))


def test_a_recovery_copy_from_rest_says_so_in_its_prompt(tmp_path):
    from wam_diff2_core.sim.episode import RecoverySettings
    recovery = RecoverySettings(fraction=1.0, standstill_probability=1.0)
    settings = ExportSettings(episodes=1, seed=7, val_fraction=0.0, formats=("json",), vqa_per_frame=0,
                              detection=False, episode=EpisodeSettings(frames=3, frame_stride=5, camera=CAMERA,
                                                                       recovery=recovery))
    export(tmp_path / "set", settings, progress=False)
    train = json.loads((tmp_path / "set" / "train.json").read_text())
    copies = [s for s in train if "recovery" in s]
    assert len(copies) == 3
    commands = {(f["episode"], f["frame"]): f["command"] for f in _frames(tmp_path / "set")}
    for s in copies:
        assert s["recovery"]["speed_changed"] and s["recovery"]["speed_mps"] == 0.0
        frame = int(s["id"].split("-f")[1][:5])
        assert s["conversations"][0]["value"] == format_planning_prompt(commands[(0, frame)], (0.0, 0.0), (0.0, 0.0))
