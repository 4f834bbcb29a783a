"""Evaluation building blocks against hand-computed values: metrics in both L2 conventions,
percentiles, the recorded-future interpolation and ego-frame transform, the recorded speed and the
speed profile's error against it, the constant-velocity baseline, and the frame-input derivation
shared with the planner node."""
from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from wam_diff2_core.evaluation.ground_truth import (BEFORE_START, BEYOND_END, ODOMETRY_GAP, EgoTrajectory, NoFuture,
                                                    constant_velocity_waypoints)
from wam_diff2_core.evaluation.metrics import (FrameResult, distribution, profile_speed_errors, speed_error_metrics,
                                               summarize, trajectory_metrics, waypoint_errors)
from wam_diff2_core.speed_profile import ProfileLimits
from wam_diff2_core.geometry import quaternion_from_yaw
from wam_diff2_core.frame_inputs import (BAD_COMMAND, BAD_ODOMETRY, NO_ODOMETRY, ODOMETRY_OUT_OF_ORDER, STALE_ODOMETRY,
                                         FrameInputTracker, InputSettings, InputSkip)

S = 1_000_000_000


# ----------------------------------------------------------------------------- metrics
def test_l2_in_both_conventions_ade_fde_and_curve_by_hand():
    # frame A: e_k = 0.1 k; frame B: e_k = 1.0 for every k
    errors = np.array([[0.1 * k for k in range(1, 9)], [1.0] * 8])
    m = trajectory_metrics(errors)
    # at t (UniAD): waypoint k = 2t, mean over the two frames
    assert m["l2_at_t"] == pytest.approx({"1s": (0.2 + 1) / 2, "2s": (0.4 + 1) / 2, "3s": (0.6 + 1) / 2,
                                          "4s": (0.8 + 1) / 2})
    # averaged to t (ST-P3 / VAD): mean of waypoints 1..2t per frame, then over frames
    assert m["l2_avg_to_t"] == pytest.approx({"1s": (0.15 + 1) / 2, "2s": (0.25 + 1) / 2, "3s": (0.35 + 1) / 2,
                                              "4s": (0.45 + 1) / 2})
    assert m["ade"] == pytest.approx((0.45 + 1) / 2)
    assert m["fde"] == pytest.approx((0.8 + 1) / 2)
    assert m["l2_at_t_mean_1_3s"] == pytest.approx(((0.2 + 1) / 2 + (0.4 + 1) / 2 + (0.6 + 1) / 2) / 3)
    assert m["per_waypoint"] == pytest.approx([(0.1 * k + 1) / 2 for k in range(1, 9)])
    assert m["frames"] == 2


def test_no_frames_gives_nulls_not_zeros():
    m = trajectory_metrics(np.zeros((0, 8)))
    assert m["frames"] == 0 and m["ade"] is None and m["l2_at_t"]["4s"] is None and m["per_waypoint"] == [None] * 8


def test_waypoint_errors_are_euclidean():
    gt = np.zeros((8, 2))
    pred = np.tile([3.0, 4.0], (8, 1))
    assert waypoint_errors(pred, gt).tolist() == [5.0] * 8


def test_latency_percentiles_are_linear_interpolation():
    d = distribution([10, 20, 30, 40, 50])
    assert d == {"count": 5, "mean": 30.0, "p50": 30.0, "p90": 46.0, "p99": pytest.approx(49.6), "max": 50.0}
    assert distribution([])["p50"] is None


# ----------------------------------------------------------------------------- recorded future
def _line(t0_ns=0, n=101, dt_ns=50_000_000, v=(2.0, 1.0), yaw=0.0, origin=(10.0, 5.0)):
    stamps = [t0_ns + i * dt_ns for i in range(n)]
    xy = np.array([[origin[0] + v[0] * i * dt_ns / S, origin[1] + v[1] * i * dt_ns / S] for i in range(n)])
    return EgoTrajectory(stamps, xy, [yaw] * n)


def test_future_on_recorded_stamps_is_exact_and_in_the_ego_frame():
    # ego heading +y (yaw 90 deg) moving along +y at 2 m/s: in its own frame the future is straight ahead
    n, dt = 101, 50_000_000
    stamps = [i * dt for i in range(n)]
    xy = np.array([[10.0, 5.0 + 2.0 * i * dt / S] for i in range(n)])
    traj = EgoTrajectory(stamps, xy, [math.pi / 2] * n)
    gt = traj.future_waypoints(0)
    assert gt == pytest.approx(np.array([[1.0 * k, 0.0] for k in range(1, 9)]), abs=1e-12)


