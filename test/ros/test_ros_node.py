"""The planner node over real DDS (rclpy + Fast DDS) with the tiny checkpoint through the real policy.

The node runs in this process in its own MultiThreadedExecutor thread, as ``main()`` runs it; a
probe node publishes camera, odometry and commands and records every output. The tiny
checkpoint is random, so its planning answers are garbage: that exercises the invalid path
(an invalid trajectory with its reason, never a Path). The valid-plan plumbing test replaces
only the decoder's token output with a known answer, still parsed by the real policy.
"""
from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from wam_diff2_core.decoding.decoder import DecodeOutput  # noqa: E402
from wam_diff2_core.geometry import (CameraMount, PinholeCamera, ego_to_world, path_headings,  # noqa: E402
                                    project_ego_points)
from wam_diff2_core.frame_inputs import stamp_ns  # noqa: E402
from wam_diff2_core.params import planner as params  # noqa: E402
from wam_diff2_ros.parameters import read_all  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.qos import LATCHED_QOS  # noqa: E402
from wam_diff2_ros.planner.node import PlannerNode  # noqa: E402
from test.support.ros_helpers import Probe, image_msg, odometry_msg, ros_context, route_msg  # noqa: E402

pytestmark = pytest.mark.ros
NAME = "wam_diff2_planner"
DIAG = f"{NAME}: planner"
ANSWER = "2.26,-0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59"
WAYPOINTS = np.array([float(v) for v in ANSWER.split(",")]).reshape(8, 2)
BOXES = '[{"bbox_2d": [100, 200, 500, 600], "label": "car"}]'
FIRST_ANSWER_S = 120.0       # generous: other jobs may load these 2 cores
ANSWER_S = 60.0


def overrides(model_path: str, **extra) -> list[Parameter]:
    values = {"model_path": str(model_path), "tasks": "both", "decoding.max_new_tokens": 32,
              "diagnostics_period_s": 0.2, "image_timeout_s": 10.0, "warn_throttle_s": 0.0, **extra}
    return [Parameter(k, value=v) for k, v in values.items()]


class Running:
    """A planner node spinning in its own executor thread."""

    def __init__(self, context, name: str, params: list[Parameter]):
        self.node = PlannerNode(name, context=context, parameter_overrides=params)
        self.executor = MultiThreadedExecutor(num_threads=4, context=context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.node.stop_worker()
        self.executor.shutdown()
        self.thread.join(10.0)
        self.node.destroy_node()


@pytest.fixture(scope="module")
def context():
    with ros_context(1) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def planner(context, tiny_checkpoint):
    running = Running(context, NAME, overrides(tiny_checkpoint))
    yield running.node
    running.stop()


@pytest.fixture(scope="module")
def probe(context, planner):
    probe = Probe("/" + NAME, context=context).start()
    assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), FIRST_ANSWER_S), probe.messages("status")
    assert probe.wait_for(lambda: planner._active, 30.0)
    # wait until the planner's subscriptions see the probe (discovery), then start clean
    probe.wait_for(lambda: probe.count_subscribers(probe.topic("~/input/image")) > 0, 10.0)
    yield probe
    probe.stop()


def frame_stamp(probe: Probe) -> int:
    """A stamp of now, returned once the odometry stream has passed it."""
    stamp = probe.now_ns()
    time.sleep(0.06)           # the 20 Hz odometry stream now holds a sample at or after the stamp
    return stamp


def send_frame(probe: Probe, **kwargs) -> int:
    """Publish one image stamped now (after the odometry stream has passed that time); returns the stamp."""
    stamp = frame_stamp(probe)
    probe.image_pub.publish(image_msg(stamp, **kwargs))
    return stamp


def answer_for(probe: Probe, stamp: int, key: str = "trajectory", timeout_s: float = ANSWER_S):
    found = probe.wait_for(lambda: probe.with_stamp(key, stamp), timeout_s)
    assert found, f"no {key} with stamp {stamp}; diagnostics: {probe.diagnostic_values(DIAG)}"
    return found[-1]


def wait_counter(probe: Probe, key: str, at_least: int, timeout_s: float = 20.0) -> int:
    value = probe.wait_for(lambda: probe.counter(DIAG, key) >= at_least and probe.counter(DIAG, key), timeout_s)
    assert value, f"diagnostics never counted {key} >= {at_least}: {probe.diagnostic_values(DIAG)}"
    return value


