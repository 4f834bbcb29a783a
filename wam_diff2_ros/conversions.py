"""ROS messages <-> wam_diff2_core values. No node state here: every function is pure.

Times: ``builtin_interfaces/Time`` is handled as integer nanoseconds so that
``t0 + k * 0.5 s`` stamps are exact.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point, Pose, PoseStamped, Quaternion, TransformStamped, Vector3
from nav_msgs.msg import Odometry, Path
from sensor_msgs.msg import CameraInfo, Image, NavSatFix
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from wam_diff2_core.control import Plan, Pose2D
from wam_diff2_core.frame_inputs import NS_PER_S, stamp_ns
from wam_diff2_core.localization.odometry_filter import OdometryFilter, V, X, Y, YAW
from wam_diff2_core.geometry import (EgoSample, PinholeCamera, ego_to_world, path_headings, quaternion_from_yaw,
                                     yaw_from_quaternion)
from wam_diff2_core.outputs.prompts import WAYPOINT_DT_S
from wam_diff2_core.speed_profile import SpeedProfile, waypoint_states

from .msg import DecodeStats, Detection2D, Detection2DArray, StageTimes, Trajectory, TrajectoryPoint
from .optional_msgs import TFMessage

if TYPE_CHECKING:
    from wam_diff2_core.candidate_selection import Selection
    from wam_diff2_core.policy import TaskResult

WAYPOINT_DT_NS = int(round(WAYPOINT_DT_S * NS_PER_S))
UNOBSERVED_VARIANCE = 1e6          # covariance of what a 2-D filter does not estimate (z, roll, pitch, ...)


def ns_to_stamp(ns: int) -> Time:
    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def ns_to_duration(ns: int) -> Duration:
    return Duration(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def well_formed_stamp(stamp) -> bool:
    """``nanosec`` below a second (builtin_interfaces/Time's contract): a stamp beyond it is malformed, and at
    the end of int32 its seconds would not fit a stamp again (an output stamped with it would raise)."""
    return 0 <= int(stamp.nanosec) < NS_PER_S


def camera_info_to_camera(msg: CameraInfo) -> PinholeCamera:
    """Intrinsics from the K matrix. Raises ValueError when unusable."""
    k = [float(v) for v in msg.k]
    camera = PinholeCamera(fx=k[0], fy=k[4], cx=k[2], cy=k[5], width=int(msg.width), height=int(msg.height))
    if not all(math.isfinite(v) for v in k) or camera.fx <= 0 or camera.fy <= 0 or camera.width <= 0 \
            or camera.height <= 0:
        raise ValueError(f"camera_info has no usable intrinsics: K={k}, {msg.width}x{msg.height}")
    return camera


# Beyond these an odometry, a plan or a route is invalid: no map frame on earth is 10,000 km across (and
# coordinates near 1e154 overflow the route geometry's squares), and the published speed is a float32.
MAX_COORDINATE_M = 1e7
MAX_SPEED_MPS = 1e3
MAX_PLAN_HORIZON_S = 60.0          # a plan reaching further is invalid (resampling it would fill the memory)


def plan_from_trajectory(msg) -> Plan:
    """A ``wam_diff2_ros/Trajectory`` as the controller's plan (ego frame at its stamp, 0.5 s apart).

    Points not spaced 0.5 s apart are resampled on that grid (by ``time_from_start``); times that
    do not increase or reach beyond MAX_PLAN_HORIZON_S, points beyond MAX_COORDINATE_M, an invalid
    message or fewer than 2 points give an invalid plan.
    """
    t = stamp_ns(msg.header.stamp) / NS_PER_S
    if not msg.valid or len(msg.points) < 2:
        return Plan(t, np.zeros((0, 2)), valid=False)
    xy = np.array([[p.x, p.y] for p in msg.points], dtype=np.float64)                  # [N, 2]
    if (np.abs(xy) > MAX_COORDINATE_M).any():       # finite but absurd: the control's geometry would overflow
        return Plan(t, xy, valid=False)
    times = np.array([stamp_ns(p.time_from_start) / NS_PER_S for p in msg.points])     # [N]
    grid = WAYPOINT_DT_S * np.arange(1, len(xy) + 1)
    if np.allclose(times, grid, atol=1e-6):
        return Plan(t, xy)
    if not (np.all(np.diff(times) > 0) and times[0] > 0 and times[-1] <= MAX_PLAN_HORIZON_S):
        return Plan(t, xy, valid=False)
    grid = WAYPOINT_DT_S * np.arange(1, int(times[-1] / WAYPOINT_DT_S + 1e-9) + 1)
    full_t, full_xy = np.concatenate([[0.0], times]), np.vstack([[0.0, 0.0], xy])    # the ego at the stamp
    resampled = np.stack([np.interp(grid, full_t, full_xy[:, 0]), np.interp(grid, full_t, full_xy[:, 1])], axis=1)
    return Plan(t, resampled, valid=len(grid) >= 2)


@dataclass(frozen=True)
class EgoOdometry:
    stamp_ns: int
    pose: Pose2D
    speed_mps: float
    child_frame: str
    finite: bool


def ego_from_odometry(msg) -> EgoOdometry:
    p, q, v = msg.pose.pose.position, msg.pose.pose.orientation, msg.twist.twist.linear
    values = (p.x, p.y, q.x, q.y, q.z, q.w, v.x, v.y)
    # twist in the child (ego) frame, as carla-ros-bridge publishes it; the speedometer is its norm
    speed = math.hypot(float(v.x), float(v.y))
    finite = all(math.isfinite(float(a)) for a in values) and not (q.x == q.y == q.z == q.w == 0.0) \
        and max(abs(p.x), abs(p.y)) <= MAX_COORDINATE_M and speed <= MAX_SPEED_MPS
    yaw = yaw_from_quaternion(float(q.x), float(q.y), float(q.z), float(q.w)) if finite else math.nan
    return EgoOdometry(stamp_ns(msg.header.stamp), Pose2D(float(p.x), float(p.y), yaw), speed if finite else math.nan,
                       str(msg.child_frame_id), finite)


def gnss_covariance(msg: NavSatFix) -> np.ndarray | None:
    """The fix's east / north covariance [2, 2] (m^2, unchecked: the filter checks it), or None when it carries
    none (type unknown, or east and north variance both left at zero)."""
    cov = msg.position_covariance
    if msg.position_covariance_type == NavSatFix.COVARIANCE_TYPE_UNKNOWN or cov[0] == cov[4] == 0.0:
        return None
    return np.array([[cov[0], cov[1]], [cov[3], cov[4]]], dtype=np.float64)


_CASTS = {"float": float, "double": float, "boolean": bool, "string": str}
_INTEGER = re.compile(r"u?int(8|16|32|64)")


def msg_from(msg_type, source, /, **values):
    """A ``msg_type`` with ``values`` and each other number, bool or string field that ``source`` (an object or a
    mapping: a core dataclass, another message) has, as the field's Python type."""
    get = source.get if isinstance(source, Mapping) else lambda name: getattr(source, name, None)
    for name, kind in msg_type.get_fields_and_field_types().items():
        cast = _CASTS.get(kind, int if _INTEGER.fullmatch(kind) else None)
        if cast is not None and name not in values and get(name) is not None:
            values[name] = cast(get(name))
    return msg_type(**values)


def stage_times_msg(header: Header, stages) -> StageTimes:
    """``profiling.StageTimes`` -> the message (stamped with the input image's header); zeros for None."""
    return msg_from(StageTimes, {} if stages is None else stages.as_dict(), header=header)


def decode_stats_msg(result: TaskResult, latency_ms: float, stages, header: Header) -> DecodeStats:
    return msg_from(DecodeStats, result.stats, latency_ms=float(latency_ms), stages=stage_times_msg(header, stages))


def path_msg(stamp_ns: int, frame_id: str, points_xy: np.ndarray, headings: np.ndarray) -> Path:
    """Waypoints -> nav_msgs/Path: pose k stamped t0 + (k + 1) * 0.5 s (the first waypoint is 0.5 s ahead)."""
    path = Path(header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id))
    for k, ((x, y), yaw) in enumerate(zip(points_xy, headings)):
        pose = PoseStamped(header=Header(stamp=ns_to_stamp(stamp_ns + (k + 1) * WAYPOINT_DT_NS), frame_id=frame_id))
        pose.pose = pose_msg(float(x), float(y), float(yaw))
        path.poses.append(pose)
    return path


