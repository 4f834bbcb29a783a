"""``eval-bag --predictions``: scoring the Trajectory messages a node published, matched by stamp.

A hand-built predictions bag with known waypoints (offsets from the recorded future) pins the
L2 values and every count: answered frames, a frame the node never answered (``not_published``),
an answer for a frame that is not scored, a stamp that matches no camera frame, a duplicate, an
invalid answer and a "valid" answer with the wrong number of points. No ROS needed.
"""
from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest

from test.support import REPO_ROOT
from test.support.trajectory_messages import TOPIC, TYPE, trajectory
from wam_diff2_core.cli import main
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.evaluation.bag_writer import BagStreamWriter, write_bag
from wam_diff2_core.evaluation.bags import Bag, BagError
from wam_diff2_core.evaluation.bag_plan import EvalSettings, plan_bag
from wam_diff2_core.evaluation.predictions import NOT_PUBLISHED, evaluate_predictions
from test.support.scenes import START_NS, straight_scene, write_scene_bag

K = np.arange(1, 9)


def lateral(values):
    return np.stack([np.zeros(8), np.asarray(values, float) * np.ones(8)], axis=1)


SELECTION_FIELDS = ("uint32 candidates", "uint32 valid_candidates", "uint32 selected_candidate", "float32 pdms")
# TrajectoryPoint as 0.1.0 published it (before heading and speed): bags recorded then must still evaluate
TRAJECTORY_POINT_0_1 = """builtin_interfaces/Duration time_from_start
float64 x
float64 y
"""


def typestore_of(version: str):
    """The types a node of package ``version`` wrote its bag with."""
    store = default_typestore()
    if version in ("0.1.0", "0.2.0"):
        from rosbags.typesys import Stores, get_types_from_msg, get_typestore
        old = get_typestore(Stores.EMPTY)
        replaced = {"wam_diff2_ros/msg/Trajectory", "wam_diff2_ros/msg/TrajectoryPoint"}
        old.register({k: v for k, v in store.fielddefs.items() if k not in replaced})
        # before 0.3.0 the Trajectory had no candidate selection fields
        lines = (REPO_ROOT / "msg" / "Trajectory.msg").read_text().splitlines()
        old.register(get_types_from_msg("\n".join(line for line in lines if not line.startswith(SELECTION_FIELDS)),
                                        "wam_diff2_ros/msg/Trajectory"))
        point = TRAJECTORY_POINT_0_1 if version == "0.1.0" else (REPO_ROOT / "msg" / "TrajectoryPoint.msg").read_text()
        old.register(get_types_from_msg(point, "wam_diff2_ros/msg/TrajectoryPoint"))
        store = old
    return store


@pytest.fixture(scope="module")
def scene_bag(tmp_path_factory):
    """6.5 s straight at 8 m/s, camera 2 Hz (14 frames; those at <= 2.5 s have 4 s of future: 6 scored)."""
    scene = straight_scene(8.0, duration_s=6.5, camera_hz=2.0, odometry_hz=20.0)
    return write_scene_bag(tmp_path_factory.mktemp("src") / "bag", scene, storage="mcap"), scene


@pytest.fixture(scope="module", params=["0.3.0", "0.2.0", "0.1.0"])
def predictions_bag(scene_bag, tmp_path_factory, request):
    """A node's answers as the current package writes them, and as 0.2.0 and 0.1.0 did (their own definitions
    inside)."""
    bag, scene = scene_bag
    with Bag(bag) as b:
        plan = plan_bag(b, EvalSettings())
    gt = {p.stamp_ns: p.ground_truth for p in plan.planned}
    s = [p.stamp_ns for p in plan.planned]
    assert len(s) == 6 and s[0] == START_NS
    store = typestore_of(request.param)
    types = store.types
    assert ("candidates" in types[TYPE].__dataclass_fields__) == (request.param == "0.3.0")
    log = lambda stamp: stamp + 300_000_000          # noqa: E731 - answered 0.3 s later
    msgs = [
        (TOPIC, log(s[0]), trajectory(types, s[0], gt[s[0]] + lateral(0.1 * K), latency_ms=100.0)),   # e_k = 0.1 k
        (TOPIC, log(s[0]) + 1, trajectory(types, s[0], gt[s[0]] + lateral(9.0))),                   # duplicate
        (TOPIC, log(s[1]), trajectory(types, s[1], gt[s[1]] + lateral(0.3), latency_ms=200.0)),      # e_k = 0.3
        (TOPIC, log(s[2]), trajectory(types, s[2], None, valid=False, reason="not_a_number: garbage",
                                      latency_ms=300.0)),
        # s[3]: never answered
        (TOPIC, log(s[4]), trajectory(types, s[4], gt[s[4]], command="left", latency_ms=400.0)),     # exact
        (TOPIC, log(s[5]), trajectory(types, s[5], gt[s[5]][:7], latency_ms=500.0)),                 # 7 points
        (TOPIC, log(s[5]) + 2, trajectory(types, scene.camera_times_ns()[10], gt[s[0]])),          # unscored frame
        (TOPIC, log(s[5]) + 3, trajectory(types, s[5] + 1234, gt[s[0]])),                          # no such frame
    ]
    out = tmp_path_factory.mktemp("node") / "node_out"
    return write_bag(out, {TOPIC: TYPE}, sorted(msgs, key=lambda m: m[1]), storage="mcap", typestore=store)