def test_future_between_samples_is_interpolated_linearly():
    traj = EgoTrajectory([0, S, 2 * S, 3 * S, 4 * S, 5 * S], np.array([[0, 0], [1, 0], [3, 0], [6, 0], [10, 0], [15, 0]],
                                                                      float), [0.0] * 6, max_gap_s=2.0)
    xy, yaw = traj.pose_at(S // 4)           # a quarter of the way from x=0 to x=1
    assert xy.tolist() == [0.25, 0.0] and yaw == 0.0
    gt = traj.future_waypoints(S // 2)       # origin x = 0.5; +0.5 s -> x=1 exactly, +1.0 s -> x=2 (mid 1..3)
    assert gt[0].tolist() == [0.5, 0.0] and gt[1].tolist() == [1.5, 0.0]
    assert gt[7].tolist() == [12.0, 0.0]     # +4.0 s -> t=4.5 s: x = 10 + 5 / 2 = 12.5, minus the origin


def test_yaw_interpolates_along_the_short_arc_across_pi():
    traj = EgoTrajectory([0, S], np.zeros((2, 2)), [math.pi - 0.1, -math.pi + 0.1], max_gap_s=2.0)
    _, yaw = traj.pose_at(S // 2)
    assert abs(abs(yaw) - math.pi) < 1e-12


def test_frames_without_four_seconds_or_inside_a_gap_have_no_future():
    traj = _line(n=81)                       # 4.0 s of odometry at 20 Hz
    traj.future_waypoints(0)                 # exactly 4 s: fine
    with pytest.raises(NoFuture) as err:
        traj.future_waypoints(1)
    assert err.value.code == BEYOND_END
    gap = EgoTrajectory([0, S, 3 * S, 6 * S], np.zeros((4, 2)), [0.0] * 4, max_gap_s=1.5)
    with pytest.raises(NoFuture) as err:
        gap.future_waypoints(0)
    assert err.value.code == ODOMETRY_GAP


def test_constant_velocity_baseline_keeps_the_ego_frame_velocity():
    cv = constant_velocity_waypoints((4.0, -1.0))
    assert cv.tolist() == [[2.0 * k, -0.5 * k] for k in range(1, 9)]


# ----------------------------------------------------------------------------- recorded speed
def test_recorded_speed_is_interpolated_like_the_poses_with_the_same_no_future_rules():
    # 0.5 s samples speeding up 1 m/s each, then a 1 s gap: speed 0, 1, ..., 9, then 20 at 5.5 s
    stamps = [k * S // 2 for k in range(10)] + [11 * S // 2]
    traj = EgoTrajectory(stamps, np.zeros((11, 2)), [0.0] * 11, max_gap_s=0.6, speed=[*range(10), 20.0])
    assert traj.speed_at(S) == 2.0 and traj.speed_at(S + S // 8) == 2.25       # on a sample; a quarter on
    assert traj.future_speeds(0).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert traj.future_speeds(S // 4).tolist() == [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5]
    for t_ns, code in ((S, ODOMETRY_GAP), (-1, BEFORE_START), (11 * S // 2, BEYOND_END)):
        with pytest.raises(NoFuture) as err:      # +4 s inside the gap / before the start / past the end
            traj.future_speeds(t_ns)
        assert err.value.code == code
    with pytest.raises(ValueError, match="speed: expected one value per stamp"):
        EgoTrajectory(stamps, np.zeros((11, 2)), [0.0] * 11, speed=[1.0] * 10)
    with pytest.raises(ValueError, match="without speeds"):
        EgoTrajectory(stamps, np.zeros((11, 2)), [0.0] * 11).speed_at(0)


K = np.arange(1, 9)


def test_speed_profile_error_of_a_plan_that_keeps_the_speed_and_of_one_that_stays_put():
    recorded = np.full(8, 8.0)                                    # the drive kept 8 m/s
    keeps = np.stack([8.0 * 0.5 * K, np.zeros(8)], axis=1)
    assert profile_speed_errors(keeps, 8.0, recorded) == pytest.approx(np.zeros(8), abs=1e-9)
    # staying put: the profile brakes from 8 m/s at the 6 m/s^2 limit, 5 m/s at 0.5 s, 2 at 1 s, 0 from 1.4 s
    stays = np.zeros((8, 2))
    assert profile_speed_errors(stays, 8.0, recorded) == pytest.approx([3.0, 6.0, 8, 8, 8, 8, 8, 8])
    softer = ProfileLimits(max_decel_mps2=2.0)                    # the limits are the profile's: 1 m/s per 0.5 s
    assert profile_speed_errors(stays, 8.0, recorded, softer) == pytest.approx([1.0, 2, 3, 4, 5, 6, 7, 8])


def test_speed_error_means_and_medians_at_1_to_4_s():
    errors = np.array([[0.1 * k for k in K], [1.0] * 8, [3.0] * 8])
    m = speed_error_metrics(errors)
    assert m["frames"] == 3
    assert m["mean_at_t"] == pytest.approx({"1s": 4.2 / 3, "2s": 4.4 / 3, "3s": 4.6 / 3, "4s": 4.8 / 3})
    assert m["p50_at_t"] == pytest.approx({"1s": 1.0, "2s": 1.0, "3s": 1.0, "4s": 1.0})
    assert speed_error_metrics(np.zeros((0, 8))) == {"frames": 0, "mean_at_t": dict.fromkeys(m["mean_at_t"]),
                                                     "p50_at_t": dict.fromkeys(m["p50_at_t"])}


def frame_record(i, valid=True):
    """A frames.jsonl record as eval-bag wrote them before the recorded speed existed."""
    gt = [[4.0 * 0.5 * k, 0.0] for k in K]
    return {"bag": "old.mcap", "index": i, "stamp_ns": i * S, "bag_time_ns": i * S, "command": "straight",
            "command_source": "route", "velocity": [4.0, 0.0], "acceleration": [0.0, 0.0], "valid": valid,
            "invalid_reason": "" if valid else "not_a_number: x", "raw_text": "", "ground_truth": gt,
            "predicted": [[x + 0.5, y] for x, y in gt] if valid else None, "baseline": gt, "errors": None,
            "baseline_errors": None, "stats": {"forwards": 2, "tokens": 8}, "latency_ms": 10.0}


def test_a_record_written_before_the_recorded_speed_loads_and_summarizes():
    frames = [FrameResult.from_record(frame_record(i, valid=i != 2)) for i in range(4)]
    assert all(f.recorded_speeds is None and f.speed_errors is None for f in frames)
    o = summarize(frames)["overall"]
    assert o["speed_profile"] is None
    assert (o["frames"], o["valid"]) == (4, 3) and o["model"]["l2_at_t"]["4s"] == pytest.approx(0.5)
    # written again, it says so and still loads
    again = FrameResult.from_record(frames[0].as_record())
    assert frames[0].as_record()["recorded_speeds"] is None and again.speed_errors is None


# ----------------------------------------------------------------------------- frame inputs
def odom(t_ns, x=0.0, y=0.0, yaw=0.0, vx=5.0, vy=0.0, wz=0.0, frame="map"):
    qx, qy, qz, qw = quaternion_from_yaw(yaw)
    return NS(header=NS(stamp=NS(sec=t_ns // S, nanosec=t_ns % S), frame_id=frame),
              pose=NS(pose=NS(position=NS(x=x, y=y, z=0.0), orientation=NS(x=qx, y=qy, z=qz, w=qw))),
              twist=NS(twist=NS(linear=NS(x=vx, y=vy, z=0.0), angular=NS(x=0.0, y=0.0, z=wz))))


def path(points, frame="map"):
    return NS(header=NS(stamp=NS(sec=0, nanosec=0), frame_id=frame),
              poses=[NS(pose=NS(position=NS(x=float(x), y=float(y), z=0.0))) for x, y in points])


def test_ego_state_interpolates_at_the_image_stamp_with_filtered_acceleration():
    tracker = FrameInputTracker(InputSettings(acceleration_time_constant_s=0.0))   # unfiltered: exact numbers
    tracker.on_odometry(odom(0, vx=4.0))
    tracker.on_odometry(odom(S // 10, x=0.45, vx=5.0))                           # +1 m/s in 0.1 s: 10 m/s^2
    inputs = tracker.inputs_at(S // 20)                                           # halfway
    assert inputs.ego.velocity == pytest.approx((4.5, 0.0))
    assert inputs.ego.acceleration == pytest.approx((5.0, 0.0))                  # 0 and 10 interpolated
    assert inputs.command == "straight" and inputs.command_source == "default"


def test_centripetal_acceleration_of_a_turning_ego():
    tracker = FrameInputTracker(InputSettings(acceleration_time_constant_s=0.0))
    for i in range(3):
        tracker.on_odometry(odom(i * S // 10, vx=6.0, wz=0.2))
    assert tracker.inputs_at(2 * S // 10).ego.acceleration == pytest.approx((0.0, 1.2))   # v * omega, to the left


def test_command_topic_overrides_the_route_and_auto_hands_back():
    tracker = FrameInputTracker(InputSettings(default_command=None))
    tracker.on_odometry(odom(0))
    with pytest.raises(InputSkip) as err:
        tracker.inputs_at(0)
    assert err.value.code == "no_command"
    tracker.on_route(path([(0, 0), (10, 0), (20, 0), (20, 10), (20, 20), (20, 40)]))  # turns left 20 m ahead
    assert (tracker.inputs_at(0).command, tracker.inputs_at(0).command_source) == ("left", "route")
    tracker.on_command(NS(data="CHANGELANERIGHT"))
    assert (tracker.inputs_at(0).command, tracker.inputs_at(0).command_source) == ("right", "command")
    with pytest.raises(InputSkip) as err:
        tracker.on_command(NS(data="sideways"))
    assert err.value.code == BAD_COMMAND and tracker.inputs_at(0).command == "right"   # previous one kept
    tracker.on_command(NS(data="auto"))
    assert tracker.inputs_at(0).command_source == "route"


def test_bad_or_out_of_order_odometry_is_refused_and_changes_nothing():
    tracker = FrameInputTracker()
    with pytest.raises(InputSkip) as err:
        tracker.inputs_at(0)
    assert err.value.code == NO_ODOMETRY
    tracker.on_odometry(odom(S))
    for bad, code in ((odom(2 * S, x=float("nan")), BAD_ODOMETRY), (odom(S), ODOMETRY_OUT_OF_ORDER),
                      (odom(S // 2), ODOMETRY_OUT_OF_ORDER)):
        with pytest.raises(InputSkip) as err:
            tracker.on_odometry(bad)
        assert err.value.code == code
    assert len(tracker.history) == 1
    with pytest.raises(InputSkip) as err:
        tracker.inputs_at(2 * S)                     # 1 s from the only sample > odometry_timeout_s 0.5
    assert err.value.code == STALE_ODOMETRY


def test_odometry_jumping_back_over_a_second_restarts_the_history():
    """A replay or simulator restart: the tracker starts over instead of refusing odometry until the
    clock passes the first run's newest stamp (the node would plan nothing for that long)."""
    tracker = FrameInputTracker(InputSettings(acceleration_time_constant_s=0.0))
    for k in range(10, 21):                                          # 10 .. 20 s, accelerating
        tracker.on_odometry(odom(k * S, vx=0.1 * k))
    assert tracker.inputs_at(20 * S).ego.acceleration[0] == pytest.approx(0.1)
    with pytest.raises(InputSkip) as err:                           # late by exactly TIME_RESET_S: still refused
        tracker.on_odometry(odom(19 * S))
    assert err.value.code == ODOMETRY_OUT_OF_ORDER and tracker.time_resets == 0
    tracker.on_odometry(odom(S, vx=7.0))                             # the run starts again at 1 s
    assert tracker.time_resets == 1 and len(tracker.history) == 1 and tracker.newest_odometry_ns == S
    inputs = tracker.inputs_at(S)
    assert inputs.ego.velocity == (7.0, 0.0) and inputs.ego.acceleration == (0.0, 0.0)   # no old samples mixed in
    with pytest.raises(InputSkip) as err:
        tracker.inputs_at(20 * S)                                    # the first run's history is gone
    assert err.value.code == STALE_ODOMETRY
