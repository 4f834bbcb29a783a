"""``wam-diff2-ros replay --record``: what comes back over DDS while playing, into a bag, and
``eval-bag --predictions`` on that bag.

The end-to-end test plays a short ``wam-diff2 synth`` bag with ``--clock`` into a real planner
node (tiny random checkpoint: its trajectories are invalid, which is fine) and records the
planner's outputs: one Trajectory per answered frame, stamped with the image stamp, logged at
playback time; then scores that recording.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test.support import REPO_ROOT as REPO, default_sigint

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from wam_diff2_core.cli import main  # noqa: E402
from wam_diff2_core.evaluation.bags import Bag  # noqa: E402
from wam_diff2_core.frame_inputs import stamp_ns  # noqa: E402
from test.support.scenes import straight_scene, write_scene_bag  # noqa: E402
from wam_diff2_ros.tools.bag_player import DEFAULT_RECORD_TOPICS, PLANNER_NODE  # noqa: E402
from test.support.ros_helpers import planner_command, running, unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
DOMAIN = unique_domain_id(8)
ROLE = "/carla/ego_vehicle"
TOPICS = {"image": f"{ROLE}/rgb_front/image", "odometry": f"{ROLE}/odometry", "route": f"{ROLE}/waypoints",
          "camera_info": f"{ROLE}/rgb_front/camera_info"}
TRAJECTORY = f"{PLANNER_NODE}/output/trajectory"


def replay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "wam_diff2_ros.tools", "replay", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_default_record_topics_are_the_planner_outputs():
    from wam_diff2_ros.planner.interface import OUTPUT_TOPICS
    names = {PLANNER_NODE + t[1:] for t in OUTPUT_TOPICS.values() if t.startswith("~")}
    assert set(DEFAULT_RECORD_TOPICS) <= names
    assert TRAJECTORY in DEFAULT_RECORD_TOPICS


@pytest.fixture(scope="module")
def scene_bag(tmp_path_factory):
    scene = straight_scene(8.0, duration_s=1.0, camera_hz=10.0, odometry_hz=20.0)
    return write_scene_bag(tmp_path_factory.mktemp("scene") / "bag", scene, storage="mcap"), scene


def test_record_keeps_the_bytes_and_logs_at_playback_time(scene_bag, tmp_path):
    """Recording a topic the player itself plays: every message, CDR unchanged, in the bag's time base."""
    bag, scene = scene_bag
    out = tmp_path / "rec"
    r = replay(str(bag), "--rate", "4", "--delay-s", "0.3", "--clock", "--record", str(out), "--record-topics",
               TOPICS["odometry"], "--record-grace-s", "0.3", "--record-storage", "sqlite3")
    assert r.returncode == 0, r.stderr
    assert f"recorded 21 messages ({TOPICS['odometry']} 21) into {out}" in r.stdout
    with Bag(bag) as src, Bag(out) as rec:
        assert rec.storage == "sqlite3" and rec.topic_types == {TOPICS["odometry"]: "nav_msgs/msg/Odometry"}
        played = list(src.raw_messages([TOPICS["odometry"]]))
        got = list(rec.raw_messages([TOPICS["odometry"]]))
    assert [bytes(d) for *_, d in got] == [bytes(d) for *_, d in played]
    log_ns = [t for _, t, _, _ in got]
    assert log_ns == sorted(log_ns)
    for (_, t_rec, _, _), (_, t_src, _, _) in zip(got, played):   # arrival in playback time, shortly after
        assert -10_000_000 <= t_rec - t_src < 400_000_000                 # (0.1 s wall at rate 4)
    assert not list(tmp_path.glob(".rec.partial-*"))


def test_record_refuses_what_it_cannot_do(scene_bag, tmp_path):
    bag, _ = scene_bag
    r = replay(str(bag), "--record-topics", "/x")
    assert r.returncode == 2 and "need --record OUT_BAG" in r.stderr
    (tmp_path / "exists").mkdir()
    r = replay(str(bag), "--record", str(tmp_path / "exists"))
    assert r.returncode == 2 and "already exists (use --overwrite" in r.stderr
    r = replay(str(bag), "--record", str(tmp_path / "out"), "--record-topics", "relative")
    assert r.returncode == 2 and "not an absolute topic name" in r.stderr
    r = replay(str(bag), "--record", str(bag), "--overwrite")
    assert r.returncode == 2 and "is the bag being played" in r.stderr
    # no planner runs: its trajectory never gets a publisher
    r = replay(str(bag), "--record", str(tmp_path / "out"), "--wait-timeout-s", "1", "--delay-s", "0")
    assert r.returncode == 2 and f"no publisher of --record-topics {', '.join(DEFAULT_RECORD_TOPICS)}" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]     # nothing half-written