def publish_until_counted(probe: Probe, publisher, make_msg: Callable[[], object], key: str,
                          timeout_s: float = 20.0) -> None:
    """Publish ``make_msg()`` until the diagnostics count ``key`` once more than before.

    Images and odometry travel best effort (as a camera driver's and the bridge's readers take
    them): one sample may be lost on a loaded machine, so a single publication is retried every
    second rather than taken as delivered.
    """
    before = probe.counter(DIAG, key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        publisher.publish(make_msg())
        if probe.wait_for(lambda: probe.counter(DIAG, key) > before, 1.0):
            return
    raise AssertionError(f"diagnostics never counted {key} > {before}: {probe.diagnostic_values(DIAG)}")


# ----------------------------------------------------------------------------- end to end
def test_bgra8_frame_odometry_and_command_answered_with_the_image_stamp(probe, planner):
    probe.command_pub.publish(String(data="LEFT"))           # a RoadOption name
    assert probe.wait_for(lambda: planner._inputs._tracker.command == "left", 10.0)
    stamp = send_frame(probe, encoding="bgra8", padding=8)
    traj = answer_for(probe, stamp)
    # the random tiny model does not answer with 16 numbers: an invalid trajectory, with its reason
    assert traj.header.frame_id == "ego_vehicle"             # the odometry's child frame
    assert traj.command == "left"
    assert not traj.valid and traj.invalid_reason and len(traj.points) == 0
    assert traj.stats.forwards > 0 and traj.stats.block_size == 32 and 0 < traj.stats.tokens <= 32
    assert traj.stats.retries == 1 and traj.stats.latency_ms > 0     # decoded again (parse_retry), still invalid
    dets = answer_for(probe, stamp, "detections")
    assert dets.header.frame_id == "camera"                  # the image's header, untouched
    debug = answer_for(probe, stamp, "debug_image")
    assert (debug.height, debug.width, debug.encoding) == (90, 160, "rgb8")
    markers = probe.wait_for(lambda: [m for m in probe.messages("markers")
                                      if stamp_ns(m.markers[0].header.stamp) == stamp], 5.0)
    assert markers and markers[-1].markers[0].action == markers[-1].markers[0].DELETE   # no plan line drawn
    assert probe.wait_for(lambda: probe.messages("processing_ms") and probe.messages("latency_ms"), 5.0)
    time.sleep(0.5)
    assert probe.with_stamp("path", stamp) == [] and probe.with_stamp("path_odom", stamp) == []
    assert wait_counter(probe, "plan_parse_failures", 1) >= 1
    assert wait_counter(probe, "answers_retried", 1) >= 1
    values = probe.diagnostic_values(DIAG)
    assert values["last_plan"].startswith("invalid") and values["model_state"] == "READY"
    # matched publishers per input: the probe's, and nobody's on camera_info
    assert all(int(values[f"{k}_publishers"]) >= 1 for k in ("image", "odometry", "route", "command"))
    assert values["camera_info_publishers"] == "0"
    # where the time went: on the latency topic (the image's header), in the trajectory, in diagnostics
    stages = probe.wait_for(lambda: probe.with_stamp("stage_times", stamp), 5.0)[-1]
    assert stages.header.frame_id == "camera" and stages.memory_kind in ("rss", "rss_since_start")
    parts = [stages.image_ms, stages.processor_ms, stages.vision_ms, stages.prefill_ms, stages.denoise_ms,
             stages.commit_ms, stages.parse_ms]
    assert all(p >= 0 for p in parts) and min(stages.image_ms, stages.vision_ms, stages.denoise_ms) > 0
    assert sum(parts) + stages.other_ms == pytest.approx(stages.total_ms, rel=1e-3)
    assert stages.total_ms >= traj.stats.latency_ms and stages.peak_memory_mb > 50
    assert traj.stats.stages.total_ms == stages.total_ms and traj.stats.stages.header.stamp == stages.header.stamp
    values = probe.wait_for(lambda: (probe.diagnostic_values(DIAG) or {}).get("stage_denoise_p50_ms")
                            and probe.diagnostic_values(DIAG), 5.0)
    assert float(values["stage_denoise_p50_ms"]) > 0 and float(values["peak_memory_mb"]) > 50


def test_valid_plan_publishes_paths_trajectory_boxes_and_debug_image(probe, planner, monkeypatch):
    """Only the decoder's tokens are replaced (by a well-formed answer); the policy parses them."""
    policy = planner._policy
    tokenizer = policy.loaded.tokenizer
    real_generate = policy.decoder.generate

    def generate(inputs, settings=None, generators=None, **rows):
        out = real_generate(inputs, settings, generators, **rows)   # the real decode cost and statistics
        answers = [ANSWER, BOXES][: len(out.sequences)]
        return DecodeOutput(sequences=[tokenizer.encode(a, add_special_tokens=False) for a in answers],
                            finished=[True] * len(answers), stats=out.stats)

    monkeypatch.setattr(policy.decoder, "generate", generate)
    calls = []
    real_step = policy.step
    monkeypatch.setattr(policy, "step", lambda frame, ego, command, **kw: calls.append((frame, ego, command))
                        or real_step(frame, ego, command, **kw))
    ego_x, ego_y, ego_yaw = 100.0, -20.0, math.radians(90.0)
    probe.odometry_pose.update(x=ego_x, y=ego_y, yaw=ego_yaw)
    probe.command_pub.publish(String(data="straight"))
    assert probe.wait_for(lambda: planner._inputs._tracker.command == "straight", 10.0)
    time.sleep(0.2)
    stamp = send_frame(probe, encoding="bgr8", padding=0, seed=3)

    traj = answer_for(probe, stamp)
    assert traj.valid and traj.invalid_reason == "" and traj.command == "straight"
    assert traj.stats.retries == 0                            # it parsed the first time
    frame, ego, command = calls[-1]
    sent = np.frombuffer(image_msg(stamp, encoding="bgr8", padding=0, seed=3).data, np.uint8).reshape(90, 160, 3)
    np.testing.assert_array_equal(frame, sent[:, :, ::-1])   # the model saw the frame as RGB
    assert ego.velocity == pytest.approx((5.0, 0.0)) and ego.acceleration == pytest.approx((0.0, 0.0), abs=1e-6)
    np.testing.assert_allclose([(p.x, p.y) for p in traj.points], WAYPOINTS)
    assert [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in traj.points] == \
        pytest.approx([0.5 * (k + 1) for k in range(8)])

    path = answer_for(probe, stamp, "path")
    assert path.header.frame_id == "ego_vehicle" and len(path.poses) == 8
    assert [stamp_ns(p.header.stamp) - stamp for p in path.poses] == [500_000_000 * (k + 1) for k in range(8)]
    np.testing.assert_allclose([(p.pose.position.x, p.pose.position.y) for p in path.poses], WAYPOINTS)

    path_odom = answer_for(probe, stamp, "path_odom")
    assert path_odom.header.frame_id == "map"
    expected = ego_to_world(WAYPOINTS, (ego_x, ego_y), ego_yaw)
    np.testing.assert_allclose([(p.pose.position.x, p.pose.position.y) for p in path_odom.poses], expected,
                               atol=1e-6)

    # Autoware's trajectory: the odometry frame, the image stamp, a point every 0.1 s from the ego at its
    # measured speed (5 m/s), speed and acceleration finite and within the profile's limits
    aw = answer_for(probe, stamp, "autoware_trajectory")
    limits = params.profile_limits(params.DEFAULTS)
    assert aw.header.frame_id == "map" and len(aw.points) == 41
    t = np.array([p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in aw.points])
    np.testing.assert_allclose(np.diff(t), 0.1, atol=1e-6)
    first = aw.points[0]
    assert t[0] == 0 and (first.pose.position.x, first.pose.position.y) == pytest.approx((ego_x, ego_y))
    assert first.longitudinal_velocity_mps == pytest.approx(5.0)
    assert 2 * math.atan2(first.pose.orientation.z, first.pose.orientation.w) == pytest.approx(ego_yaw, abs=0.2)
    speed = np.array([p.longitudinal_velocity_mps for p in aw.points])
    accel = np.array([p.acceleration_mps2 for p in aw.points])
    assert np.isfinite(speed).all() and np.isfinite(accel).all() and (speed >= 0).all()
    assert (accel <= limits.max_accel_mps2 + 1e-4).all() and (accel >= -limits.max_decel_mps2 - 1e-4).all()
    xy = np.array([(p.pose.position.x, p.pose.position.y) for p in aw.points])
    assert (np.hypot(*np.diff(xy, axis=0).T) <= 0.1 * np.maximum(speed[1:], speed[:-1]) + 1e-3).all()
    # the package's trajectory carries the heading and the plan's own speed at each waypoint
    assert [p.heading for p in traj.points] == pytest.approx(list(path_headings(WAYPOINTS)))
    assert all(p.speed > 0 for p in traj.points)

    vision = answer_for(probe, stamp, "vision_detections")
    assert vision.header.frame_id == answer_for(probe, stamp, "detections").header.frame_id
    assert len(vision.detections) == 1
    hypothesis = vision.detections[0].results[0].hypothesis
    assert hypothesis.class_id == "car" and vision.detections[0].bbox.size_x == pytest.approx(64.0)

    dets = answer_for(probe, stamp, "detections")
    assert dets.valid and len(dets.detections) == 1
    box = dets.detections[0]
    assert box.label == "car"
    # bbox_2d is on a 0..1000 scale of the image; the message is in source pixels (160 x 90)
    assert (box.x_min, box.y_min, box.x_max, box.y_max) == pytest.approx((16.0, 18.0, 80.0, 54.0))

    debug = answer_for(probe, stamp, "debug_image")
    drawn = np.frombuffer(debug.data, np.uint8).reshape(90, 160, 3)
    assert (drawn != sent[:, :, ::-1]).any(axis=2).sum() > 50       # path, box and text drawn on the RGB frame
    uv, visible = project_ego_points(np.c_[WAYPOINTS, np.zeros(8)], PinholeCamera.from_horizontal_fov(160, 90, 90.0),
                                     CameraMount(x_m=2.0, z_m=2.0))
    u, v = np.round(uv[visible][-1]).astype(int)
    r, g, b = drawn[v, u]
    assert g > 200 and r < 80 and b < 80, "the last visible waypoint is drawn in the plan colour"

    markers = probe.wait_for(lambda: [m for m in probe.messages("markers")
                                      if stamp_ns(m.markers[0].header.stamp) == stamp], 5.0)
    line = markers[-1].markers[0]
    assert line.action == line.ADD and len(line.points) == 9 and line.header.frame_id == "ego_vehicle"
    wait_counter(probe, "plans_valid", 1)
    probe.odometry_pose.update(x=0.0, y=0.0, yaw=0.0)


def test_route_gives_the_command_when_no_command_overrides(probe, planner):
    probe.command_pub.publish(String(data="auto"))              # back to the route
    probe.wait_for(lambda: planner._inputs._tracker.command is None, 10.0)
    # a route turning right 15 m ahead of the ego at the origin, facing +x
    theta = np.linspace(0.0, math.pi / 2, 15)
    route = np.concatenate([np.c_[np.arange(-5.0, 15.0, 1.0), np.zeros(20)],
                            np.c_[15 + 10 * np.sin(theta), -10 * (1 - np.cos(theta))],
                            np.c_[np.full(20, 25.0), -10.0 - np.arange(1.0, 21.0)]])
    probe.route_pub.publish(route_msg(route))
    probe.wait_for(lambda: planner._inputs._tracker.route_xy is not None, 10.0)
    stamp = send_frame(probe)
    assert answer_for(probe, stamp).command == "right"


# ----------------------------------------------------------------------------- keep-latest
def test_30hz_burst_processes_the_newest_frame_and_drops_the_rest(probe, planner):
    dropped_before = probe.counter(DIAG, "images_dropped_newer_arrived")
    stamps = []
    for k in range(60):                                        # 2 s at 30 Hz
        stamp = probe.now_ns()
        probe.image_pub.publish(image_msg(stamp, seed=k))
        stamps.append(stamp)
        time.sleep(1 / 30)
    answer_for(probe, stamps[-1])                              # the newest frame is always answered
    time.sleep(0.5)
    answered = sorted(stamp_ns(t.header.stamp) for t in probe.messages("trajectory")
                      if stamp_ns(t.header.stamp) in set(stamps))
    assert len(answered) < len(stamps) // 2, f"{len(answered)} of {len(stamps)} frames decoded: frames were queued"
    order = [stamp_ns(t.header.stamp) for t in probe.messages("trajectory")
             if stamp_ns(t.header.stamp) in set(stamps)]
    assert order == sorted(order), "an older frame was answered after a newer one"
    assert order[-1] == stamps[-1]
    wait_counter(probe, "images_dropped_newer_arrived", dropped_before + 1)


# ----------------------------------------------------------------------------- bad inputs
BAD_IMAGES = {
    "skipped_image_unsupported_encoding": dict(encoding="yuv422"),
    "skipped_image_empty": dict(height=0, width=0, data=b"", step=0),
    "skipped_image_size_mismatch": dict(data_extra=5),
    "skipped_image_bad_step": dict(step_minus=4),
    "skipped_image_stale": dict(age_s=60.0),
}


def bad_image(stamp: int, kind: dict):
    msg = image_msg(stamp - int(kind.get("age_s", 0.0) * 1e9))
    if "encoding" in kind:
        msg.encoding = kind["encoding"]
    if "height" in kind:
        msg.height, msg.width, msg.step, msg.data = kind["height"], kind["width"], kind["step"], kind["data"]
    if "data_extra" in kind:
        msg.data = bytes(msg.data) + bytes(kind["data_extra"])
    if "step_minus" in kind:                                   # rows shorter than width x 4, data consistent
        msg.step = msg.width * 4 - kind["step_minus"]
        msg.data = bytes(msg.step * msg.height)
    return msg


def test_every_bad_input_is_skipped_counted_and_the_node_survives(probe, planner):
    probe.command_pub.publish(String(data="left"))
    assert probe.wait_for(lambda: planner._inputs._tracker.command == "left", 10.0)
    for counter, kind in BAD_IMAGES.items():
        stamp = frame_stamp(probe)
        publish_until_counted(probe, probe.image_pub, lambda: bad_image(stamp, kind), counter)
        assert probe.with_stamp("trajectory", stamp) == []

    # NaN odometry, an inf route point, a command that is no command
    publish_until_counted(probe, probe.odometry_pub, lambda: odometry_msg(probe.now_ns(), vx=float("nan")),
                          "skipped_odometry_non_finite")
    # odometry late by 0.5 s is refused; 10 s back is a new run (a replay restarted): the history starts over
    publish_until_counted(probe, probe.odometry_pub, lambda: odometry_msg(probe.now_ns() - 500_000_000),
                          "skipped_odometry_out_of_order")
    publish_until_counted(probe, probe.odometry_pub, lambda: odometry_msg(probe.now_ns() - 10_000_000_000),
                          "odometry_time_resets")
    before = probe.counter(DIAG, "skipped_route_non_finite")
    probe.route_pub.publish(route_msg([(0.0, 0.0), (float("inf"), 1.0)]))
    wait_counter(probe, "skipped_route_non_finite", before + 1)
    before = probe.counter(DIAG, "skipped_command_invalid")
    probe.command_pub.publish(String(data="banana"))
    wait_counter(probe, "skipped_command_invalid", before + 1)

    # odometry that stopped: frames are skipped rather than planned with an old ego state
    probe.odometry_on.clear()
    time.sleep(1.0)
    stamp = probe.now_ns()
    publish_until_counted(probe, probe.image_pub, lambda: image_msg(stamp), "skipped_odometry_stale")
    probe.odometry_on.set()
    assert probe.with_stamp("trajectory", stamp) == []

    # still alive and answering, and the bad command left the previous one in place
    stamp = send_frame(probe)
    assert answer_for(probe, stamp).command == "left"
    assert probe.state() == "active"


def test_a_frame_over_the_image_size_limit_is_skipped_before_it_is_decoded(probe, planner):
    """image.max_decoded_pixels / _bytes apply live; a larger frame is counted, never planned."""
    assert planner.set_parameters([Parameter("image.max_decoded_pixels", value=160 * 90 - 1)])[0].successful
    try:
        stamp = frame_stamp(probe)
        publish_until_counted(probe, probe.image_pub, lambda: image_msg(stamp), "skipped_image_too_large")  # 160x90
        assert probe.with_stamp("trajectory", stamp) == []
    finally:
        assert planner.set_parameters([Parameter("image.max_decoded_pixels", value=params.DEFAULTS[
            "image.max_decoded_pixels"])])[0].successful
    assert answer_for(probe, send_frame(probe)).header.stamp      # the default lets it through again
    result = planner.set_parameters([Parameter("image.max_decoded_bytes", value=0)])[0]
    assert not result.successful and "image.max_decoded_bytes" in result.reason


def test_large_raw_frames_on_best_effort_warn_once(planner, capfd):
    from wam_diff2_ros.planner.interface import LARGE_RAW_FRAME_BYTES
    planner._image_qos_warned = False
    small, large = image_msg(0), image_msg(0, height=450, width=800)     # 1.4 MB bgra8
    assert len(small.data) < LARGE_RAW_FRAME_BYTES < len(large.data)
    planner._check_image_qos(small, planner._settings)
    assert not planner._image_qos_warned
    for _ in range(3):
        planner._check_image_qos(large, planner._settings)
    err = capfd.readouterr().err
    assert err.count("on best-effort image QoS") == 1 and "image_reliability: reliable" in err


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name, value, fragment", [
    ("decoding.block_size", 0, "block_size"),
    ("decoding.remasking_strategy", "random", "remasking_strategy"),
    ("decoding.top_p", 0.0, "top_p"),
    ("mode", "fast", "mode"),
    ("camera.horizontal_fov_deg", 0.0, "horizontal_fov_deg"),
    ("image_timeout_s", "soon", "type"),
    ("model_path", "/elsewhere", "configure"),                # needs a reload: refused while loaded
    ("tasks", "detect", "configure"),
    ("autostart", False, "read-only"),
])
def test_bad_parameter_values_are_rejected_with_a_reason(planner, name, value, fragment):
    before = read_all(planner, params.SPECS)[name]      # decoding.*: None (unset)
    result = planner.set_parameters([Parameter(name, value=value)])[0]
    assert not result.successful and fragment in result.reason
    assert read_all(planner, params.SPECS)[name] == before


