"""Pieces of the node without DDS: the keep-latest slot, the message conversions and the core input
tracker on rclpy messages."""
from __future__ import annotations

import math
import re
import threading
import time

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from sensor_msgs.msg import CameraInfo  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wam_diff2_core.decoding.decoder import DecodeStats  # noqa: E402
from wam_diff2_core.geometry import EgoSample, yaw_from_quaternion  # noqa: E402
from wam_diff2_core.frame_inputs import (BAD_ODOMETRY, BAD_ROUTE, FrameInputTracker, InputSettings,  # noqa: E402
                                         InputSkip, image_msg_to_rgb, stamp_ns)
from wam_diff2_core.outputs.parsing import Box  # noqa: E402
from wam_diff2_core.policy import TaskResult  # noqa: E402
from wam_diff2_ros import conversions as conv  # noqa: E402
from wam_diff2_ros.keep_latest import LatestSlot, LatestWorker  # noqa: E402
from wam_diff2_ros.spinning import wait_until  # noqa: E402
from test.support.ros_helpers import image_msg, odometry_msg, route_msg  # noqa: E402

pytestmark = pytest.mark.ros
STATS = DecodeStats(block_size=32, forwards=12, denoise_steps=10, commit_forwards=2, blocks=3, tokens=40,
                    prefill_ms=5.0, denoise_ms=20.0, commit_ms=2.0)
WAYPOINTS = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0], [3.0, 1.0], [4.0, 2.0], [5.0, 3.0], [6.0, 4.0], [7.0, 5.0]])


# ----------------------------------------------------------------------------- keep-latest
def test_slot_keeps_only_the_newest_and_reports_drops():
    slot = LatestSlot()
    assert slot.put(1) is False
    assert slot.put(2) is True and slot.put(3) is True      # 1 and 2 dropped, never queued
    assert slot.take(0.0) == 3
    assert slot.take(0.01) is None                          # empty after a take


def test_slot_wakes_a_waiting_worker_and_close_releases_it():
    slot = LatestSlot()
    got = []
    worker = threading.Thread(target=lambda: got.append(slot.take(5.0)))
    worker.start()
    time.sleep(0.05)
    slot.put("frame")
    worker.join(2.0)
    assert got == ["frame"]
    worker = threading.Thread(target=lambda: got.append(slot.take(30.0)))
    worker.start()
    slot.close()
    worker.join(2.0)
    assert not worker.is_alive() and got[-1] is None


def test_worker_processes_the_newest_survives_errors_and_stops():
    done, errors, entered, release = [], [], threading.Event(), threading.Event()

    def process(item):
        if item == "bad":
            raise ValueError(item)
        if item == "slow":
            entered.set()
            release.wait(5.0)
        done.append(item)

    worker = LatestWorker(process, lambda exc: errors.append(str(exc)) or True, name="test_worker")
    worker.start()
    for item in ("bad", "a"):
        worker.slot.put(item)
        assert wait_until(lambda: item in done + errors, 5.0)
    worker.slot.put("slow")
    assert entered.wait(5.0)
    worker.request_stop()
    assert worker.join(0.05) is False and worker.still_running() and worker.stopping()   # inside "slow"
    release.set()
    assert wait_until(lambda: not worker.still_running(), 5.0)
    assert done == ["a", "slow"] and errors == ["bad"]
    worker.slot.put("left over")                 # a restart begins on an empty slot, open again
    worker.start()
    worker.slot.put("b")
    assert wait_until(lambda: "b" in done, 5.0) and "left over" not in done
    worker.request_stop()
    assert worker.join(1.0)


# ----------------------------------------------------------------------------- inputs
def test_stamps_are_exact_nanoseconds():
    ns = 1_700_000_123_456_789_012
    assert stamp_ns(conv.ns_to_stamp(ns)) == ns
    d = conv.ns_to_duration(3 * conv.WAYPOINT_DT_NS)
    assert (d.sec, d.nanosec) == (1, 500_000_000)


def test_image_message_to_rgb_uses_step_and_encoding():
    msg = image_msg(0, height=2, width=3, encoding="bgra8", padding=3, seed=1)
    rows = np.frombuffer(msg.data, np.uint8).reshape(2, 15)[:, :12].reshape(2, 3, 4)
    np.testing.assert_array_equal(image_msg_to_rgb(msg), rows[:, :, [2, 1, 0]])


