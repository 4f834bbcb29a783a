"""The planner node's pure pieces without a node or DDS: its typed settings, its diagnostics from a
snapshot, its debug image and the messages of a decoded frame."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wam_diff2_core.decoding.decoder import DecodeStats  # noqa: E402
from wam_diff2_core.frame_inputs import OFF_ROUTE, STALE_ODOMETRY, FrameInputs, InputSkip  # noqa: E402
from wam_diff2_core.geometry import CameraMount, EgoSample, PinholeCamera  # noqa: E402
from wam_diff2_core.params import planner as params  # noqa: E402
from wam_diff2_core.policy import PolicyOutput, TaskResult  # noqa: E402
from wam_diff2_ros import conversions as conv  # noqa: E402
from wam_diff2_ros.planner.debug_image import debug_camera, plan_debug_image, plan_pixels, status_line  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.planner.diagnostics import (FAST_PATH_FELL_BACK, EventRate, LastPlan,  # noqa: E402
                                               PlannerSnapshot, diagnostic_values, planner_diagnostic_status)
from wam_diff2_ros.planner.interface import OUTPUT_TOPICS, autoware_msgs  # noqa: E402
from wam_diff2_ros.planner.outputs import frame_messages  # noqa: E402
from wam_diff2_ros.planner.inputs import frame_image  # noqa: E402
from wam_diff2_ros.planner.monitor import PlannerMonitor  # noqa: E402
from wam_diff2_ros.planner.settings import PlannerSettings, policy_arguments, rejected_change  # noqa: E402

pytestmark = pytest.mark.ros
NS = 1_000_000_000
SETTINGS = PlannerSettings.from_values(params.DEFAULTS)


# ----------------------------------------------------------------------------- settings
def test_settings_are_the_core_settings_of_the_values():
    values = {**params.DEFAULTS, "decoding.block_size": 8, "camera.z_m": 1.5, "image.max_decoded_pixels": 1000}
    settings = PlannerSettings.from_values(values)
    assert settings.inputs == params.input_settings(values)
    assert settings.image_limits == params.image_limits(values) and settings.image_limits.max_decoded_pixels == 1000
    assert settings.profile_limits == params.profile_limits(values)
    assert settings.decoding_overrides == {"block_size": 8}
    assert settings.camera_mount == CameraMount(2.0, 0.0, 1.5, 0.0, 0.0, 0.0)
    assert settings["debug.publish_image"] is values["debug.publish_image"]


def test_settings_with_changed_values_are_a_new_object():
    lockstep = SETTINGS.with_values({"mode": "lockstep", "lockstep_every_n_images": 4, "route.lookahead_m": 45.0})
    assert SETTINGS["mode"] == "realtime" and lockstep["mode"] == "lockstep"
    assert lockstep.inputs.route.lookahead_m == 45.0 != SETTINGS.inputs.route.lookahead_m


def test_policy_arguments_are_the_core_settings_of_the_configure_values():
    values = {**params.DEFAULTS, "model_path": "ckpt", "tasks": "both", "image.max_pixels": 0,
              "decoding.block_size": 8, "detection_every_n_frames": 5}
    model = policy_arguments(values)
    assert model["tasks"] == ("plan", "detect") and model["max_pixels"] is None and model["path"] == "ckpt"
    assert model["detection_every_n_frames"] == 5
    assert model["engine"] == params.engine_settings(values)
    assert model["candidates"] == params.candidate_settings(values)
    assert model["overrides"] == {"block_size": 8}


def test_the_loaded_policy_has_the_configured_tasks_and_detection_schedule(tiny_checkpoint):
    from wam_diff2_ros.planner.policy import PolicyLoad, load_policy
    values = {**params.DEFAULTS, "model_path": str(tiny_checkpoint), "tasks": "both", "detection_every_n_frames": 4,
              "warmup": False, "device": "cpu"}
    logger = SimpleNamespace(info=lambda _: None, warn=lambda _: None)
    policy = load_policy(values, logger, PolicyLoad())
    assert policy.tasks == ("plan", "detect") and policy.detection_every_n_frames == 4


def test_a_change_is_refused_with_its_reason():
    values = SETTINGS.values
    assert rejected_change(values, {"mode": "lockstep"}, None) is None
    assert "mode" in rejected_change(values, {"mode": "fast"}, None)
    reason = rejected_change(values, {"model_path": "other"}, "active")
    assert reason.startswith("model_path is applied on configure") and "(active)" in reason
    assert rejected_change(values, {"model_path": "other"}, None) is None
    assert SETTINGS.configure_errors() == ["model_path: empty; set it to a checkpoint directory"]


def test_a_stale_image_is_skipped_before_decoding():
    msg = SimpleNamespace(header=Header(stamp=conv.ns_to_stamp(10 * NS)))
    with pytest.raises(InputSkip) as skip:
        frame_image(msg, 11 * NS + 1, SETTINGS.with_values({"image_timeout_s": 1.0}))
    assert skip.value.code == "image_stale" and "image_timeout_s 1.0" in skip.value.message


# ----------------------------------------------------------------------------- counters
class Logger:
    def __init__(self):
        self.warnings = []

    def warning(self, message):
        self.warnings.append(message)


def test_monitor_counts_every_skip_and_warns_once_per_throttle():
    logger = Logger()
    monitor = PlannerMonitor(logger, warn_throttle_s=60.0)
    for _ in range(3):
        monitor.skip_input(InputSkip(STALE_ODOMETRY, "old"))
    monitor.command_defaulted(OFF_ROUTE, "far from the route")
    assert monitor.counts() == {"skipped_odometry_stale": 3, "route_off_route": 1}
    assert logger.warnings == ["skipped input (odometry_stale): old"]
    monitor.warn_throttle_s = 0.0
    monitor.skip("image_stale", "late")
    monitor.skip("image_stale", "late")
    assert len(logger.warnings) == 3


def test_monitor_snapshot_holds_the_last_frame():
    monitor = PlannerMonitor(Logger(), warn_throttle_s=1.0)
    monitor.image_received(99 * NS, now=10.0)
    result = TaskResult(valid=False, invalid_reason="bad json", raw_text="[", stats=STATS)
    monitor.frame_published(PolicyOutput(command="left", plan=result, detections=None, latency_ms=12.34), "left",
                            processing_ms=20.0, extra_stats={"candidates": 4}, now=10.5)
    taken = monitor.snapshot(11.0, now_ns=100 * NS, lifecycle="active", active=True, model_state=PlannerStatus.READY,
                             model_message="", odometry_ns=None, command_text="", route_points=0,
                             has_camera_info=False, decoder="plain", fast_path_check="passed")
    assert taken.image_ns == 99 * NS and taken.last_plan == LastPlan(False, "bad json", "left")
    assert taken.last_stats == {"forwards": 12, "denoise_steps": 10, "tokens": 40, "block_size": 32,
                                "policy_ms": 12.3, "processing_ms": 20.0, "candidates": 4}
    assert taken.counts == {"images_received": 1, "images_processed": 1, "plan_parse_failures": 1,
                            "answers_retried": 0}
    assert taken.received_hz == taken.processed_hz == 1 / 5.0


# ----------------------------------------------------------------------------- diagnostics
def snapshot(**changes) -> PlannerSnapshot:
    """An active planner with fresh inputs and a valid last plan, at t = 100 s."""
    base = PlannerSnapshot(now_ns=100 * NS, lifecycle="active", active=True, model_state=PlannerStatus.READY,
                           model_message="ckpt on cpu", image_ns=100 * NS - NS // 10, odometry_ns=100 * NS,
                           received_hz=10.0, processed_hz=2.5, command_text="left", route_points=3,
                           has_camera_info=False, last_plan=LastPlan(True, "", "left"), decoder="plain",
                           fast_path_check="passed", counts={"plans_valid": 4, "images_received": 9})
    return replace(base, **changes)


def test_an_active_planner_with_fresh_inputs_is_ok():
    status = planner_diagnostic_status("wam_diff2_planner", snapshot(), SETTINGS)
    values = {kv.key: kv.value for kv in status.values}
    assert (status.level, status.message, status.name) == (DiagnosticStatus.OK, "planning", "wam_diff2_planner: planner")
    assert values["image_age_s"] == "0.100" and values["odometry_age_s"] == "0.000"
    assert values["image_rate_hz"] == "10.00" and values["processed_rate_hz"] == "2.50"
    assert values["last_plan"] == "valid" and values["last_command"] == "left"
    assert values["model_state"] == "READY" and values["mode"] == "realtime" and values["camera_model"] == "fov"
    assert list(values)[-2:] == ["images_received", "plans_valid"]        # counts last, sorted


@pytest.mark.parametrize("changes, level, message", [
    ({"model_state": PlannerStatus.ERROR, "model_message": "no such file"}, DiagnosticStatus.ERROR,
     "model error: no such file"),
    ({"active": False, "lifecycle": "inactive"}, DiagnosticStatus.WARN, "not active (inactive): ckpt on cpu"),
    ({"image_ns": None, "odometry_ns": 90 * NS}, DiagnosticStatus.WARN, "no fresh image; no fresh odometry"),
    ({"last_plan": LastPlan(False, "no waypoints", "straight")}, DiagnosticStatus.WARN,
     "last plan invalid (no waypoints)"),
    ({"fast_path_check": FAST_PATH_FELL_BACK + "tokens differ"}, DiagnosticStatus.WARN,
     "fast path fell back to the plain decoder"),
])
def test_problems_set_the_level_and_the_summary(changes, level, message):
    status = planner_diagnostic_status("p", snapshot(**changes), SETTINGS)
    assert (status.level, status.message) == (level, message)


def test_diagnostic_values_name_an_invalid_plan_stages_and_publishers():
    stages = {"ms": {"decode": {"p50": 12.34, "p95": 20.0}}, "peak_memory_mb": None, "memory_kind": "rss",
              "frames": 7}
    values = diagnostic_values(snapshot(last_plan=LastPlan(False, "bad json", "right"), stages=stages,
                                        publisher_counts={"image": 1}, configure_times={"load_s": 1.234},
                                        last_stats={"tokens": 40}, image_ns=None),
                               SETTINGS.with_values({"mode": "lockstep", "lockstep_every_n_images": 5}))
    assert values["last_plan"] == "invalid: bad json" and values["last_command"] == "right"
    assert values["stage_decode_p50_ms"] == "12.3" and values["stage_decode_p95_ms"] == "20.0"
    assert values["peak_memory_mb"] == "0" and values["stage_frames"] == "7"
    assert values["image_publishers"] == "1" and values["load_s"] == "1.23" and values["last_tokens"] == "40"
    assert values["image_age_s"] == "never" and values["mode"] == "lockstep (every 5)"


def test_event_rate_counts_the_last_window():
    rate = EventRate(window_s=2.0)
    for t in (0.0, 0.5, 1.0, 2.5):
        rate.add(t)
    assert rate.hz(2.5) == 3 / 2.0           # 0.0 is more than 2 s old
    assert rate.hz(10.0) == 0.0


# ----------------------------------------------------------------------------- debug image
def plan(waypoints=None, valid=True, reason=""):
    return SimpleNamespace(waypoints=waypoints, valid=valid, invalid_reason=reason)


def test_status_line():
    assert status_line("left", "route", None) == "left (route)"
    assert status_line("left", "route", plan()) == "left (route) plan ok"
    assert status_line("left", "topic", plan(valid=False, reason="x" * 100)) == "left (topic) INVALID: " + "x" * 60


def test_debug_camera_prefers_camera_info_scaled_to_the_frame():
    assert debug_camera(800, 600, None, 90.0) == PinholeCamera.from_horizontal_fov(800, 600, 90.0)
    info = PinholeCamera(500.0, 500.0, 400.0, 300.0, 800, 600)
    assert debug_camera(800, 600, info, 90.0) is info
    assert debug_camera(400, 300, info, 90.0) == PinholeCamera(250.0, 250.0, 200.0, 150.0, 400, 300)


@pytest.mark.parametrize("n", [8, 3])
def test_plan_pixels_put_the_ego_origin_first_for_any_number_of_waypoints(n):
    camera = PinholeCamera.from_horizontal_fov(800, 600, 90.0)
    waypoints = np.stack([np.arange(1, n + 1) * 5.0, np.zeros(n)], axis=1)      # straight ahead
    pixels = plan_pixels(waypoints, camera, CameraMount(2.0, 0.0, 2.0))
    assert pixels.shape == (n + 1, 2)
    assert np.isnan(pixels[0]).all()                       # the origin is behind a camera 2 m forward
    assert np.allclose(pixels[1:, 0], camera.cx)           # on the centre column
    assert (np.diff(pixels[1:, 1]) < 0).all()              # farther points higher in the image


def test_plan_debug_image_draws_on_a_copy():
    rgb = np.zeros((60, 80, 3), np.uint8)
    camera = PinholeCamera.from_horizontal_fov(80, 60, 90.0)
    waypoints = np.stack([np.arange(1, 9) * 3.0, np.zeros(8)], axis=1)
    canvas = plan_debug_image(rgb, plan(waypoints), None, "straight (route) plan ok", camera, CameraMount(z_m=2.0))
    assert canvas.shape == rgb.shape and canvas.any() and not rgb.any()
    invalid = plan_debug_image(rgb, plan(waypoints, valid=False, reason="bad"), None, "x", camera, CameraMount())
    assert invalid.shape == rgb.shape


# ----------------------------------------------------------------------------- a frame's messages
STATS = DecodeStats(block_size=32, forwards=12, denoise_steps=10, commit_forwards=2, blocks=3, tokens=40,
                    prefill_ms=5.0, denoise_ms=20.0, commit_ms=2.0)


def messages(plan_result, odom_frame="odom", settings=SETTINGS):
    ego = EgoSample(10.0, x=50.0, y=20.0, yaw=0.0, vx=5.0, vy=0.0)
    inputs = FrameInputs(stamp_ns=10 * NS, ego=ego.motion(), command="left", command_source="route", odometry=ego)
    out = PolicyOutput(command="left", plan=plan_result, detections=None, latency_ms=12.0)
    header = Header(stamp=conv.ns_to_stamp(10 * NS), frame_id="camera")
    return list(frame_messages(header, np.zeros((60, 80, 3), np.uint8), inputs, "base_link", odom_frame, out,
                               settings, None))


def test_a_valid_plan_gives_every_output_in_publishing_order():
    waypoints = np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1)
    out = messages(TaskResult(valid=True, invalid_reason="", raw_text="...", stats=STATS, waypoints=waypoints))
    names = [name for name, _ in out]
    assert names == ["trajectory", "path", "path_odom", *(["autoware_trajectory"] if autoware_msgs else []),
                     "markers", "debug_image"]
    assert set(names) <= set(OUTPUT_TOPICS)
    message = dict(out)
    assert message["path_odom"].header.frame_id == "odom" and message["path"].header.frame_id == "base_link"
    assert message["path_odom"].poses[0].pose.position.x == 52.0          # placed with the ego pose
    assert message["debug_image"].header.frame_id == "camera"


def test_an_invalid_plan_or_switched_off_outputs_give_fewer_messages():
    invalid = TaskResult(valid=False, invalid_reason="invalid_json", raw_text="[", stats=STATS)
    assert [name for name, _ in messages(invalid)] == ["trajectory", "markers", "debug_image"]
    quiet = SETTINGS.with_values({"debug.publish_image": False, "debug.publish_markers": False,
                                  "publish_odom_frame_path": False})
    waypoints = np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1)
    valid = TaskResult(valid=True, invalid_reason="", raw_text="...", stats=STATS, waypoints=waypoints)
    assert [name for name, _ in messages(valid, odom_frame="", settings=quiet)] == ["trajectory", "path"]
