"""The planner's debug image (~/debug/image) as pure functions: the plan projected into the frame,
the boxes and a status line drawn on a copy of it."""
from __future__ import annotations

import numpy as np

from wam_diff2_core.geometry import CameraMount, PinholeCamera, project_ego_points
from wam_diff2_core.images import draw_debug_image


def status_line(command: str, source: str, plan) -> str:
    """The line drawn on the debug image and the markers: the command, where it came from, the plan's verdict."""
    if plan is None:
        return f"{command} ({source})"
    if plan.valid:
        return f"{command} ({source}) plan ok"
    return f"{command} ({source}) INVALID: {plan.invalid_reason[:60]}"


def debug_camera(width: int, height: int, camera_info: PinholeCamera | None,
                 horizontal_fov_deg: float) -> PinholeCamera:
    """The camera received on camera_info, scaled to this frame; without one, a pinhole of the given field of view."""
    if camera_info is None:
        return PinholeCamera.from_horizontal_fov(width, height, horizontal_fov_deg)
    if (camera_info.width, camera_info.height) != (width, height):
        return camera_info.scaled_to(width, height)
    return camera_info


def plan_pixels(waypoints: np.ndarray, camera: PinholeCamera, mount: CameraMount) -> np.ndarray:
    """[N, 2] ego-frame waypoints (metres) -> [N + 1, 2] pixels, the ego origin first (NaN: not in view)."""
    points = np.concatenate([np.zeros((1, 2)), np.asarray(waypoints, dtype=np.float64)], axis=0)   # [N + 1, 2]
    on_ground = np.concatenate([points, np.zeros((len(points), 1))], axis=1)                        # [N + 1, 3]
    path_px, _ = project_ego_points(on_ground, camera, mount)
    return path_px


def plan_debug_image(rgb: np.ndarray, plan, detections, line: str, camera: PinholeCamera,
                     mount: CameraMount) -> np.ndarray:
    """A copy of ``rgb`` [H, W, 3] with a valid plan's path, valid detections' boxes and ``line`` drawn;
    drawn as invalid when the plan is."""
    waypoints = plan.waypoints if plan is not None and plan.valid else None
    path_px = None if waypoints is None else plan_pixels(waypoints, camera, mount)
    boxes = detections.boxes if detections is not None and detections.valid else ()
    return draw_debug_image(rgb, path_px, boxes, [line], valid=plan is None or plan.valid)