def test_set_parameters_service_rejects_and_live_values_apply(probe, planner):
    from rcl_interfaces.srv import SetParameters
    client = probe.create_client(SetParameters, f"/{NAME}/set_parameters")
    request = SetParameters.Request(parameters=[Parameter("lockstep_every_n_images", value=0).to_parameter_msg()])
    result = probe.call(client, request).results[0]
    assert not result.successful and "lockstep_every_n_images" in result.reason

    request = SetParameters.Request(parameters=[Parameter("decoding.max_new_tokens", value=8).to_parameter_msg()])
    assert probe.call(client, request).results[0].successful
    stamp = send_frame(probe)
    assert 0 < answer_for(probe, stamp).stats.tokens <= 8        # applied at the next frame, no reload
    assert planner.set_parameters([Parameter("decoding.max_new_tokens", value=32)])[0].successful


def test_an_image_ahead_of_its_odometry_waits_for_it_up_to_odometry_wait_s(probe, planner):
    """The probe's odometry stream is stamped now; an image stamped 0.3 s ahead needs 0.3 s of it."""
    changed = ("odometry_wait_s", "image_timeout_s", "odometry_timeout_s")
    before = [Parameter(name, value=planner.get_parameter(name).value) for name in changed]
    try:
        assert planner.set_parameters([Parameter("odometry_wait_s", value=2.0)])[0].successful
        expired = probe.counter(DIAG, "odometry_wait_expired")
        stamp = probe.now_ns() + 300_000_000
        probe.image_pub.publish(image_msg(stamp))
        answer_for(probe, stamp)
        time.sleep(0.5)                                          # a diagnostics period
        assert probe.counter(DIAG, "odometry_wait_expired") == expired          # waited, then planned
        # 5 s ahead: on a loaded machine the node may reach a 0.3 s lead only once odometry has caught up
        assert all(r.successful for r in planner.set_parameters([
            Parameter("odometry_wait_s", value=0.0), Parameter("image_timeout_s", value=10.0),
            Parameter("odometry_timeout_s", value=10.0)]))
        stamp = probe.now_ns() + 5_000_000_000
        probe.image_pub.publish(image_msg(stamp))
        answer_for(probe, stamp)                                 # planned at once with the newest odometry
        wait_counter(probe, "odometry_wait_expired", expired + 1)
    finally:
        planner.set_parameters(before)                         # the fixture's values, not the defaults


