"""The closed loop's simulator node: the demo world's DDS face as carla-ros-bridge (and, ``bridge``, the
Leaderboard 2.0 bridge and agent) show CARLA, and the messages it publishes (the hostile-input fuzz sends them too):
per tick (:meth:`SimulatorNode.publish_tick`) stamped with the tick's sim time, the route latched; in: the
controls, estimates and plans stamped with each tick, the handshake, the planner's status.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

import cv2
import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry, Path
from rclpy.node import Node
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import CameraInfo, Image, Imu, NavSatFix
from std_msgs.msg import Bool, Header, String

from wam_diff2_core.frame_inputs import stamp_ns
from wam_diff2_core.geometry import quaternion_from_yaw
from wam_diff2_core.routes import ROAD_OPTIONS
from wam_diff2_core.sim.episode_bags import topic_names
from wam_diff2_core.sim.route_runs import RouteRun
from wam_diff2_core.sim.sensors import DemoSensors, SensorReading
from wam_diff2_core.topics import (CARLA_NAMESPACE, CONTROLLER_NODE, PLANNER_NODE, controller_topics,
                                   localization_topics)

from ..conversions import WAYPOINT_DT_NS, ns_to_duration, ns_to_stamp, pose_msg
from ..msg import PlannerStatus, Trajectory, TrajectoryPoint, VehicleControl
from ..optional_msgs import carla_msgs
from ..qos import BRIDGE_QOS, KEEP_ALL_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS, RECEIVE_QOS


def sensor_frame(topic: str) -> str:
    """The bridge's frame of a sensor: its topic without the bridge's namespace (``<role>/<sensor id>``)."""
    return topic.removeprefix(CARLA_NAMESPACE + "/")


def compass_rad(yaw: float) -> float:
    """CARLA's compass (radians clockwise from north, in [0, 2 pi)) of a map-frame heading (x east, y north)."""
    return (math.pi / 2.0 - yaw) % (2.0 * math.pi)


def sensor_messages(reading: SensorReading, stamp, topics: dict[str, str]):
    """One tick of the demo world's GNSS, IMU and speedometer as the Leaderboard 2.0 bridge publishes them:
    each in its own frame (``<role>/<id>``), no covariances and ``NavSatFix.status`` left at the message's
    default (the bridge sets neither), the IMU's orientation from the compass (yaw = pi / 2 - compass), the
    speed a ``carla_msgs/CarlaSpeedometer`` (m/s)."""
    fix = NavSatFix(header=Header(stamp=stamp, frame_id=sensor_frame(topics["gnss"])), latitude=reading.latitude_deg,
                    longitude=reading.longitude_deg, altitude=0.0)
    imu = Imu(header=Header(stamp=stamp, frame_id=sensor_frame(topics["imu"])))
    q = quaternion_from_yaw(math.pi / 2.0 - compass_rad(reading.yaw))
    imu.orientation.x, imu.orientation.y, imu.orientation.z, imu.orientation.w = q
    imu.angular_velocity.x, imu.angular_velocity.y, imu.angular_velocity.z = reading.gyro
    imu.linear_acceleration.x, imu.linear_acceleration.y, imu.linear_acceleration.z = reading.accel
    speed = carla_msgs.CarlaSpeedometer(header=Header(stamp=stamp, frame_id=sensor_frame(topics["speedometer"])),
                                        speed=float(reading.speed_mps))
    return fix, imu, speed


def odometry_message(run: RouteRun, stamp_ns_: int, role: str) -> Odometry:
    """The ego's true odometry as the bridge publishes it: frame ``map``, child ``role``, twist in the child
    frame (a rear axle never slides)."""
    ego = run.world.ego
    msg = Odometry(header=Header(stamp=ns_to_stamp(stamp_ns_), frame_id="map"), child_frame_id=role)
    msg.pose.pose = pose_msg(float(ego.x), float(ego.y), float(ego.yaw))
    msg.twist.twist.linear.x, msg.twist.twist.angular.z = float(ego.speed), float(ego.yaw_rate)
    return msg


def plan_message(stamp_ns_: int, waypoints, frame_id: str, command: str) -> Trajectory:
    """Waypoints (ego frame, 0.5 s apart) as the planner publishes a valid plan."""
    points = [TrajectoryPoint(x=float(x), y=float(y), time_from_start=ns_to_duration((k + 1) * WAYPOINT_DT_NS))
              for k, (x, y) in enumerate(waypoints)]
    return Trajectory(header=Header(stamp=ns_to_stamp(stamp_ns_), frame_id=frame_id), command=command, valid=True,
                      points=points)


