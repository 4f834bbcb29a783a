"""rosbag2 recordings of demo-world episodes that look like carla-ros-bridge recordings (the topics, their
order within a tick, the image last, and their frames: sim/README.md, "Exports"), written with
:mod:`~wam_diff2_core.evaluation.bag_writer`'s rosbags writer (``mcap`` or ``sqlite3``). The ego frame
(``hero``) is the **rear axle**, the origin of the waypoints' ego frame, not CARLA's box centre.

    with EpisodeBagWriter(path, "mcap", role="hero", camera=camera, mount=mount) as writer:
        writer.write_route(stamp_ns, lane_points)
        writer.write_tick(stamp_ns, pose, speed, yaw_rate)
        writer.write_objects(stamp_ns, vehicles)            # world.vehicle_boxes() of that tick
        writer.write_frame(stamp_ns, rgb, "left")
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

from ..evaluation import bag_messages as msg
from ..evaluation.bag_writer import new_writer, offered_qos
from ..evaluation.derived_objects import OBJECT_ARRAY_TYPE, object_array_msg, object_types
from ..topics import DEFAULT_COMMAND_TOPIC, carla_topics
from ..geometry import CameraMount, PinholeCamera, quaternion_from_yaw


def topic_names(role: str, command_topic: str = DEFAULT_COMMAND_TOPIC) -> dict[str, str]:
    """carla-ros-bridge topic names for an ego ``role``, plus the planner node's command input."""
    carla = carla_topics(role)
    return {"clock": "/clock", "tf": "/tf", "odometry": carla["odometry"], "objects": carla["objects"],
            "route": carla["route"], "command": command_topic, "camera_info": carla["camera_info"],
            "image": carla["image"]}


TOPIC_TYPES = {
    "clock": "rosgraph_msgs/msg/Clock",
    "tf": "tf2_msgs/msg/TFMessage",
    "odometry": "nav_msgs/msg/Odometry",
    "objects": OBJECT_ARRAY_TYPE,
    "route": "nav_msgs/msg/Path",
    "command": "std_msgs/msg/String",
    "camera_info": "sensor_msgs/msg/CameraInfo",
    "image": "sensor_msgs/msg/Image",
}


def quaternion_from_rpy(roll: float, pitch: float, yaw: float) -> tuple[float, float, float, float]:
    """(x, y, z, w) of R = Rz(yaw) Ry(pitch) Rx(roll), as CameraMount.rotation()."""
    cr, sr = math.cos(roll / 2), math.sin(roll / 2)
    cp, sp = math.cos(pitch / 2), math.sin(pitch / 2)
    cy, sy = math.cos(yaw / 2), math.sin(yaw / 2)
    return (sr * cp * cy - cr * sp * sy, cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy, cr * cp * cy + sr * sp * sy)


class EpisodeBagWriter:
    """One episode as one rosbag2 recording; use as a context manager."""

    def __init__(self, path: str | Path, storage: str, *, role: str, camera: PinholeCamera, mount: CameraMount,
                 command_topic: str = DEFAULT_COMMAND_TOPIC):
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        self.camera, self.mount = camera, mount
        self.frames = {"map": "map", "ego": role, "camera": f"{role}/rgb_front"}
        self.typestore = get_typestore(Stores.ROS2_KILTED)
        self.typestore.register(object_types())     # carla-ros-bridge's derived_object_msgs, as installed
        self.writer = new_writer(self.path, storage)
        self.topics = topic_names(role, command_topic)
        self.connections = {}
        self._msg = self.typestore.types
        self.counts = {key: 0 for key in TOPIC_TYPES}

    def __enter__(self) -> "EpisodeBagWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer.open()
        for key, msgtype in TOPIC_TYPES.items():     # the route latched, as carla-ros-bridge publishes it
            self.connections[key] = self.writer.add_connection(
                self.topics[key], msgtype, typestore=self.typestore,
                offered_qos_profiles=offered_qos(latched=key == "route", depth=10))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # rosbags writes metadata.yaml on close; after an error the caller discards the folder
        self.writer.close()

    def _write(self, key: str, stamp_ns: int, msg) -> None:
        data = self.typestore.serialize_cdr(msg, TOPIC_TYPES[key])
        self.writer.write(self.connections[key], stamp_ns, data)
        self.counts[key] += 1

    def write_route(self, stamp_ns: int, points: np.ndarray) -> None:
        """The route as a Path in the map frame: points [N, 2], each pose facing the next point."""
        points = np.asarray(points, dtype=np.float64)
        deltas = np.diff(points, axis=0, append=points[-1:] + (points[-1:] - points[-2:-1]))
        headings = np.arctan2(deltas[:, 1], deltas[:, 0])
        route = msg.path(self._msg, msg.header(self._msg, stamp_ns, self.frames["map"]),
                         [(stamp_ns, x, y, h) for (x, y), h in zip(points, headings)])
        self._write("route", stamp_ns, route)

    def write_tick(self, stamp_ns: int, pose: Sequence[float], speed: float, yaw_rate: float) -> None:
        """/clock, /tf and odometry for one tick; ``pose`` = (x, y, yaw) of the rear axle in the map frame."""
        m = self._msg
        header = msg.header(m, stamp_ns, self.frames["map"])
        self._write("clock", stamp_ns, m["rosgraph_msgs/msg/Clock"](clock=header.stamp))
        x, y, yaw = (float(v) for v in pose)
        mount = self.mount
        tf_ego = msg.transform(m, header, self.frames["ego"], (x, y, 0.0), quaternion_from_yaw(yaw))
        rpy = (math.radians(a) for a in (mount.roll_deg, mount.pitch_deg, mount.yaw_deg))
        tf_camera = msg.transform(m, msg.header(m, stamp_ns, self.frames["ego"]), self.frames["camera"],
                                  (mount.x_m, mount.y_m, mount.z_m), quaternion_from_rpy(*rpy))
        self._write("tf", stamp_ns, m["tf2_msgs/msg/TFMessage"](transforms=[tf_ego, tf_camera]))
        self._write("odometry", stamp_ns, msg.odometry(m, header, self.frames["ego"], (x, y, yaw), (speed, 0.0),
                                                       yaw_rate))

    def write_objects(self, stamp_ns: int, vehicles: Sequence) -> None:
        """``World.vehicle_boxes()`` of one tick as carla-ros-bridge's ``ObjectArray`` (frame map): box centre at half
        height, yaw, [length, width, height], velocity in the map frame."""
        objects = [{"id": v.id, "label": v.label, "x": v.x, "y": v.y, "z": v.height_m / 2, "yaw": v.yaw,
                    "length_m": v.length_m, "width_m": v.width_m, "height_m": v.height_m,
                    "vx": v.speed * math.cos(v.yaw), "vy": v.speed * math.sin(v.yaw)} for v in vehicles]
        self._write("objects", stamp_ns, object_array_msg(self._msg, msg.header(self._msg, stamp_ns, self.frames["map"]),
                                                          objects))

    def write_frame(self, stamp_ns: int, rgb: np.ndarray, command: str) -> None:
        """The command, camera_info and the bgra8 image of one camera frame."""
        m, cam = self._msg, self.camera
        self._write("command", stamp_ns, m["std_msgs/msg/String"](data=command))
        header = msg.header(m, stamp_ns, self.frames["camera"])
        self._write("camera_info", stamp_ns, msg.camera_info(m, header, cam.width, cam.height, cam.fx, cam.fy, cam.cx,
                                                             cam.cy))
        self._write("image", stamp_ns, msg.bgra8_image(m, header, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGRA)))