def test_lockstep_mode_plans_on_every_nth_image(probe, planner):
    assert planner.set_parameters([Parameter("mode", value="lockstep"),
                                   Parameter("lockstep_every_n_images", value=3)])[0].successful
    try:
        skipped_before = probe.counter(DIAG, "images_skipped_lockstep")
        stamps = []
        for k in range(6):                                      # images 0..5: 0 and 3 are planned
            stamps.append(send_frame(probe, seed=k))
            time.sleep(0.6)                                     # slow enough that none is dropped as older
        answer_for(probe, stamps[3])
        time.sleep(0.5)
        answered = [s for s in stamps if probe.with_stamp("trajectory", s)]
        assert answered == [stamps[0], stamps[3]]
        wait_counter(probe, "images_skipped_lockstep", skipped_before + 4)
    finally:
        planner.set_parameters([Parameter("mode", value="realtime")])


# ----------------------------------------------------------------------------- lifecycle
def test_lifecycle_transitions_stop_start_and_free_the_model(probe, planner, tiny_checkpoint):
    assert probe.state() == "active"
    assert probe.transition("deactivate") and probe.state() == "inactive"
    probe.clear("trajectory")
    stamp = send_frame(probe)
    time.sleep(1.5)
    assert probe.with_stamp("trajectory", stamp) == [], "an inactive node must not plan"

    assert probe.transition("activate") and probe.state() == "active"
    answer_for(probe, send_frame(probe))

    assert probe.transition("deactivate") and probe.transition("cleanup")
    assert probe.state() == "unconfigured" and planner._policy is None
    assert probe.wait_for(lambda: probe.messages("status")[-1].state == PlannerStatus.UNCONFIGURED, 5.0)

    # unconfigured: reload parameters are settable now; a bad checkpoint fails configure
    assert planner.set_parameters([Parameter("model_path", value="/nonexistent/ckpt")])[0].successful
    probe.clear()
    assert not probe.transition("configure")
    assert probe.state() == "unconfigured"                     # alive, answering lifecycle queries
    status = probe.wait_for(lambda: probe.with_status(PlannerStatus.ERROR), 5.0)
    assert status and "/nonexistent/ckpt" in status[-1].message
    diag = probe.wait_for(lambda: (probe.diagnostic_values(DIAG) or {}).get("__level__") == 2
                          and probe.diagnostic_values(DIAG), 5.0)
    assert diag and "nonexistent" in diag["__message__"]
    stamp = send_frame(probe)
    time.sleep(1.5)
    published = {k: v for k, v in probe.received.items() if k not in ("status", "diagnostics") and v}
    assert published == {}, f"an errored node published {list(published)}"

    # a late subscriber still gets the latched ERROR status
    late = Node("late_status_listener", context=probe.context)
    got = []
    late.create_subscription(PlannerStatus, f"/{NAME}/status", got.append, LATCHED_QOS)
    executor = SingleThreadedExecutor(context=probe.context)
    executor.add_node(late)
    deadline = time.monotonic() + 10.0
    while not got and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.1)
    executor.shutdown()
    late.destroy_node()
    assert got and got[-1].state == PlannerStatus.ERROR

    # fixed: configure and activate again
    assert planner.set_parameters([Parameter("model_path", value=str(tiny_checkpoint))])[0].successful
    assert probe.transition("configure") and probe.transition("activate")
    assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), 5.0)
    answer_for(probe, send_frame(probe))