def test_the_core_input_tracker_reads_rclpy_odometry_and_routes():
    """The node hands rclpy messages to the core's tracker (the evaluator hands it rosbags ones)."""
    tracker = FrameInputTracker(InputSettings(acceleration_time_constant_s=0.0))
    sample = tracker.on_odometry(odometry_msg(2_500_000_000, x=3.0, y=-1.0, yaw=0.7, vx=4.0, vy=0.2, yaw_rate=-0.1))
    assert (sample.stamp_s, sample.x, sample.y, sample.vx, sample.vy) == (2.5, 3.0, -1.0, 4.0, 0.2)
    assert sample.yaw == pytest.approx(0.7)
    assert (tracker.odometry_frame, tracker.child_frame) == ("map", "ego_vehicle")
    sample = tracker.on_odometry(odometry_msg(2_600_000_000, vx=4.0, vy=0.2, yaw_rate=-0.1))
    assert (sample.ax, sample.ay) == pytest.approx((0.1 * 0.2, -0.1 * 4.0))    # centripetal only: omega x v
    for bad in (dict(x=math.inf), dict(vy=math.nan), dict(yaw_rate=math.nan)):
        with pytest.raises(InputSkip, match="non-finite") as err:
            tracker.on_odometry(odometry_msg(3_000_000_000, **bad))
        assert err.value.code == BAD_ODOMETRY
    zero_q = odometry_msg(3_000_000_000)
    zero_q.pose.pose.orientation.w = 0.0
    with pytest.raises(InputSkip, match="zero quaternion"):
        tracker.on_odometry(zero_q)
    np.testing.assert_array_equal(tracker.on_route(route_msg([(0, 0), (1, 2)])), [[0, 0], [1, 2]])
    with pytest.raises(InputSkip) as err:
        tracker.on_route(route_msg([(0, 0), (math.nan, 2)]))
    assert err.value.code == BAD_ROUTE and tracker.route_xy.tolist() == [[0, 0], [1, 2]]   # the previous one kept


def test_camera_info():
    info = CameraInfo(width=800, height=600, k=[400.0, 0.0, 400.0, 0.0, 410.0, 300.0, 0.0, 0.0, 1.0])
    cam = conv.camera_info_to_camera(info)
    assert (cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height) == (400.0, 410.0, 400.0, 300.0, 800, 600)
    with pytest.raises(ValueError):
        conv.camera_info_to_camera(CameraInfo(width=800, height=600))     # K all zero: uncalibrated


# ----------------------------------------------------------------------------- outputs
def test_paths_in_ego_and_odometry_frames():
    stamp = 10 * conv.NS_PER_S + 7
    ego = EgoSample(10.0, x=50.0, y=20.0, yaw=math.pi / 2, vx=5.0, vy=0.0)
    ego_path, odom_path = conv.plan_paths(stamp, "base_link", WAYPOINTS, "map", ego)
    assert ego_path.header.frame_id == "base_link" and odom_path.header.frame_id == "map"
    assert stamp_ns(ego_path.header.stamp) == stamp
    assert [stamp_ns(p.header.stamp) - stamp for p in odom_path.poses] == \
        [(k + 1) * 500_000_000 for k in range(8)]
    np.testing.assert_allclose([(p.pose.position.x, p.pose.position.y) for p in ego_path.poses], WAYPOINTS)
    # rotated by +90 deg and shifted: (x, y) -> (50 - y, 20 + x)
    np.testing.assert_allclose([(p.pose.position.x, p.pose.position.y) for p in odom_path.poses],
                               np.c_[50.0 - WAYPOINTS[:, 1], 20.0 + WAYPOINTS[:, 0]], atol=1e-9)

    def yaw(p):
        o = p.pose.orientation
        return yaw_from_quaternion(o.x, o.y, o.z, o.w)

    assert yaw(ego_path.poses[0]) == pytest.approx(0.0)
    assert yaw(ego_path.poses[2]) == pytest.approx(math.pi / 4)
    assert yaw(ego_path.poses[3]) == pytest.approx(math.pi / 4)          # a waypoint that stays keeps its heading
    assert yaw(odom_path.poses[0]) == pytest.approx(math.pi / 2)
    assert conv.plan_paths(stamp, "base_link", WAYPOINTS)[1] is None