def plan_paths(stamp_ns: int, ego_frame: str, waypoints_ego: np.ndarray, odom_frame: str | None = None,
               ego_at_stamp: EgoSample | None = None) -> tuple[Path, Path | None]:
    """The plan as a Path in the ego frame and, given the ego pose at the image stamp, in the odometry frame."""
    headings = path_headings(waypoints_ego)
    ego_path = path_msg(stamp_ns, ego_frame, waypoints_ego, headings)
    if ego_at_stamp is None or odom_frame is None:
        return ego_path, None
    world = ego_to_world(waypoints_ego, (ego_at_stamp.x, ego_at_stamp.y), ego_at_stamp.yaw)
    return ego_path, path_msg(stamp_ns, odom_frame, world, headings + ego_at_stamp.yaw)


def pose_msg(x: float, y: float, yaw: float) -> Pose:
    qx, qy, qz, qw = quaternion_from_yaw(yaw)
    return Pose(position=Point(x=x, y=y), orientation=Quaternion(x=qx, y=qy, z=qz, w=qw))


def trajectory_msg(stamp_ns: int, ego_frame: str, command: str, result: TaskResult, latency_ms: float,
                   stages=None, *, candidates: int = 1, valid_candidates: int | None = None,
                   selection: Selection | None = None) -> Trajectory:
    """The package's trajectory: waypoints only when valid; the reason and raw text always; the candidate
    selection's counts and the published plan's online PDM score (``selection``: the policy's choice among
    ``candidates`` plans; ``valid_candidates`` None: the plan's own validity)."""
    header = Header(stamp=ns_to_stamp(stamp_ns), frame_id=ego_frame)
    msg = msg_from(Trajectory, result, header=header, command=command, candidates=int(candidates),
                   stats=decode_stats_msg(result, latency_ms, stages, header),
                   valid_candidates=int(result.valid) if valid_candidates is None else int(valid_candidates),
                   selected_candidate=0 if selection is None else selection.index + 1,
                   pdms=math.nan if selection is None else float(selection.best.pdms))
    if result.valid and result.waypoints is not None:
        headings, speeds = waypoint_states(result.waypoints)
        msg.points = [TrajectoryPoint(time_from_start=ns_to_duration((k + 1) * WAYPOINT_DT_NS), x=float(x), y=float(y),
                                      heading=float(heading), speed=float(speed))
                      for k, ((x, y), heading, speed) in enumerate(zip(result.waypoints, headings, speeds))]
    return msg