def test_bad_model_path_at_start_leaves_an_error_node_that_publishes_nothing(context, tmp_path):
    bad = Running(context, "bad_planner", overrides(tmp_path / "missing"))
    watcher = Probe("/bad_planner", name="bad_probe", context=context).start()
    try:
        status = watcher.wait_for(lambda: watcher.with_status(PlannerStatus.ERROR), 60.0)
        assert status and "missing" in status[-1].message
        diag = watcher.wait_for(lambda: (watcher.diagnostic_values("bad_planner") or {}).get("__level__") == 2
                                and watcher.diagnostic_values("bad_planner"), 10.0)
        assert diag and diag["model_state"] == "ERROR"
        assert watcher.state() == "unconfigured"
        for _ in range(3):
            watcher.image_pub.publish(image_msg(watcher.now_ns()))
            time.sleep(0.5)
        published = {k: len(v) for k, v in watcher.received.items() if k not in ("status", "diagnostics") and v}
        assert published == {}, f"an errored node published {published}"
    finally:
        watcher.stop()
        bad.stop()


def test_refused_startup_values_fail_configure_with_the_reason(context, tiny_checkpoint):
    node = PlannerNode("refusing_planner", context=context, parameter_overrides=overrides(
        tiny_checkpoint, autostart=False, **{"decoding.block_size": 0, "mode": "fast"}))
    try:
        assert read_all(node, params.SPECS)["decoding.block_size"] is None     # declared unset instead
        assert node.trigger_configure() != TransitionCallbackReturn.SUCCESS
        assert node._model_state == PlannerStatus.ERROR
        assert "decoding.block_size" in node._model_message and "mode" in node._model_message
        # once fixed, configure works
        assert node.set_parameters([Parameter("mode", value="realtime"),
                                    Parameter("decoding.block_size", value=32)])[0].successful
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node._policy is not None
    finally:
        node.destroy_node()


