"""ROS messages from plain values, as a typestore's classes (``T``: a rosbags typestore's ``types``, message type
name -> class): the one place the bags written here (the demo world's, the test scenes', eval-bag's
predictions) build their headers, poses, transforms, odometry and camera messages.

    T = default_typestore().types
    odometry(T, header(T, t_ns, "map"), "ego_vehicle", (x, y, yaw), (vx, vy), yaw_rate)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..frame_inputs import NS_PER_S
from ..geometry import quaternion_from_yaw


def stamp(T, t_ns: int):
    return T["builtin_interfaces/msg/Time"](sec=int(t_ns // NS_PER_S), nanosec=int(t_ns % NS_PER_S))


def header(T, t_ns: int, frame_id: str):
    return T["std_msgs/msg/Header"](stamp=stamp(T, t_ns), frame_id=frame_id)


def vector(T, x: float, y: float, z: float):
    return T["geometry_msgs/msg/Vector3"](x=float(x), y=float(y), z=float(z))


def quaternion(T, q: Sequence[float]):
    x, y, z, w = (float(v) for v in q)
    return T["geometry_msgs/msg/Quaternion"](x=x, y=y, z=z, w=w)


def pose(T, x: float, y: float, yaw: float, z: float = 0.0):
    """A ``Pose`` at (x, y, z) heading ``yaw`` about z."""
    return T["geometry_msgs/msg/Pose"](position=T["geometry_msgs/msg/Point"](x=float(x), y=float(y), z=float(z)),
                                       orientation=quaternion(T, quaternion_from_yaw(float(yaw))))


def transform(T, head, child_frame_id: str, xyz: Sequence[float], q: Sequence[float]):
    """``geometry_msgs/TransformStamped``: the child frame at ``xyz`` turned by the quaternion ``q`` (x, y, z, w)."""
    return T["geometry_msgs/msg/TransformStamped"](
        header=head, child_frame_id=child_frame_id,
        transform=T["geometry_msgs/msg/Transform"](translation=vector(T, *xyz), rotation=quaternion(T, q)))


def odometry(T, head, child_frame_id: str, xy_yaw: Sequence[float], velocity: Sequence[float], yaw_rate: float):
    """``nav_msgs/Odometry``: the pose (x, y, yaw) in the header's frame, the twist (vx, vy, yaw rate) in the
    child frame, zero covariances."""
    zeros = np.zeros(36, dtype=np.float64)
    return T["nav_msgs/msg/Odometry"](
        header=head, child_frame_id=child_frame_id,
        pose=T["geometry_msgs/msg/PoseWithCovariance"](pose=pose(T, *xy_yaw), covariance=zeros),
        twist=T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](linear=vector(T, velocity[0], velocity[1], 0.0),
                                               angular=vector(T, 0.0, 0.0, yaw_rate)),
            covariance=zeros))


def camera_info(T, head, width: int, height: int, fx: float, fy: float, cx: float, cy: float):
    """``sensor_msgs/CameraInfo`` of a pinhole camera without distortion (plumb_bob, zeros)."""
    return T["sensor_msgs/msg/CameraInfo"](
        header=head, height=height, width=width, distortion_model="plumb_bob", d=np.zeros(5),
        k=np.array([fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]), r=np.eye(3).ravel(),
        p=np.array([fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0]), binning_x=0, binning_y=0,
        roi=T["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))


def bgra8_image(T, head, bgra: np.ndarray):
    """``sensor_msgs/Image`` of [H, W, 4] uint8 BGRA pixels."""
    height, width = bgra.shape[:2]
    return T["sensor_msgs/msg/Image"](header=head, height=height, width=width, encoding="bgra8", is_bigendian=0,
                                      step=4 * width, data=bgra.reshape(-1))


def path(T, head, poses: Sequence[tuple[int, float, float, float]]):
    """``nav_msgs/Path`` of (stamp ns, x, y, yaw) poses in the header's frame."""
    return T["nav_msgs/msg/Path"](header=head, poses=[
        T["geometry_msgs/msg/PoseStamped"](header=header(T, t_ns, head.frame_id), pose=pose(T, x, y, yaw))
        for t_ns, x, y, yaw in poses])