def autoware_trajectory_msg(autoware_msgs, stamp_ns: int, frame_id: str, profile: SpeedProfile,
                            ego_at_stamp: EgoSample):
    """autoware_planning_msgs/Trajectory (``autoware_msgs``: its ``msg`` module) from a speed profile in the
    ego frame, placed in ``frame_id`` (the odometry frame) with the ego pose at the image stamp: the first
    point at the ego with its measured speed, one every ``profile.t`` step, stamped with the image."""
    world = ego_to_world(np.stack([profile.x, profile.y], axis=1), (ego_at_stamp.x, ego_at_stamp.y), ego_at_stamp.yaw)
    out = autoware_msgs.Trajectory(header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id))
    for t, (x, y), heading, speed, accel, rate in zip(profile.t, world, profile.heading, profile.speed, profile.accel,
                                                     profile.heading_rate):
        out.points.append(autoware_msgs.TrajectoryPoint(
            time_from_start=ns_to_duration(int(round(t * NS_PER_S))),
            pose=pose_msg(float(x), float(y), float(heading) + ego_at_stamp.yaw),
            longitudinal_velocity_mps=float(speed), acceleration_mps2=float(accel), heading_rate_rps=float(rate)))
    return out


def invalid_trajectory_msg(stamp_ns: int, ego_frame: str, command: str, reason: str) -> Trajectory:
    """A trajectory that says why there is no plan for this frame (e.g. the decode raised)."""
    return Trajectory(header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=ego_frame), command=command,
                      valid=False, invalid_reason=reason, candidates=0, pdms=math.nan)


def detections_msg(image_header: Header, result: TaskResult, latency_ms: float, stages=None) -> Detection2DArray:
    msg = msg_from(Detection2DArray, result, header=image_header,
                   stats=decode_stats_msg(result, latency_ms, stages, image_header))
    if result.valid:
        msg.detections = [msg_from(Detection2D, box) for box in result.boxes]
    return msg


def vision_detections_msg(vision_msgs, image_header: Header, result: TaskResult):
    """vision_msgs/Detection2DArray (4.x layout) from valid boxes; ``vision_msgs`` is its ``msg`` module."""
    out = vision_msgs.Detection2DArray(header=image_header)
    for b in result.boxes if result.valid else ():
        det = vision_msgs.Detection2D(header=image_header, results=[vision_msgs.ObjectHypothesisWithPose(
            hypothesis=vision_msgs.ObjectHypothesis(class_id=b.label, score=float(b.score)))])
        det.bbox.center.position.x, det.bbox.center.position.y = (b.x_min + b.x_max) / 2.0, (b.y_min + b.y_max) / 2.0
        det.bbox.size_x, det.bbox.size_y = float(b.x_max - b.x_min), float(b.y_max - b.y_min)
        out.detections.append(det)
    return out