@pytest.mark.slow
def test_replay_into_the_planner_records_its_answers_and_eval_bag_scores_them(tiny_checkpoint, tmp_path):
    synth = tmp_path / "synth"
    # 6 frames at 2 Hz (stamps 2.0 ... 4.5 s), odometry 20 Hz until 4 s after the last frame
    assert main(["synth", str(synth), "--episodes", "1", "--frames", "6", "--frame-stride", "10", "--formats", "mcap",
                 "--no-detection", "--vqa-per-frame", "0", "--width", "64", "--height", "36", "--no-traffic",
                 "--no-progress"]) == 0
    bag = synth / "bags" / "mcap" / "e0000"
    with Bag(bag) as b:
        image_stamps = [stamp_ns(m.header.stamp) for _, _, m in b.messages([TOPICS["image"]])]
    assert len(image_stamps) == 6

    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), OMP_NUM_THREADS="1")
    out = tmp_path / "node_out"
    command = planner_command(REPO / "config" / "planner.yaml", tiny_checkpoint, TOPICS,
                              {"decoding.block_size": 1, "decoding.max_new_tokens": 6})
    with running(command, env, tmp_path / "planner.log"):
        # the whole 4 s of frames (+ 0.5 s) at rate 1; waits for the node's model and subscriptions
        r = replay(str(bag), "--clock", "--playback-duration", "4.5", "--delay-s", "0.5", "--wait-for-planner",
                   "--wait-timeout-s", "120", "--wait-for-subscribers", TOPICS["image"], TOPICS["odometry"],
                   "--record", str(out), "--record-grace-s", "3", timeout=240)
    assert r.returncode == 0, r.stderr + (tmp_path / "planner.log").read_text()[-3000:]

    with Bag(out) as rec:
        assert rec.topic_types == {TRAJECTORY: "wam_diff2_ros/msg/Trajectory",
                                   f"{PLANNER_NODE}/output/detections": "wam_diff2_ros/msg/Detection2DArray",
                                   f"{PLANNER_NODE}/status": "wam_diff2_ros/msg/PlannerStatus"}
        trajectories = list(rec.messages([TRAJECTORY]))
        status = [m for _, _, m in rec.messages([f"{PLANNER_NODE}/status"])]
    assert status and status[-1].state == 2                                  # READY (latched)
    stamps = [stamp_ns(m.header.stamp) for _, _, m in trajectories]
    assert stamps and len(set(stamps)) == len(stamps) and set(stamps) <= set(image_stamps)   # one per answered frame
    for _, log_ns, m in trajectories:   # answered after the image arrived (playback time), invalid (random model)
        assert log_ns >= stamp_ns(m.header.stamp) - 50_000_000 and not m.valid and m.stats.block_size == 1

    ev = tmp_path / "eval"
    assert main(["eval-bag", str(bag), "--predictions", str(out), "--out", str(ev), "--no-progress"]) == 0
    c = json.loads((ev / "metrics.json").read_text())["counts"]
    p = c["predictions"]
    assert c["images"] == 6 and c["evaluated"] == p["matched"] and c["valid"] == 0
    assert c["evaluated"] + c["skipped"].get("not_published", 0) + sum(c["excluded_no_future"].values()) \
        + c["not_selected"] == 6 - sum(v for k, v in c["skipped"].items() if k != "not_published")
    assert p["messages"] == len(trajectories) == p["matched"] + p["unscored_frame"]
    assert p["unmatched_stamp"] == 0 and p["duplicate"] == 0


def test_ctrl_c_leaves_no_recording(scene_bag, tmp_path):
    bag, _ = scene_bag
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), OMP_NUM_THREADS="1")
    out = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "wam_diff2_ros.tools", "replay", str(bag), "--rate", "0.2",
                             "--delay-s", "0", "--record", str(out), "--record-topics", TOPICS["odometry"]],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp_path.glob(".rec.partial-*/rec/*.mcap")):
        time.sleep(0.05)
    time.sleep(1.0)                                  # playing (5 s at rate 0.2), recording
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