def carla_route_messages(run: RouteRun):
    """The route as the Leaderboard 2.0 agent publishes it: ``CarlaRoute`` (map-frame poses, one RoadOption
    each; header left unset) and ``CarlaGnssRoute``. The leaderboard's ``ROS2Agent.set_global_plan`` appends
    the GNSS points to the CarlaRoute it has already published instead of to the CarlaGnssRoute, so the
    bridge's CarlaGnssRoute carries the road options and no coordinates; so does this one."""
    points, options = run.route_with_options()
    route = carla_msgs.CarlaRoute(road_options=[ROAD_OPTIONS[o] for o in options], poses=route_poses(points))
    return route, carla_msgs.CarlaGnssRoute(road_options=list(route.road_options))


def route_poses(points: np.ndarray) -> list:
    """Map-frame poses along a route [N, 2], each heading towards the next point (the last as the one before)."""
    headings = np.arctan2(*np.diff(points, axis=0, append=points[-1:] * 2 - points[-2:-1]).T[::-1])    # [N]
    return [pose_msg(float(x), float(y), float(h)) for (x, y), h in zip(points, headings)]


def camera_messages(run: RouteRun, header: Header) -> tuple[CameraInfo, Image]:
    """The front camera's intrinsics and the tick's frame (``bgra8``, as the bridge's camera)."""
    cam = run.renderer.camera
    info = CameraInfo(header=header, height=cam.height, width=cam.width, distortion_model="plumb_bob", d=[0.0] * 5,
                      k=[cam.fx, 0.0, cam.cx, 0.0, cam.fy, cam.cy, 0.0, 0.0, 1.0],
                      r=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
                      p=[cam.fx, 0.0, cam.cx, 0.0, 0.0, cam.fy, cam.cy, 0.0, 0.0, 0.0, 1.0, 0.0])
    bgra = cv2.cvtColor(run.render(), cv2.COLOR_RGB2BGRA)
    return info, Image(header=header, height=bgra.shape[0], width=bgra.shape[1], encoding="bgra8", is_bigendian=0,
                       step=4 * bgra.shape[1], data=bgra.tobytes())


