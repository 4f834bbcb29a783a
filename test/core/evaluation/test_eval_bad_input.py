"""Bad bags: a clear one-line error (exit 2, no traceback, no report) or a counted skip in the report.

Runs ``wam-diff2 eval-bag`` in-process with the model replaced by a scripted policy, so only
the bag handling is exercised (the real checkpoint runs in test_eval_cli.py).
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from test.support.scripted_policy import ScriptedPolicy
from wam_diff2_core.cli import main
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.evaluation.bag_writer import write_bag
from test.support.scenes import scene_messages, scene_topic_types, straight_scene, \
    write_scene_bag

ODOM, IMAGE = "/carla/ego_vehicle/odometry", "/carla/ego_vehicle/rgb_front/image"


@pytest.fixture
def scripted(monkeypatch):
    """``DrivingPolicy.from_checkpoint`` returns a constant-velocity scripted policy."""
    from wam_diff2_core.policy import DrivingPolicy

    policy = ScriptedPolicy()
    monkeypatch.setattr(DrivingPolicy, "from_checkpoint", classmethod(lambda cls, *a, **k: policy))
    return policy


def scene(**kw):
    return straight_scene(8.0, duration_s=kw.pop("duration_s", 5.0), camera_hz=10.0, odometry_hz=20.0, **kw)


def eval_bag(bag, out, *extra):
    return main(["eval-bag", str(bag), "--model", "unused", "--out", str(out), "--no-progress", *extra])


def expect_error(capsys, rc, *fragments):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and "wam-diff2 eval-bag: error:" in err
    for fragment in fragments:
        assert fragment in err, err
    return err


def counts_of(out):
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["counts"], metrics["bags"][0]["counts"]


def stamp(msg, t_ns):
    return dataclasses.replace(msg, header=dataclasses.replace(msg.header, stamp=dataclasses.replace(
        msg.header.stamp, sec=t_ns // 10**9, nanosec=t_ns % 10**9)))


# ----------------------------------------------------------------------------- errors
def test_missing_topic_names_the_topics_that_are_there(tmp_path, capsys, scripted):
    bag = write_scene_bag(tmp_path / "bag", scene())
    rc = eval_bag(bag, tmp_path / "out", "--image-topic", "/front/image_raw")
    expect_error(capsys, rc, "no image topic '/front/image_raw'", IMAGE, "--image-topic")
    rc = eval_bag(bag, tmp_path / "out", "--route-topic", "/my/route")     # named explicitly, so required
    expect_error(capsys, rc, "no route topic '/my/route'")
    assert not (tmp_path / "out").exists() and scripted.calls == []


def test_empty_bags(tmp_path, capsys, scripted):
    s = scene()
    no_messages = write_bag(tmp_path / "no_messages", scene_topic_types(s), [], storage="sqlite3")
    expect_error(capsys, eval_bag(no_messages, tmp_path / "out"), "image topic", "has no messages")
    no_topics = write_bag(tmp_path / "no_topics", {}, [], storage="mcap")
    expect_error(capsys, eval_bag(no_topics, tmp_path / "out"), "no image topic", "(topics: none)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("storage,fraction,fragment", [("mcap", 0.6, "mcap recover"),
                                                      ("sqlite3", 0.9, "truncated or corrupt")])
def test_truncated_bag(tmp_path, capsys, scripted, storage, fraction, fragment):
    bag = write_scene_bag(tmp_path / "bag", scene(), storage=storage)
    data_file = next(p for p in bag.iterdir() if p.suffix in (".mcap", ".db3"))
    data = data_file.read_bytes()
    data_file.write_bytes(data[:int(len(data) * fraction)])
    expect_error(capsys, eval_bag(bag, tmp_path / "out"), str(bag))
    assert not (tmp_path / "out").exists() and scripted.calls == []


def test_nonexistent_and_non_bag_paths(tmp_path, capsys, scripted):
    expect_error(capsys, eval_bag(tmp_path / "nope", tmp_path / "out"), "no such file or folder")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("hi")
    expect_error(capsys, eval_bag(tmp_path / "folder", tmp_path / "out"), "not a rosbag2 folder")


def test_unknown_message_types(tmp_path, capsys, scripted):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import get_types_from_msg

    s = scene()
    store = default_typestore()
    store.register(get_types_from_msg("float64 x\nfloat64 y", "acme_msgs/msg/Pose2D"))
    topics = dict(scene_topic_types(s), **{ODOM: "acme_msgs/msg/Pose2D"})
    messages = [(t, ns, m) for t, ns, m in scene_messages(s, store.types) if t != ODOM]
    messages.append((ODOM, 10**12, store.types["acme_msgs/msg/Pose2D"](x=1.0, y=2.0)))
    bad = write_bag(tmp_path / "typed", topics, messages, storage="mcap", typestore=store)
    expect_error(capsys, eval_bag(bad, tmp_path / "out"), "odometry topic", "acme_msgs/msg/Pose2D",
                 "expected nav_msgs/msg/Odometry")

    # an extra topic of a type nobody knows (and whose stored definition does not parse) is ignored
    with Writer(tmp_path / "with_unknown", version=9) as writer:
        store = default_typestore()
        conns = {t: writer.add_connection(t, m, typestore=store) for t, m in scene_topic_types(s).items()}
        blob = writer.add_connection("/acme/blob", "acme_msgs/msg/Blob", msgdef="%%% not a definition",
                                     rihs01="RIHS01_" + "0" * 64)
        for t, ns, m in scene_messages(s, store.types):
            writer.write(conns[t], ns, store.serialize_cdr(m, scene_topic_types(s)[t]))
        writer.write(blob, 10**12, b"\x00\x01\x00\x00garbage")
    assert eval_bag(tmp_path / "with_unknown", tmp_path / "out") == 0, capsys.readouterr().err
    assert counts_of(tmp_path / "out")[0]["evaluated"] == 11


def test_time_reset_in_odometry_is_an_error(tmp_path, capsys, scripted):
    def reset(messages):
        for topic, t_ns, msg in messages:
            if topic == ODOM and t_ns > 1003 * 10**9:
                msg = stamp(msg, t_ns - 3 * 10**9)      # the simulator restarted 3 s back
            yield topic, t_ns, msg

    bag = write_scene_bag(tmp_path / "bag", scene(), transform=reset)
    expect_error(capsys, eval_bag(bag, tmp_path / "out"), "time goes backwards on '/carla/ego_vehicle/odometry' by "
                                                          "2.950 s at message 62", "split it")


# ----------------------------------------------------------------------------- counted skips
def test_bad_frames_and_messages_are_counted_not_scored(tmp_path, capsys, scripted):
    """10 Hz camera over 5 s: frames 0..10 have 4 s of future. Frame 1 is repeated with its stamp, frame 3
    goes 0.15 s back in time, frame 4 has stamp 0, frame 5 a wrong step, frame 6 the encoding yuv422,
    frame 7 truncated bytes; one odometry sample is NaN, one repeated, one out of order."""
    base = 1000 * 10**9

    def damage(messages):
        for topic, t_ns, msg in messages:
            if topic == IMAGE:
                i = round((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec - base) / 1e8)
                if i == 1:
                    yield topic, t_ns, msg
                    yield topic, t_ns + 1_000_000, msg                                 # duplicate stamp
                    continue
                if i == 3:
                    msg = stamp(msg, base + 150_000_000)                               # backwards by 0.15 s
                elif i == 4:
                    msg = stamp(msg, 0)
                elif i == 5:
                    msg = dataclasses.replace(msg, step=msg.step + 4)
                elif i == 6:
                    msg = dataclasses.replace(msg, encoding="yuv422")
                elif i == 7:
                    yield topic, t_ns, default_typestore().serialize_cdr(msg, "sensor_msgs/msg/Image")[:40]
                    continue
            if topic == ODOM:
                k = round((t_ns - base) / 5e7)
                if k == 30:
                    pose = dataclasses.replace(msg.pose.pose, position=dataclasses.replace(msg.pose.pose.position,
                                                                                           x=math.nan))
                    msg = dataclasses.replace(msg, pose=dataclasses.replace(msg.pose, pose=pose))
                elif k == 40:
                    yield topic, t_ns, msg                                             # repeated stamp
                elif k == 50:
                    msg = stamp(msg, t_ns - 200_000_000)                               # 0.2 s out of order
            yield topic, t_ns, msg

    bag = write_scene_bag(tmp_path / "bag", scene(), storage="sqlite3", transform=damage)
    assert eval_bag(bag, tmp_path / "out") == 0, capsys.readouterr().err
    total, per_bag = counts_of(tmp_path / "out")
    assert total["images"] == 52 and total["evaluated"] == 6 and total["valid"] == 6
    assert total["skipped"] == {"duplicate_stamp": 1, "time_backwards": 1, "zero_stamp": 1, "image_size_mismatch": 1,
                                "image_unsupported_encoding": 1, "undecodable_message": 1}
    assert total["excluded_no_future"] == {"insufficient_future": 40}
    assert per_bag["input_messages_skipped"] == {f"{ODOM}: bad_odometry": 1, f"{ODOM}: odometry_out_of_order": 2}
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["overall"]["frames"] == 6
    report = (tmp_path / "out" / "report.md").read_text()
    assert "duplicate_stamp 1" in report and "undecodable_message 1" in report
    out = capsys.readouterr().out
    assert "6 frames evaluated of 52 camera frames" in out and "6 skipped" in out


def test_a_frame_over_the_image_size_limit_is_skipped_from_its_header(tmp_path, capsys, scripted):
    """Frame 2 is twice as wide as the others; with the limit at the normal frame's pixels it is
    counted as image_too_large (from --max-decoded-pixels or the node's --params-file value)."""
    base, size = 1000 * 10**9, {}

    def widen(messages):
        for topic, t_ns, msg in messages:
            if topic == IMAGE:
                size["pixels"] = msg.width * msg.height
                if round((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec - base) / 1e8) == 2:
                    rows = msg.data.reshape(msg.height, msg.step)
                    msg = dataclasses.replace(msg, width=2 * msg.width, step=2 * msg.step,
                                              data=np.concatenate([rows, rows], axis=1).reshape(-1))
            yield topic, t_ns, msg

    bag = write_scene_bag(tmp_path / "bag", scene(), transform=widen)
    assert eval_bag(bag, tmp_path / "flag", "--max-decoded-pixels", str(size["pixels"])) == 0, capsys.readouterr().err
    assert counts_of(tmp_path / "flag")[0]["skipped"] == {"image_too_large": 1}
    params = tmp_path / "planner.yaml"
    params.write_text(f"/**:\n  ros__parameters:\n    image:\n      max_decoded_pixels: {size['pixels']}\n")
    assert eval_bag(bag, tmp_path / "params", "--params-file", str(params)) == 0, capsys.readouterr().err
    assert counts_of(tmp_path / "params")[0]["skipped"] == {"image_too_large": 1}
    assert eval_bag(bag, tmp_path / "default") == 0
    assert counts_of(tmp_path / "default")[0]["skipped"] == {}


def test_the_params_files_trajectory_limits_shape_the_scored_speed_profile(tmp_path, capsys, monkeypatch):
    """Plans that stay put from 8 m/s: the profile brakes at the node's trajectory.max_decel_mps2,
    6 m/s^2 by default (2 m/s at 1 s, then 0), 2 m/s^2 from the params file (6, 4, 2, 0 m/s at 1-4 s)."""
    from wam_diff2_core.policy import DrivingPolicy

    policy = ScriptedPolicy(lambda i, ego, command: np.zeros((8, 2)))
    monkeypatch.setattr(DrivingPolicy, "from_checkpoint", classmethod(lambda cls, *a, **k: policy))
    bag = write_scene_bag(tmp_path / "bag", scene())
    params = tmp_path / "planner.yaml"
    params.write_text("/**:\n  ros__parameters:\n    trajectory:\n      max_decel_mps2: 2\n")
    for name, extra, expected in (("default", (), [6.0, 8.0, 8.0, 8.0]),
                                  ("params", ("--params-file", str(params)), [2.0, 4.0, 6.0, 8.0])):
        assert eval_bag(bag, tmp_path / name, *extra) == 0, capsys.readouterr().err
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        assert list(metrics["overall"]["speed_profile"]["model"]["mean_at_t"].values()) == pytest.approx(expected)
    assert metrics["settings"]["profile_limits"]["max_decel_mps2"] == 2.0
    assert "speed error (m/s)" in capsys.readouterr().out
    for value, fragment in (("-1.0", "trajectory.max_decel_mps2: -1.0 is below"),
                            ("fast", "trajectory.max_decel_mps2: expected float, got 'fast'")):
        params.write_text(f"/**:\n  ros__parameters:\n    trajectory:\n      max_decel_mps2: {value}\n")
        expect_error(capsys, eval_bag(bag, tmp_path / f"bad_{value}", "--params-file", str(params)),
                     f"--params-file {params}", fragment)


def test_frames_without_a_command_are_skipped_only_when_asked(tmp_path, capsys, scripted):
    bag = write_scene_bag(tmp_path / "bag", scene(route=None))
    rc = eval_bag(bag, tmp_path / "strict", "--default-command", "none")
    expect_error(capsys, rc, "neither the route topic", "--default-command")
    assert eval_bag(bag, tmp_path / "default") == 0          # the node's default: straight
    metrics = json.loads((tmp_path / "default" / "metrics.json").read_text())
    assert metrics["bags"][0]["counts"]["command_sources"] == {"default": 11}
    assert metrics["per_command"]["straight"]["frames"] == 11


def test_refuses_to_overwrite_and_to_compare_unfinished_runs(tmp_path, capsys, scripted):
    bag = write_scene_bag(tmp_path / "bag", scene())
    (tmp_path / "out").mkdir()
    expect_error(capsys, eval_bag(bag, tmp_path / "out"), "already exists", "--overwrite")
    assert eval_bag(bag, tmp_path / "out", "--overwrite") == 0
    expect_error(capsys, eval_bag(bag, tmp_path / "out", "--overwrite", "--every", "0"), "every: must be >= 1")
    (tmp_path / "half").mkdir()
    rc = main(["eval-bag", "--compare", str(tmp_path / "out"), str(tmp_path / "half"), "--out", str(tmp_path / "c")])
    expect_error(capsys, rc, "is not a finished eval-bag run")
    assert not (tmp_path / "c").exists()


def test_interrupted_run_leaves_no_report(tmp_path, capsys, monkeypatch):
    from wam_diff2_core.policy import DrivingPolicy

    def answer(i, ego, command):
        if i == 3:
            raise KeyboardInterrupt
        return np.zeros((8, 2))

    monkeypatch.setattr(DrivingPolicy, "from_checkpoint", classmethod(lambda cls, *a, **k: ScriptedPolicy(answer)))
    bag = write_scene_bag(tmp_path / "bag", scene())
    assert eval_bag(bag, tmp_path / "out", "--record", str(tmp_path / "rec")) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bag"]
