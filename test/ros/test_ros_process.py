"""``wam-diff2-planner --ros-args --params-file config/planner.yaml`` as its own process, over DDS.

The installed console script with the shipped YAML and the tiny checkpoint: it configures and
activates itself, answers camera + odometry + command with a trajectory stamped like the
image, and exits cleanly on SIGINT.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from std_msgs.msg import String  # noqa: E402

from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from test.support.ros_helpers import Probe, image_msg, unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
EXECUTABLE = Path(sys.executable).parent / "wam-diff2-planner"
START_S = 180.0     # importing torch + transformers and loading, on 2 shared cores


def test_console_script_answers_over_dds_and_exits_on_sigint(tiny_checkpoint, tmp_path):
    assert EXECUTABLE.exists(), "console script missing: rerun bash scripts/setup.sh"
    domain = unique_domain_id(2)
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    log_path = tmp_path / "planner.log"
    cmd = [str(EXECUTABLE), "--ros-args", "--params-file", str(ROOT / "config" / "planner.yaml"),
           "-p", f"model_path:={tiny_checkpoint}", "-p", "decoding.max_new_tokens:=32",
           "-p", "diagnostics_period_s:=0.2", "-p", "image_timeout_s:=10.0"]
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    probe = Probe("/wam_diff2_planner", context=context).start()
    try:
        ready = probe.wait_for(lambda: probe.with_status(PlannerStatus.READY) or proc.poll() is not None, START_S)
        assert proc.poll() is None and ready, log_path.read_text()
        # active once the image subscription exists (created on configure, fed on activate)
        assert probe.wait_for(lambda: probe.count_publishers(probe.topic("~/output/trajectory")) > 0, 30.0)
        assert probe.wait_for(lambda: probe.state() == "active", 30.0)
        probe.command_pub.publish(String(data="CHANGELANERIGHT"))
        stamp = None
        for _ in range(10):          # the first command or frames may race discovery: resend until answered
            stamp = probe.now_ns()
            time.sleep(0.06)           # let the odometry stream pass the stamp
            probe.image_pub.publish(image_msg(stamp, encoding="bgra8", padding=4))
            answers = probe.wait_for(lambda: probe.with_stamp("trajectory", stamp), 15.0)
            if answers and answers[-1].command == "right":
                break
            probe.command_pub.publish(String(data="CHANGELANERIGHT"))
        traj = probe.with_stamp("trajectory", stamp)
        assert traj, log_path.read_text()
        assert traj[-1].command == "right" and traj[-1].header.frame_id == "ego_vehicle"
        assert not traj[-1].valid and traj[-1].invalid_reason        # the random model's answer does not parse
        assert probe.with_stamp("path", stamp) == []
    finally:
        probe.stop()
        rclpy.shutdown(context=context)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(10.0)
    assert code == 0, log_path.read_text()
    text = log_path.read_text()
    assert "configured in" in text and "active:" in text and "Traceback" not in text, text


def test_sigint_during_a_long_decode_exits_within_seconds(tiny_checkpoint, tmp_path):
    """Ctrl-C once waited up to 60 s for the decode in flight. Here a frame's decode would run for
    minutes (the checkpoint's EOS is made unreachable: it is the banned mask id, and B = 1 with
    65536 tokens), and SIGINT must still end the process within a few seconds, exit code 0."""
    import json
    import shutil
    ckpt = tmp_path / "endless"
    shutil.copytree(tiny_checkpoint, ckpt)
    settings = json.loads((ckpt / "diffusion_config.json").read_text())
    settings["eos_token_id"] = settings["mask_token_id"]
    (ckpt / "diffusion_config.json").write_text(json.dumps(settings))
    domain = unique_domain_id(3)
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    log_path = tmp_path / "planner.log"
    cmd = [str(EXECUTABLE), "--ros-args", "--params-file", str(ROOT / "config" / "planner.yaml"),
           "-p", f"model_path:={ckpt}", "-p", "decoding.block_size:=1", "-p", "decoding.max_new_tokens:=65536",
           "-p", "warmup:=false", "-p", "diagnostics_period_s:=0.2", "-p", "image_timeout_s:=10.0"]
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    probe = Probe("/wam_diff2_planner", context=context).start()
    try:
        assert probe.wait_for(lambda: probe.state() == "active" or proc.poll() is not None, START_S)
        assert proc.poll() is None, log_path.read_text()
        started = None
        for _ in range(10):          # until the worker has taken a frame (discovery may drop the first)
            stamp = probe.now_ns()
            time.sleep(0.06)
            probe.image_pub.publish(image_msg(stamp))
            started = probe.wait_for(lambda: probe.counter("wam_diff2_planner: planner", "images_received") > 0, 5.0)
            if started:
                break
        assert started, log_path.read_text()
        time.sleep(3.0)              # well inside the decode
        assert proc.poll() is None and probe.with_stamp("trajectory", stamp) == []
    finally:
        probe.stop()
        rclpy.shutdown(context=context)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(10.0)
    elapsed = time.monotonic() - t0
    assert code == 0 and elapsed < 10.0, (elapsed, log_path.read_text()[-3000:])
    assert "not waiting for it" in log_path.read_text()