class SimulatorNode(Node):
    """The simulator's DDS face: sensors out, controls in, plus the oracle's planner topics."""

    def __init__(self, role: str, odometry: str = "true", bridge: bool = False, **kwargs: Any):
        super().__init__("wam_diff2_sim", **kwargs)
        self.sensors = t = topic_names(role)
        self.control_topics = c = controller_topics(role)
        self.localization_topics = loc = localization_topics(role)
        self.role, self.bridge, self.estimated = role, bridge, odometry == "estimated"
        self._cond = threading.Condition(threading.Lock())
        self.received: dict[str, dict[int, Any]] = {      # what arrived, by kind and stamp, until taken
            kind: {} for kind in ("control", "carla_control", "estimate", "trajectory")}
        self.ready_at: float | None = None          # wall time of the leaderboard status True
        self.planner_ready_at: float | None = None  # wall time the planner's READY was seen
        self.planner_diagnostics: dict[str, str] = {}   # the planner's newest /diagnostics key/values
        self.clock_pub = self.create_publisher(ClockMsg, "/clock", BRIDGE_QOS)
        self.odometry_pub = self.gnss_pub = self.imu_pub = self.speed_pub = None
        if self.estimated:              # GNSS, IMU, speedometer out; the localization node's odometry in
            self.gnss_pub = self.create_publisher(NavSatFix, loc["gnss"], BRIDGE_QOS)
            self.imu_pub = self.create_publisher(Imu, loc["imu"], BRIDGE_QOS)
            self.speed_pub = self.create_publisher(carla_msgs.CarlaSpeedometer, loc["speedometer"], BRIDGE_QOS)
            self.estimate_sub = self.create_subscription(Odometry, t["odometry"], self._keeper("estimate"),
                                                         RECEIVE_QOS)
        else:
            self.odometry_pub = self.create_publisher(Odometry, t["odometry"], BRIDGE_QOS)
        # the bridge's camera: reliable, depth 10; otherwise keep all, so that no image is ever lost
        self.image_pub = self.create_publisher(Image, t["image"], BRIDGE_QOS if bridge else KEEP_ALL_QOS)
        self.info_pub = self.create_publisher(CameraInfo, t["camera_info"], BRIDGE_QOS)
        if bridge:                      # the leaderboard's agent: the route out, CARLA's control in
            self.route_pub = self.create_publisher(carla_msgs.CarlaRoute, c["carla_route"], LATCHED_QOS)
            self.gnss_route_pub = self.create_publisher(carla_msgs.CarlaGnssRoute, f"{c['carla_route']}_gnss",
                                                        LATCHED_QOS)
            self.carla_control_sub = self.create_subscription(
                carla_msgs.CarlaEgoVehicleControl, c["carla_control"], self._keeper("carla_control"),
                LATEST_RELIABLE_QOS)
        else:
            self.route_pub = self.create_publisher(Path, t["route"], LATCHED_QOS)
        self.command_pub = self.create_publisher(String, c["command"], LATEST_RELIABLE_QOS)
        self.oracle_plan_pub = self.create_publisher(Trajectory, c["trajectory"], LATEST_RELIABLE_QOS)
        self.oracle_status_pub = self.create_publisher(PlannerStatus, c["planner_status"], LATCHED_QOS)
        self.control_sub = self.create_subscription(VehicleControl, f"/{CONTROLLER_NODE}/output/control",
                                                    self._keeper("control"), RECEIVE_QOS)
        self.trajectory_sub = self.create_subscription(Trajectory, c["trajectory"], self._keeper("trajectory"),
                                                       RECEIVE_QOS)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, RECEIVE_QOS)
        self.create_subscription(Bool, c["leaderboard_status"], self._on_ready, LATCHED_QOS)
        self.create_subscription(PlannerStatus, c["planner_status"], self._on_planner_status, LATCHED_QOS)

    def _keeper(self, kind: str) -> Callable[[Any], None]:
        def keep(msg) -> None:
            with self._cond:
                self.received[kind][stamp_ns(msg.header.stamp)] = msg
                self._cond.notify_all()
        return keep

    def take(self, kind: str, stamp: int, timeout_s: float):
        """The ``kind`` message stamped ``stamp``, waiting up to ``timeout_s`` (None: none came); it and every
        older one are dropped."""
        msg = self.wait(lambda: self.received[kind].get(stamp), timeout_s)
        self.take_until(kind, stamp)
        return msg

    def take_until(self, kind: str, stamp: int) -> list[Any]:
        """The ``kind`` messages stamped up to ``stamp``, dropped."""
        with self._cond:
            store = self.received[kind]
            self.received[kind] = {k: v for k, v in store.items() if k > stamp}
            return [v for k, v in store.items() if k <= stamp]

    def _on_ready(self, msg: Bool) -> None:
        with self._cond:
            if msg.data and self.ready_at is None:
                self.ready_at = time.monotonic()
            self._cond.notify_all()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.startswith(f"{PLANNER_NODE}:"):
                with self._cond:
                    self.planner_diagnostics = {kv.key: kv.value for kv in status.values}
                    self._cond.notify_all()

    def _on_planner_status(self, msg: PlannerStatus) -> None:
        with self._cond:
            if msg.state == PlannerStatus.READY and self.planner_ready_at is None:
                self.planner_ready_at = time.monotonic()
            self._cond.notify_all()

    def wait(self, predicate, timeout_s: float):
        """``predicate()`` once true (its value), or its value after ``timeout_s``; every change it reads notifies."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def publish_route(self, run: RouteRun) -> None:
        if self.bridge:
            route, gnss_route = carla_route_messages(run)
            self.route_pub.publish(route)
            self.gnss_route_pub.publish(gnss_route)
            return
        header = Header(stamp=ns_to_stamp(run.stamp_ns), frame_id="map")
        self.route_pub.publish(Path(header=header, poses=[PoseStamped(header=header, pose=pose)
                                                          for pose in route_poses(run.route_xy())]))

    def publish_tick(self, run: RouteRun, command: str | None, camera: bool,
                     sensors: DemoSensors | None = None) -> None:
        """/clock, odometry (or, with ``sensors``, GNSS + speedometer + IMU), the command and (when ``camera``)
        camera_info + image for the tick, in that order."""
        stamp = ns_to_stamp(run.stamp_ns)
        self.clock_pub.publish(ClockMsg(clock=stamp))
        if sensors is not None:
            fix, imu, speed = sensor_messages(sensors.read(run.world.ego), stamp, self.localization_topics)
            self.gnss_pub.publish(fix)
            self.speed_pub.publish(speed)
            self.imu_pub.publish(imu)
        else:
            self.odometry_pub.publish(odometry_message(run, run.stamp_ns, self.role))
        if command is not None:
            self.command_pub.publish(String(data=command))
        if camera:
            header = Header(stamp=stamp, frame_id=sensor_frame(self.sensors["image"].removesuffix("/image")))
            info, image = camera_messages(run, header)
            self.info_pub.publish(info)
            self.image_pub.publish(image)