def test_predictions_give_exact_l2_and_every_count(scene_bag, predictions_bag):
    bag, _ = scene_bag
    run = evaluate_predictions([bag], [predictions_bag])
    c = run.counts()
    assert (c["images"], c["evaluated"], c["valid"]) == (14, 5, 3)
    assert c["skipped"] == {NOT_PUBLISHED: 1} and sum(c["excluded_no_future"].values()) == 8
    assert c["images"] == c["not_selected"] + sum(c["skipped"].values()) + sum(c["excluded_no_future"].values()) \
        + c["evaluated"]
    assert c["predictions"] == {"messages": 8, "matched": 5, "unscored_frame": 1, "unmatched_stamp": 1,
                                "duplicate": 1, "undecodable": 0, "command_differs": 1}
    frames = {f.index: f for f in run.frames}
    assert sorted(frames) == [0, 1, 2, 4, 5]
    assert frames[0].errors == pytest.approx(0.1 * K)             # the first of the duplicates counts
    assert frames[2].invalid_reason == "not_a_number: garbage" and frames[2].predicted is None
    assert frames[5].invalid_reason.startswith("bad_waypoints") and not frames[5].valid
    assert frames[4].command == "left" and frames[4].command_source == "node"
    assert frames[0].command_source == "route" and frames[0].raw_text == "answer"
    assert frames[1].stats == {"block_size": 32, "forwards": 4, "denoise_steps": 3, "blocks": 1, "tokens": 8,
                               "prefill_ms": 1.0, "denoise_ms": 2.0, "commit_ms": 0.5, "retries": 0}
    assert [f.latency_ms for f in run.frames] == [100.0, 200.0, 300.0, 400.0, 500.0]
    # the node's published stage times become the frames' stage table
    assert [f.stages["denoise_ms"] for f in run.frames] == [100.0, 200.0, 300.0, 400.0, 500.0]
    assert run.frames[0].stages["total_ms"] == 101.0 and run.frames[0].stages["memory_kind"] == "rss"