def test_invalid_results_carry_no_points_or_boxes():
    invalid = TaskResult(valid=False, invalid_reason="wrong_count: expected 16 numbers, got 3", raw_text="1,2,3",
                         stats=STATS)
    traj = conv.trajectory_msg(5, "ego", "left", invalid, latency_ms=12.5)
    assert not traj.valid and traj.points == [] and traj.invalid_reason.startswith("wrong_count")
    assert traj.raw_text == "1,2,3" and traj.stats.forwards == 12 and traj.stats.latency_ms == 12.5
    assert (traj.candidates, traj.valid_candidates, traj.selected_candidate) == (1, 0, 0) and math.isnan(traj.pdms)
    valid = TaskResult(valid=True, invalid_reason="", raw_text="...", stats=STATS, waypoints=WAYPOINTS)
    assert len(conv.trajectory_msg(5, "ego", "left", valid, 1.0).points) == 8
    boxes = TaskResult(valid=False, invalid_reason="invalid_json", raw_text="[", stats=STATS,
                       boxes=[Box("car", 1.0, 0, 0, 1, 1)])
    assert conv.detections_msg(Header(frame_id="cam"), boxes, 1.0).detections == []


def test_vision_msgs_layout():
    """The real vision_msgs (built from ../shared/ros_interfaces): boxes as a vision_msgs consumer reads them,
    centre and size in source pixels, the label as class_id and the score; the message serialises."""
    vision = pytest.importorskip("vision_msgs.msg", reason="vision_msgs is built by scripts/build_ros_interfaces.sh; "
                                                       "a colcon workspace without it (colcon test) lacks it")
    from rclpy.serialization import deserialize_message, serialize_message
    result = TaskResult(valid=True, invalid_reason="", raw_text="", stats=STATS,
                        boxes=[Box("truck", 0.8, 10.0, 20.0, 50.0, 80.0)])
    out = deserialize_message(serialize_message(conv.vision_detections_msg(vision, Header(frame_id="cam"), result)),
                              vision.Detection2DArray)
    det = out.detections[0]
    assert out.header.frame_id == "cam" and det.header.frame_id == "cam"
    assert (det.bbox.center.position.x, det.bbox.center.position.y, det.bbox.size_x, det.bbox.size_y) == \
        (30.0, 50.0, 40.0, 60.0)
    assert (det.results[0].hypothesis.class_id, det.results[0].hypothesis.score) == ("truck", pytest.approx(0.8))
    invalid = TaskResult(valid=False, invalid_reason="invalid_json", raw_text="[", stats=STATS, boxes=result.boxes)
    assert conv.vision_detections_msg(vision, Header(frame_id="cam"), invalid).detections == []


def test_markers_draw_a_plan_or_delete_it():
    shown = conv.plan_markers(5, "ego", WAYPOINTS, "left (route) plan ok").markers
    assert [m.action for m in shown] == [shown[0].ADD] * 3 and len(shown[0].points) == 9
    gone = conv.plan_markers(5, "ego", None, "INVALID").markers
    assert gone[0].action == gone[0].DELETE and gone[1].action == gone[1].DELETE and gone[2].text == "INVALID"