@pytest.mark.parametrize("block_size, error", [(0, "block_size: 0 is below 1"),
                                               ("32", "block_size: expected int, got '32'"),
                                               ("abc", "block_size: expected int, got 'abc'"),
                                               (1025, "block_size: 1025 is above 1024")])
def test_bad_checkpoint_settings_leave_the_node_unconfigured_with_the_error_infer_gives(
        context, tiny_checkpoint, tmp_path, capfd, block_size, error):
    """diffusion_config.json is validated by the one loader infer uses: the node stays unconfigured
    with an ERROR (status, diagnostics, log) naming the file and the field, and plans nothing."""
    import json
    import shutil

    from wam_diff2_core.config import ConfigError
    from wam_diff2_core.model.checkpoint import load_checkpoint
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    settings = json.loads((ckpt / "diffusion_config.json").read_text())
    (ckpt / "diffusion_config.json").write_text(json.dumps({**settings, "block_size": block_size}))
    with pytest.raises(ConfigError) as infer_error:             # what `wam-diff2 infer` prints
        load_checkpoint(ckpt, device="cpu")
    assert str(infer_error.value) == f"{ckpt / 'diffusion_config.json'}: {error}"
    node = PlannerNode("bad_settings_planner", context=context, parameter_overrides=overrides(ckpt, autostart=False))
    try:
        assert node.trigger_configure() != TransitionCallbackReturn.SUCCESS
        assert node._model_state == PlannerStatus.ERROR and node._policy is None
        assert node._lifecycle == "unconfigured"
        assert node._model_message.endswith(str(infer_error.value))
        status = node.diagnostic_status()
        assert status.level == status.ERROR and str(infer_error.value) in status.message
        assert f"configure failed: cannot load '{ckpt}': {infer_error.value}" in capfd.readouterr().err
    finally:
        node.destroy_node()