def rgb_image_msg(rgb: np.ndarray, header: Header) -> Image:
    height, width = rgb.shape[:2]
    return Image(header=header, height=height, width=width, encoding="rgb8", is_bigendian=0, step=width * 3,
                 data=np.ascontiguousarray(rgb, dtype=np.uint8).tobytes())


def odometry_message(ekf: OdometryFilter, stamp, frame_id: str, child_frame_id: str) -> Odometry:
    """The localization filter's estimate: x / y / yaw pose and speed / yaw-rate twist covariance from the filter,
    ``UNOBSERVED_VARIANCE`` for what a 2-D filter does not estimate (z, roll, pitch, sideways / vertical rates)."""
    s, p = ekf.state, ekf.covariance
    msg = Odometry(header=Header(stamp=stamp, frame_id=frame_id), child_frame_id=child_frame_id)
    msg.pose.pose = pose_msg(s.x, s.y, s.yaw)
    pose_cov = np.diag([0.0, 0.0, UNOBSERVED_VARIANCE, UNOBSERVED_VARIANCE, UNOBSERVED_VARIANCE, 0.0])  # [6, 6]
    # filter state X, Y, YAW -> (x, y, z, roll, pitch, yaw) rows and columns 0, 1, 5
    pose_cov[np.ix_([0, 1, 5], [0, 1, 5])] = p[np.ix_([X, Y, YAW], [X, Y, YAW])]
    msg.pose.covariance = pose_cov.ravel().tolist()
    msg.twist.twist.linear.x = s.speed                # child frame: along the heading
    msg.twist.twist.angular.z = s.yaw_rate
    msg.twist.covariance = np.diag([p[V, V], UNOBSERVED_VARIANCE, UNOBSERVED_VARIANCE, UNOBSERVED_VARIANCE,
                                    UNOBSERVED_VARIANCE, ekf.yaw_rate_variance()]).ravel().tolist()
    return msg


def transform_message(odometry: Odometry):
    """The odometry's pose as one TFMessage: header.frame_id -> child_frame_id, at its stamp."""
    pose = odometry.pose.pose
    t = TransformStamped(header=odometry.header, child_frame_id=odometry.child_frame_id)
    t.transform.translation = Vector3(x=pose.position.x, y=pose.position.y, z=pose.position.z)
    t.transform.rotation = pose.orientation
    return TFMessage(transforms=[t])


PLAN_NS, STATUS_NS = "wam_diff2/plan", "wam_diff2/status"
_GREEN, _RED = ColorRGBA(r=0.1, g=0.9, b=0.2, a=1.0), ColorRGBA(r=0.95, g=0.1, b=0.1, a=1.0)


def plan_markers(stamp_ns: int, ego_frame: str, waypoints_ego: np.ndarray | None, text: str) -> MarkerArray:
    """A line and spheres through the plan (deleted when there is none) and a status text."""
    header = Header(stamp=ns_to_stamp(stamp_ns), frame_id=ego_frame)
    line = Marker(header=header, ns=PLAN_NS, id=0, type=Marker.LINE_STRIP)
    spheres = Marker(header=header, ns=PLAN_NS, id=1, type=Marker.SPHERE_LIST)
    if waypoints_ego is None:
        line.action = spheres.action = Marker.DELETE
    else:
        points = [Point(x=0.0, y=0.0, z=0.0)] + [Point(x=float(x), y=float(y), z=0.0) for x, y in waypoints_ego]
        line.action = spheres.action = Marker.ADD
        line.points, spheres.points = points, points[1:]
        line.scale.x = 0.2
        spheres.scale.x = spheres.scale.y = spheres.scale.z = 0.5
        line.color = spheres.color = _GREEN
        line.pose.orientation.w = spheres.pose.orientation.w = 1.0
    label = Marker(header=header, ns=STATUS_NS, id=0, type=Marker.TEXT_VIEW_FACING, action=Marker.ADD, text=text)
    label.pose.position.z = 3.0
    label.pose.orientation.w = 1.0
    label.scale.z = 0.8
    label.color = _GREEN if waypoints_ego is not None else _RED
    return MarkerArray(markers=[line, spheres, label])
