"""The messages of one decoded frame, as a pure function of the frame and the settings.

In publishing order: the trajectory (valid or not), the plan's paths and Autoware trajectory, the
boxes, the markers and the debug image. The timing outputs (``processing_ms``, ``latency_ms``,
``stage_times``) are the node's: they measure this.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
from std_msgs.msg import Header

from wam_diff2_core.frame_inputs import FrameInputs
from wam_diff2_core.geometry import PinholeCamera
from wam_diff2_core.speed_profile import measured_speed, speed_profile

from .. import conversions as conv
from .debug_image import debug_camera, plan_debug_image, status_line
from .interface import autoware_msgs, vision_msgs
from .settings import PlannerSettings


def frame_messages(header: Header, rgb: np.ndarray, inputs: FrameInputs, ego_frame: str, odom_frame: str, out,
                   settings: PlannerSettings, camera_info: PinholeCamera | None) -> Iterator[tuple[str, Any]]:
    """(output name, message) for a ``PolicyOutput`` decoded from ``rgb`` [H, W, 3] with ``header``;
    ``odom_frame`` empty: no odometry-frame outputs; ``camera_info``: the camera received, if used."""
    stamp_ns, ego = inputs.stamp_ns, inputs.odometry
    plan, detections = out.plan, out.detections
    waypoints = plan.waypoints if plan is not None and plan.valid else None
    if plan is not None:
        yield "trajectory", conv.trajectory_msg(stamp_ns, ego_frame, inputs.command, plan, out.latency_ms, out.stages,
                                                candidates=out.candidates, valid_candidates=out.valid_candidates,
                                                selection=out.selection)
        if waypoints is not None:
            path, path_odom = conv.plan_paths(stamp_ns, ego_frame, waypoints, odom_frame or None, ego)
            yield "path", path
            if settings["publish_odom_frame_path"] and path_odom is not None:
                yield "path_odom", path_odom
            if autoware_msgs is not None and odom_frame:
                profile = speed_profile(waypoints, measured_speed(ego.vx), settings.profile_limits)
                yield "autoware_trajectory", conv.autoware_trajectory_msg(autoware_msgs, stamp_ns, odom_frame,
                                                                          profile, ego)
    if detections is not None:
        yield "detections", conv.detections_msg(header, detections, out.latency_ms, out.stages)
        if vision_msgs is not None:
            yield "vision_detections", conv.vision_detections_msg(vision_msgs, header, detections)
    line = status_line(inputs.command, inputs.command_source, plan)
    if settings["debug.publish_markers"] and plan is not None:
        yield "markers", conv.plan_markers(stamp_ns, ego_frame, waypoints, line)
    if settings["debug.publish_image"]:
        camera = debug_camera(rgb.shape[1], rgb.shape[0], camera_info, settings["camera.horizontal_fov_deg"])
        yield "debug_image", conv.rgb_image_msg(plan_debug_image(rgb, plan, detections, line, camera,
                                                                 settings.camera_mount), header)