def test_autostart_false_waits_for_transitions_then_plans_on_compressed_frames(context, tiny_checkpoint):
    import cv2
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage

    manual = Running(context, "manual_planner", overrides(tiny_checkpoint, autostart=False,
                                                          image_transport="compressed", tasks="plan"))
    probe = Probe("/manual_planner", name="manual_probe", context=context).start()
    compressed_pub = probe.create_publisher(CompressedImage, "/manual_planner/input/image/compressed",
                                            qos_profile_sensor_data)
    try:
        assert probe.wait_for(lambda: probe.with_status(PlannerStatus.UNCONFIGURED), 30.0)
        time.sleep(1.0)
        assert probe.state() == "unconfigured" and manual.node._policy is None
        assert probe.transition("configure") and probe.transition("activate")
        assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), 10.0)
        rgb = np.zeros((48, 64, 3), np.uint8)
        rgb[:, :32] = (200, 30, 30)
        ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        assert ok
        for _ in range(5):            # resend if the first frame raced discovery
            stamp = probe.now_ns()
            time.sleep(0.06)
            compressed_pub.publish(CompressedImage(header=image_msg(stamp).header, format="png", data=png.tobytes()))
            if probe.wait_for(lambda: probe.with_stamp("trajectory", stamp), 15.0):
                break
        assert probe.with_stamp("trajectory", stamp), probe.diagnostic_values("manual_planner")
        debug = answer_for(probe, stamp, "debug_image")
        assert (debug.height, debug.width) == (48, 64)
        before = probe.counter("manual_planner", "skipped_image_decode_failed")
        compressed_pub.publish(CompressedImage(header=image_msg(probe.now_ns()).header, format="jpeg",
                                               data=b"\xff\xd8 not a jpeg"))
        assert probe.wait_for(lambda: probe.counter("manual_planner", "skipped_image_decode_failed") > before, 20.0)
        # a 20000 x 20000 PNG (48 KB) is refused from its header: it once decoded to 2.4 GB (8.2 GiB node peak)
        from test.support.hostile_data import huge_png
        before = probe.counter("manual_planner", "skipped_image_too_large")
        for _ in range(5):            # best effort: resend until one arrives
            compressed_pub.publish(CompressedImage(header=image_msg(probe.now_ns()).header, format="png",
                                                   data=huge_png()))
            if probe.wait_for(lambda: probe.counter("manual_planner", "skipped_image_too_large") > before, 10.0):
                break
        assert probe.counter("manual_planner", "skipped_image_too_large") > before
        assert manual.node.counts().get("worker_errors", 0) == 0
    finally:
        probe.stop()
        manual.stop()