def test_cli_report_names_the_node_bag_and_pins_the_metrics(scene_bag, predictions_bag, tmp_path, capsys):
    bag, _ = scene_bag
    out = tmp_path / "eval"
    assert main(["eval-bag", str(bag), "--predictions", str(predictions_bag), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "5 frames evaluated of 14" in printed and "1 frames not published" in printed
    m = json.loads((out / "metrics.json").read_text())
    assert m["model"]["source"] == "predictions" and m["model"]["decoding"] == {"block_size": 32}
    assert m["model"]["predictions"] == [{"path": str(predictions_bag), "topic": TOPIC, "bag": str(bag)}]
    o = m["overall"]
    assert (o["frames"], o["valid"], o["parse_failures"]) == (5, 3, 2)
    assert o["invalid_reasons"] == {"not_a_number": 1, "bad_waypoints": 1}
    curve = (0.1 * K + 0.3 + 0.0) / 3
    assert o["model"]["per_waypoint"] == pytest.approx(curve.tolist())
    assert o["model"]["l2_at_t"] == pytest.approx({"1s": curve[1], "2s": curve[3], "3s": curve[5], "4s": curve[7]})
    assert o["model"]["l2_avg_to_t"]["4s"] == pytest.approx(curve.mean())
    assert o["latency_ms"]["mean"] == pytest.approx(300.0)
    assert o["stages"]["ms"]["denoise"]["p50"] == pytest.approx(300.0) and o["stages"]["peak_memory_mb"] == 500.0
    assert "frame -> trajectory" in printed
    assert m["per_command"]["left"]["valid"] == 1 and m["per_command"]["left"]["model"]["ade"] == pytest.approx(0.0)
    assert m["bags"][0]["counts"]["predictions"]["matched"] == 5
    report = (out / "report.md").read_text()
    assert f"topic `{TOPIC}`" in report and "no model was run" in report and "not_published 1" in report
    assert "1 matched no camera frame" in report
    assert len((out / "frames.jsonl").read_text().splitlines()) == 5


def test_cli_refuses_what_it_cannot_do(scene_bag, predictions_bag, tmp_path, capsys):
    bag, _ = scene_bag
    args = ["eval-bag", str(bag), "--predictions", str(predictions_bag), "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a"), "--model", "some/ckpt"]) == 2
    assert "drop --model" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "a"), "--block-size", "4"]) == 2
    assert "--block-size" in capsys.readouterr().err
    assert main(["eval-bag", str(bag), str(bag), "--predictions", str(predictions_bag), "--out",
                 str(tmp_path / "a")]) == 2
    assert "1 NODE_BAG(s) for 2 BAG(s)" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "a"), "--trajectory-topic", "/nope"]) == 2
    assert "no trajectory topic '/nope'" in capsys.readouterr().err
    assert main(["eval-bag", str(bag), "--predictions", str(bag), "--out", str(tmp_path / "a")]) == 2
    assert "no wam_diff2_ros/msg/Trajectory topic" in capsys.readouterr().err
    assert main(["eval-bag", str(bag), "--model", "x", "--trajectory-topic", TOPIC, "--out", str(tmp_path / "a")]) == 2
    assert "--trajectory-topic goes with --predictions" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_trajectories_of_another_bag_are_an_error_and_other_topics_are_found(scene_bag, tmp_path, capsys):
    bag, _ = scene_bag
    types = default_typestore().types
    other = write_bag(tmp_path / "other", {"/wam_diff2/trajectory": TYPE},
                      [("/wam_diff2/trajectory", 5, trajectory(types, 7 * 10**9, np.zeros((8, 2))))])
    assert main(["eval-bag", str(bag), "--predictions", str(other), "--out", str(tmp_path / "a")]) == 2
    assert "is it a recording of this bag's replay?" in capsys.readouterr().err
    # the only Trajectory topic is used when the planner's default is absent; an empty one scores nothing
    empty = write_bag(tmp_path / "empty", {"/wam_diff2/trajectory": TYPE}, [])
    assert main(["eval-bag", str(bag), "--predictions", str(empty), "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert "holds no trajectories" in captured.err
    counts = json.loads((tmp_path / "b" / "metrics.json").read_text())["counts"]
    assert counts["skipped"] == {NOT_PUBLISHED: 6} and counts["evaluated"] == 0


def test_stream_writer_is_atomic(tmp_path):
    store = default_typestore()
    String = store.types["std_msgs/msg/String"]
    with pytest.raises(KeyboardInterrupt):
        with BagStreamWriter(tmp_path / "out", storage="sqlite3") as w:
            w.add_topic("/a", "std_msgs/msg/String")
            w.write("/a", 1, String(data="x"))
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with BagStreamWriter(tmp_path / "out") as w:
        w.add_topic("/a", "std_msgs/msg/String", latched=True)
        w.write("/a", 1, String(data="x"))
        w.write("/a", 2, store.serialize_cdr(String(data="y"), "std_msgs/msg/String"))
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with Bag(tmp_path / "out") as b:
        assert [(t, m.data) for _, t, m in b.messages(["/a"])] == [(1, "x"), (2, "y")]
        assert b.topic_qos["/a"][0].durability.name == "TRANSIENT_LOCAL"
    from wam_diff2_core.evaluation.bags import BagError
    with pytest.raises(BagError, match="already exists"):
        BagStreamWriter(tmp_path / "out")
    with pytest.raises(BagError, match="no message definition for acme_msgs/msg/Thing"):
        with BagStreamWriter(tmp_path / "out2") as w:
            w.add_topic("/t", "acme_msgs/msg/Thing")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failed_write_fails_the_close_and_leaves_no_file_open(tmp_path):
    """A write the storage refuses fails close(), and no file of the bag stays open (sqlite3: mcap's writer cannot
    close after a failed chunk; its file goes with the writer object)."""
    String = default_typestore().types["std_msgs/msg/String"]
    with pytest.raises(BagError, match="writing failed"):
        with BagStreamWriter(tmp_path / "out", storage="sqlite3") as w:
            w.add_topic("/a", "std_msgs/msg/String")
            w.write("/a", 2**70, String(data="x"))          # a stamp the storage cannot hold
    assert list(tmp_path.iterdir()) == []
    open_files = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):                  # the listing's own descriptor is gone by now
            open_files.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [f for f in open_files if f.startswith(str(tmp_path))], open_files
