"""Small carla-ros-bridge-like bags from analytic ego motions, with exactly known ground truth (the
evaluator's and the replay tool's tests): a ``bgra8`` camera (+ camera_info), odometry
(frame ``map``, twist in the child frame ``ROLE``), optionally a latched route, commands and other agents
(``ObjectArray`` at the odometry rate), every message logged at its header stamp.

    scene = straight_scene(speed_mps=8.0, duration_s=6.0)
    write_scene_bag("straight_bag", scene, storage="mcap")
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from wam_diff2_core.evaluation import bag_messages as msg
from wam_diff2_core.evaluation.bag_types import default_typestore
from wam_diff2_core.evaluation.bag_writer import write_bag
from wam_diff2_core.evaluation.bags import BagTopics
from wam_diff2_core.evaluation.derived_objects import OBJECT_ARRAY_TYPE, object_array_msg
from wam_diff2_core.topics import DEFAULT_ROLE

START_NS = 1_000 * 1_000_000_000        # scenes start at t = 1000 s (a zero stamp means "unstamped")


@dataclass
class Scene:
    pose: Callable[[float], tuple[float, float, float]]          # t (s from start) -> x, y, yaw (map)
    twist: Callable[[float], tuple[float, float, float]]         # t -> vx, vy (ego frame), yaw rate
    duration_s: float = 6.0
    camera_hz: float = 20.0
    odometry_hz: float = 50.0
    image_size: tuple[int, int] = (32, 48)                       # height, width
    route: np.ndarray | None = None                              # [N, 2] map frame
    commands: Sequence[tuple[float, str]] = ()                   # (t, text): published at t - 1 ms
    role: str = DEFAULT_ROLE
    camera_log_delay_s: float = 0.0                              # images logged this long after their stamp
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # t -> other agents in the map frame: dicts id, x, y, yaw, length_m, width_m (published with the odometry)
    objects: Callable[[float], list[dict[str, Any]]] | None = None

    @property
    def topics(self) -> BagTopics:
        return BagTopics.carla(self.role)

    def camera_times_ns(self) -> list[int]:
        return self._times_ns(self.camera_hz)

    def odometry_times_ns(self) -> list[int]:
        return self._times_ns(self.odometry_hz)

    def _times_ns(self, hz: float) -> list[int]:
        return [START_NS + round(i * 1e9 / hz) for i in range(int(math.floor(self.duration_s * hz + 1e-9)) + 1)]


def straight_scene(speed_mps: float = 8.0, yaw: float = 0.0, origin=(10.0, -5.0), **kw) -> Scene:
    """Constant velocity along a straight line at heading ``yaw``."""
    c, s = math.cos(yaw), math.sin(yaw)
    kw.setdefault("route", np.array([[origin[0] + c * d, origin[1] + s * d] for d in np.arange(-20.0, 400.0, 5.0)]))
    return Scene(pose=lambda t: (origin[0] + c * speed_mps * t, origin[1] + s * speed_mps * t, yaw),
                 twist=lambda t: (speed_mps, 0.0, 0.0), **kw)


def accelerating_scene(start_speed_mps: float = 4.0, accel_mps2: float = 1.0, yaw: float = 0.0, origin=(10.0, -5.0),
                       **kw) -> Scene:
    """Constant acceleration from ``start_speed_mps`` along a straight line at heading ``yaw``."""
    c, s = math.cos(yaw), math.sin(yaw)

    def distance(t):
        return start_speed_mps * t + 0.5 * accel_mps2 * t * t

    return Scene(pose=lambda t: (origin[0] + c * distance(t), origin[1] + s * distance(t), yaw),
                 twist=lambda t: (start_speed_mps + accel_mps2 * t, 0.0, 0.0), **kw)


def circle_scene(radius_m: float = 30.0, speed_mps: float = 6.0, left: bool = True, **kw) -> Scene:
    """Constant speed on a circle (turning left when ``left``), starting at the origin heading +x."""
    sign = 1.0 if left else -1.0
    omega = sign * speed_mps / radius_m

    def pose(t):
        a = omega * t
        return radius_m * math.sin(abs(a)), sign * radius_m * (1.0 - math.cos(a)), a

    return Scene(pose=pose, twist=lambda t: (speed_mps, 0.0, omega), **kw)


def frame_image(scene: Scene, index: int) -> np.ndarray:
    """[H, W, 4] bgra8 pixels for camera frame ``index`` (deterministic noise, different per frame)."""
    h, w = scene.image_size
    rng = np.random.default_rng(scene.seed * 100_003 + index)
    bgra = (rng.random((h, w, 4)) * 255).astype(np.uint8)
    bgra[..., 3] = 255
    return bgra


def scene_messages(scene: Scene, types) -> Iterator[tuple[str, int, Any]]:
    """(topic, log time ns, rosbags message), in log-time order."""
    topics, T = scene.topics, types
    events: list[tuple[int, int, str, Any]] = []     # (time, order, topic, message)
    if scene.route is not None:
        route = msg.path(T, msg.header(T, START_NS, "map"), [(START_NS, x, y, 0.0) for x, y in scene.route])
        events.append((START_NS - 10_000_000, 0, topics.route, route))
    for t, text in scene.commands:
        t_ns = START_NS + round(t * 1e9) - 1_000_000
        events.append((t_ns, 1, topics.command, T["std_msgs/msg/String"](data=text)))
    h, w = scene.image_size
    for t_ns in scene.odometry_times_ns():
        t = (t_ns - START_NS) / 1e9
        vx, vy, wz = scene.twist(t)
        odom = msg.odometry(T, msg.header(T, t_ns, "map"), scene.role, scene.pose(t), (vx, vy), wz)
        events.append((t_ns, 2, topics.odometry, odom))
        if scene.objects is not None:
            agents = [{"label": "car", "z": 0.75, "height_m": 1.5, "vx": 0.0, "vy": 0.0, **o} for o in scene.objects(t)]
            events.append((t_ns, 2, topics.objects, object_array_msg(T, msg.header(T, t_ns, "map"), agents)))
    for index, t_ns in enumerate(scene.camera_times_ns()):
        head = msg.header(T, t_ns, f"{scene.role}/rgb_front")
        log_ns = t_ns + round(scene.camera_log_delay_s * 1e9)
        events.append((log_ns, 3, topics.camera_info, msg.camera_info(T, head, w, h, w / 2.0, w / 2.0, w / 2, h / 2)))
        events.append((log_ns, 4, topics.image, msg.bgra8_image(T, head, frame_image(scene, index))))
    events.sort(key=lambda e: (e[0], e[1]))
    for t_ns, _, topic, message in events:
        yield topic, t_ns, message


def scene_topic_types(scene: Scene) -> dict[str, str]:
    t = scene.topics
    types = {t.image: "sensor_msgs/msg/Image", t.camera_info: "sensor_msgs/msg/CameraInfo",
             t.odometry: "nav_msgs/msg/Odometry"}
    if scene.route is not None:
        types[t.route] = "nav_msgs/msg/Path"
    if scene.commands:
        types[t.command] = "std_msgs/msg/String"
    if scene.objects is not None:
        types[t.objects] = OBJECT_ARRAY_TYPE
    return types


def write_scene_bag(path: str | Path, scene: Scene, storage: str = "mcap",
                    transform: Callable[[Iterator[tuple[str, int, Any]]], Iterator[tuple[str, int, Any]]] | None = None,
                    ) -> Path:
    """Write ``scene`` as a rosbag2 folder; ``transform`` may edit the message stream (bad-input tests)."""
    store = default_typestore()
    messages = scene_messages(scene, store.types)
    if transform is not None:
        messages = transform(messages)
    latched = [scene.topics.route] if scene.route is not None else []
    return write_bag(path, scene_topic_types(scene), messages, storage=storage, typestore=store, latched=latched)