def test_a_fast_path_that_diverges_at_warm_up_falls_back_to_plain_with_a_warning(
        context, tiny_checkpoint, monkeypatch, capfd):
    """At configure the warm-up prompt is decoded by the fast path (auto: static on CPU) and by the plain
    decoder; a forced divergence of one token makes the node decode with plain, warn naming the
    divergence, and report it in /diagnostics (WARN)."""
    from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
    from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
    real = StaticBlockDiffusionDecoder.generate

    def perturbed(self, *args, **kwargs):          # the test hook: the fast path's first token is off by one
        out = real(self, *args, **kwargs)
        out.sequences[0][:1] = [out.sequences[0][0] + 1] if out.sequences[0] else [7]
        return out
    monkeypatch.setattr(StaticBlockDiffusionDecoder, "generate", perturbed)
    node = PlannerNode("diverging_planner", context=context,
                       parameter_overrides=overrides(tiny_checkpoint, autostart=False, warmup=True))
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert isinstance(node._policy.decoder, BlockDiffusionDecoder)
        assert node._policy.engine.implementation == "plain"
        err = capfd.readouterr().err
        assert "fast path (static (sdpa)) diverges from the plain decoder on the warm-up prompt" in err
        assert "first difference in answer 0 at token 0" in err and "decoder: plain" in err
        values = {kv.key: kv.value for kv in node.diagnostic_status().values}
        assert values["decoder"] == "plain" and values["fast_path_check"].startswith("fell back: fast path")
        # how long configure took, and where (issue 30: start-up is bounded and reported)
        parts = [float(values[k]) for k in ("load_s", "fast_path_check_s", "warmup_s")]
        assert all(v > 0 for v in parts) and float(values["configure_s"]) >= sum(parts) - 0.02
        assert re.search(r"configured in \d+\.\d s \(load \d+\.\d s, fast path check \d+\.\d s, warmup "
                         r"\d+\.\d s\)", err), err[-2000:]
        node.trigger_activate()
        status = node.diagnostic_status()
        assert status.level == status.WARN and "fast path fell back to the plain decoder" in status.message
    finally:
        node.stop_worker()
        node.destroy_node()


def test_the_fast_path_that_agrees_at_warm_up_stays(probe, planner):
    values = {kv.key: kv.value for kv in planner.diagnostic_status().values}
    assert values["decoder"] == "static (sdpa)" and values["fast_path_check"] == "passed"


def test_frames_far_from_the_checkpoints_camera_are_counted_and_warned_about(context, tiny_checkpoint, tmp_path,
                                                                               capfd):
    """A checkpoint whose camera block says 1600 x 900 sees the 160 x 90 test frames: planned anyway, but
    counted (frames_off_camera on /diagnostics) and warned about, naming both sizes."""
    import json
    import shutil
    ckpt = tmp_path / "b2d_camera"
    shutil.copytree(tiny_checkpoint, ckpt)
    stored = json.loads((ckpt / "diffusion_config.json").read_text())
    stored["camera"] = {"width": 1600, "height": 900, "fov_deg": 70.0, "x_m": 0.8, "y_m": 0.0, "z_m": 1.6}
    (ckpt / "diffusion_config.json").write_text(json.dumps(stored))
    running = Running(context, "camera_planner", overrides(ckpt, tasks="plan", warmup=False))
    probe = Probe("/camera_planner", name="camera_probe", context=context).start()
    try:
        assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), FIRST_ANSWER_S)
        for _ in range(5):            # resend if the first frame raced discovery
            stamp = send_frame(probe)
            if probe.wait_for(lambda: probe.with_stamp("trajectory", stamp), 30.0):
                break
        assert probe.wait_for(lambda: probe.counter("camera_planner: planner", "frames_off_camera") >= 1, 20.0)
        assert "frame 160x90 is far from the checkpoint's camera 1600x900" in capfd.readouterr().err
    finally:
        probe.stop()
        running.stop()
