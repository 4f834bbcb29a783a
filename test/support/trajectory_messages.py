"""Trajectory messages as the planner node publishes them, built with a bag typestore (``types``) for
hand-made predictions bags."""
from __future__ import annotations

from wam_diff2_core.evaluation.ground_truth import WAYPOINT_OFFSETS_NS
from wam_diff2_core.evaluation.predictions import DEFAULT_TRAJECTORY_TOPIC
from wam_diff2_core.evaluation.record import TRAJECTORY_TYPE
from wam_diff2_core.speed_profile import waypoint_states

TOPIC = DEFAULT_TRAJECTORY_TOPIC
TYPE = TRAJECTORY_TYPE


def stages(t, stamp_ns, latency_ms):
    """A node's StageTimes: 1 ms of image conversion, the rest denoising."""
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9,
                                                                              nanosec=stamp_ns % 10**9), frame_id="cam")
    return t["wam_diff2_ros/msg/StageTimes"](header=header, image_ms=1.0, processor_ms=0.0, vision_ms=0.0,
                                             prefill_ms=0.0, denoise_ms=latency_ms, commit_ms=0.0, parse_ms=0.0,
                                             other_ms=0.0, total_ms=latency_ms + 1.0, peak_memory_mb=500.0,
                                             memory_kind="rss")


def trajectory(types, stamp_ns, points=None, *, valid=True, reason="", command="straight", forwards=4, tokens=8,
               block_size=32, latency_ms=100.0, raw_text="answer"):
    t = types
    pts = []
    point = t["wam_diff2_ros/msg/TrajectoryPoint"]
    if points is not None:
        headings, speeds = waypoint_states(points)
        for dt_ns, (x, y), heading, speed in zip(WAYPOINT_OFFSETS_NS, points, headings, speeds):
            extra = dict(heading=float(heading), speed=float(speed)) if "speed" in point.__dataclass_fields__ else {}
            pts.append(point(
                time_from_start=t["builtin_interfaces/msg/Duration"](sec=dt_ns // 10**9, nanosec=dt_ns % 10**9),
                x=float(x), y=float(y), **extra))
    stats = t["wam_diff2_ros/msg/DecodeStats"](block_size=block_size, forwards=forwards, denoise_steps=forwards - 1,
                                               blocks=1, tokens=tokens, prefill_ms=1.0, denoise_ms=2.0, commit_ms=0.5,
                                               retries=0, latency_ms=latency_ms, stages=stages(t, stamp_ns, latency_ms))
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9,
                                                                              nanosec=stamp_ns % 10**9),
                                      frame_id="ego_vehicle")
    selection = (dict(candidates=1, valid_candidates=int(valid), selected_candidate=0, pdms=float("nan"))
                 if "candidates" in t[TYPE].__dataclass_fields__ else {})          # since 0.3.0
    return t[TYPE](header=header, points=pts, command=command, valid=valid, invalid_reason=reason,
                   raw_text=raw_text, stats=stats, **selection)