def test_spinning_ends_quietly_on_the_shutdown_race_and_raises_real_errors():
    """rclpy's SIGINT handler shuts the context down while the executor builds its next wait set,
    which raises RCLError ('the given context is not valid'): after a shutdown that is the shutdown."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

    from wam_diff2_ros.spinning import spin_until_shutdown

    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    failure = _rclpy.RCLError("failed to initialize wait set: the given context is not valid")

    def spin_raising():
        raise failure
    executor.spin = spin_raising
    try:
        with pytest.raises(_rclpy.RCLError):        # the context is up: a real failure propagates
            spin_until_shutdown(executor)
    finally:
        rclpy.shutdown(context=context)
    spin_until_shutdown(executor)                   # the same error after the shutdown: a quiet end
    executor.spin = lambda: (_ for _ in ()).throw(KeyboardInterrupt())
    spin_until_shutdown(executor)


def test_each_qos_profile_has_one_name_defined_only_in_qos_py():
    from rclpy.qos import QoSProfile

    from test.support import REPO_ROOT
    from wam_diff2_ros import qos

    profiles = {name: value for name, value in vars(qos).items() if isinstance(value, QoSProfile)}
    assert len(profiles) >= 6
    assert [(a, b) for a in profiles for b in profiles if a < b and profiles[a] == profiles[b]] == []
    elsewhere = re.compile(r"QoSProfile\(|^\w+_QOS = (?!\{)", re.M)      # a profile built or renamed (not a table)
    assert [str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "wam_diff2_ros").rglob("*.py")
            if p.name != "qos.py" and elsewhere.search(p.read_text())] == []


def test_the_controllers_diagnostics_are_a_function_of_its_state():
    from diagnostic_msgs.msg import DiagnosticStatus

    from wam_diff2_ros.diagnostics import ControllerState, controller_diagnostic_status
    from wam_diff2_ros.msg import PlannerStatus

    values = {"tick_source": "odometry", "control_consumer": "carla", "pacing": "hold"}
    state = ControllerState(planner_state=PlannerStatus.READY, last_tick_ns=2_500_000_000, last_reason="following plan")
    state.tick_wall_ms.extend([1.0, 3.0])
    state.counts["ticks"] = 2
    status = controller_diagnostic_status("ctl", state, values, [], "", 12.34)
    table = {kv.key: kv.value for kv in status.values}
    assert (status.level, status.name, status.message) == (DiagnosticStatus.OK, "ctl: controller", "following plan")
    assert table["planner_state"] == "READY" and table["last_tick_s"] == "2.500" and table["ticks"] == "2"
    assert (table["tick_wall_ms_mean"], table["tick_wall_ms_max"], table["pacing_hold_wall_ms_mean"]) == \
        ("2.00", "3.00", "none")
    assert table["route_progress_m"] == "12.3" and table["leaderboard_status_sent"] == "false"
    state.last_reason = "stale plan (1.20 s old)"
    assert controller_diagnostic_status("ctl", state, values, [], "", None).message == "braking: stale plan (1.20 s old)"
    status = controller_diagnostic_status("ctl", state, values, ["control.max_throttle: out of range"], "no carla", None)
    assert status.level == DiagnosticStatus.ERROR
    assert status.message == "no carla; bad parameters: control.max_throttle: out of range"


def test_the_localization_diagnostics_are_a_function_of_its_state():
    from diagnostic_msgs.msg import DiagnosticStatus

    from wam_diff2_core.localization.odometry_filter import OdometryFilter
    from wam_diff2_ros.diagnostics import LocalizationState, localization_diagnostic_status

    values = {"sensor_timeout_s": 0.5, "speedometer_type": "carla_msgs/CarlaSpeedometer"}
    ekf, state = OdometryFilter(), LocalizationState()
    status = localization_diagnostic_status("loc", state, ekf, values, [], "")
    assert (status.level, status.name) == (DiagnosticStatus.WARN, "loc: localization")
    assert "waiting for a GNSS fix" in status.message
    ekf.gnss(1.0, 10.0, 20.0)
    ekf.imu(1.0, 0.3, 0.0, 0.0)
    ekf.speed(1.0, 5.0)
    state.used_s.update(gnss=1.0, imu=1.0, speed=1.0)
    status = localization_diagnostic_status("loc", state, ekf, values, [], "")
    table = {kv.key: kv.value for kv in status.values}
    assert (status.level, status.message, table["ready"], table["gnss_age_s"]) == (DiagnosticStatus.OK, "localized",
                                                                                   "true", "0.000")
    state.used_s["imu"] = 2.0                                  # GNSS and speed 1 s behind: stale
    assert localization_diagnostic_status("loc", state, ekf, values, [], "").level == DiagnosticStatus.WARN
    for errors, speedometer in ((["publish_tf: no tf2_msgs"], ""), ([], "another type")):
        assert localization_diagnostic_status("loc", state, ekf, values, errors, speedometer).level == \
            DiagnosticStatus.ERROR
