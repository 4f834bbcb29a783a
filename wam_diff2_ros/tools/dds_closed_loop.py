"""The demo world behind carla-ros-bridge topics, driven by the planner and controller nodes over DDS
(``wam-diff2-ros closed-loop``).

    with RosClosedLoop(RosLoopSettings(planner="inprocess", model_path="ckpt/")) as loop:
        result = loop.run_route(RouteRun(0, ClosedLoopSettings()))

What runs (all in one DDS domain; the planner optionally in its own process; topics named by their keys in
``wam_diff2_core.topics``' tables of the role, the bridge's names):

- **the simulator** (:class:`SimulatorNode`, this process): per tick it publishes ``/clock``,
  ``odometry`` (frame ``map``, child ``<role>``, twist in the child frame), the
  command (``command_source`` world: the demo world's rule, on the planner's
  ``input/command``, as the demo bags carry it), the front camera's ``camera_info`` and
  ``image`` (``bgra8``), all stamped with the tick's sim time, and once
  per route the latched ``route`` (``nav_msgs/Path``). With
  ``odometry="estimated"`` it publishes no odometry but the tick's GNSS / speedometer / IMU
  (``gnss``, ``speedometer``, ``imu``; ``wam_diff2_core.sim.sensors``, with noise),
  a :class:`~wam_diff2_ros.localization_node.LocalizationNode` in this process turns them into
  ``odometry``, and the simulator scores each tick's estimate against the truth. Like the
  leaderboard, it starts only after a latched ``std_msgs/Bool`` on ``leaderboard_status``
  (and, unlike it, once every topic is matched at both ends, so that no image is lost: the
  lockstep planner counts them; its images go reliable, keep all), then waits up to
  ``control_timeout_s`` (1.0 s) of wall time for the control stamped with the tick (none: an
  empty control, as the leaderboard applies) and integrates it.
- **the planner** (``wam_diff2_ros.planner.node.PlannerNode``, lockstep mode, every N-th image,
  ``use_sim_time``): in this process (``planner="inprocess"``) or as ``wam-diff2-planner`` in a
  subprocess (``"subprocess"``); or, to test the loop without a model, **the oracle**
  (``"oracle"``): the simulator itself publishes the demo world's expert future on the
  planner's trajectory topic and a READY planner status - an oracle, not a planner.
- **the controller** (``wam_diff2_ros.controller_node.ControllerNode``, this process): newest
  plan + odometry -> control every tick, the leaderboard handshake, and (``command_source``
  route) the command from the route.

**The Leaderboard 2.0 bridge** (``bridge``, ``--bridge``): the simulator publishes what the leaderboard-2.0
carla-ros-bridge and the leaderboard's ``ROS2Agent`` publish on the SENSORS track (the sensors above, each in
its frame ``<role>/<id>``, reliable depth 10, the GNSS status unset, the IMU orientation from the compass,
``carla_msgs/CarlaSpeedometer``; camera and ``/clock``; ``CarlaRoute`` / ``CarlaGnssRoute`` latched on
``global_plan`` / ``global_plan_gnss``), applies the ``CarlaEgoVehicleControl`` of each tick, and starts the
localization, planner and controller nodes with the parameters ``launch/leaderboard.launch.py`` passes for the
agent's arguments (both from ``wam_diff2_core.params.leaderboard``).

Timing: ``lockstep`` waits, on each planning tick, for that tick's trajectory before the world
moves on (results do not depend on how fast the model runs here); ``leaderboard`` waits only
for the control, as the leaderboard does, and ticks no faster than ``realtime_factor`` x real
time, so a slow planner's plans arrive late and go stale (and the controller brakes).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import rclpy
import yaml
from geometry_msgs.msg import Pose, PoseStamped
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry, Path
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import CameraInfo, Image, Imu, NavSatFix
from std_msgs.msg import Bool, Header, String

from wam_diff2_core.control import ControllerGains, Plan
from wam_diff2_core.geometry import quaternion_from_yaw, wrap_angle, yaw_from_quaternion
from wam_diff2_core.frame_inputs import stamp_ns
from wam_diff2_core.localization.measurements import SensorNoise
from wam_diff2_core.params.controller import DEFAULTS as CONTROLLER_DEFAULTS
from wam_diff2_core.params.leaderboard import AGENT_ARGUMENTS, launch_values, resolve_nodes
from wam_diff2_core.routes import ROAD_OPTIONS
from wam_diff2_core.sim.episode_bags import topic_names
from wam_diff2_core.sim.route_planners import ExpertOracle
from wam_diff2_core.sim.route_runs import RouteResult, RouteRun
from wam_diff2_core.sim.sensors import DEMO_NOISE, DemoSensors, SensorReading, error_summary, route_sensors
from wam_diff2_core.topics import (CARLA_NAMESPACE, CONTROLLER_NODE, LOCALIZATION_NODE, PLANNER_NODE, controller_topics,
                                   localization_topics)

from ..controller_node import GAINS_PREFIX, ControllerNode
from ..optional_msgs import carla_msgs
from ..conversions import ns_to_stamp
from ..localization_node import LocalizationNode
from ..msg import PlannerStatus, Trajectory, TrajectoryPoint, VehicleControl
from ..qos import BRIDGE_QOS, KEEP_ALL_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS, RECEIVE_QOS

PLANNERS = ("inprocess", "subprocess", "oracle")
ODOMETRY_SOURCES = ("true", "estimated")
TIMINGS = ("lockstep", "leaderboard")
READY_REORDER_S = 0.05


@dataclass
class RosLoopSettings:
    role: str = "hero"                       # the leaderboard's role name
    planner: str = "oracle"                  # inprocess | subprocess | oracle
    model_path: str = ""
    planner_parameters: dict[str, Any] = field(default_factory=dict)   # extra planner parameters (decoding.*, device)
    lockstep_n: int = 10
    timing: str = "lockstep"
    command_source: str = "world"            # world: the simulator publishes the command; route: the controller
    gains: ControllerGains = field(default_factory=ControllerGains)
    control_timeout_s: float = 1.0           # the leaderboard's wall wait for each control
    plan_timeout_s: float = 300.0            # lockstep timing: wall wait for a planning tick's trajectory
    ready_timeout_s: float = 900.0           # wall wait for the handshake (model load + warm-up)
    realtime_factor: float = 1.0             # leaderboard timing: at most this x real time
    domain_id: int | None = None             # None: ROS_DOMAIN_ID or 0
    odometry: str = "true"                   # true: the simulator's odometry; estimated: the localization node's
                                             # from the demo world's GNSS / IMU / speedometer
    sensor_noise: SensorNoise = DEMO_NOISE   # odometry estimated: the sensors' noise
    pacing: str = CONTROLLER_DEFAULTS["pacing"]   # the controller's pacing (hold | newest)
    planner_slowdown: float = 1.0            # inprocess: each plan takes this many times as long (a test hook:
                                             # it sleeps (slowdown - 1) x its decode time), to measure pacing
    bridge: bool = False                     # the Leaderboard 2.0 bridge and agent: CarlaRoute, CarlaEgoVehicleControl,
                                             # the nodes as launch/leaderboard.launch.py starts them (needs
                                             # odometry estimated and command_source route, as the SENSORS track)

    def __post_init__(self):
        if self.planner not in PLANNERS:
            raise ValueError(f"planner: {self.planner!r} is not one of {', '.join(PLANNERS)}")
        if self.odometry not in ODOMETRY_SOURCES:
            raise ValueError(f"odometry: {self.odometry!r} is not one of {', '.join(ODOMETRY_SOURCES)}")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing: {self.timing!r} is not one of {', '.join(TIMINGS)}")
        if self.planner != "oracle" and not self.model_path:
            raise ValueError("model_path: empty; the planner needs a checkpoint (or use planner='oracle')")
        if self.lockstep_n < 1:
            raise ValueError(f"lockstep_n: must be >= 1, got {self.lockstep_n}")
        if not math.isfinite(self.planner_slowdown) or self.planner_slowdown < 1.0 or (
                self.planner_slowdown != 1.0 and self.planner != "inprocess"):
            raise ValueError(f"planner_slowdown: {self.planner_slowdown!r} must be >= 1 (and != 1 only with the "
                             f"inprocess planner, got {self.planner!r})")
        if self.bridge and (self.odometry, self.command_source) != ("estimated", "route"):
            raise ValueError(f"bridge: the SENSORS track has no odometry and the agent tracks the route itself: needs "
                             f"odometry 'estimated' and command_source 'route', got {self.odometry!r} and "
                             f"{self.command_source!r}")
        if (self.bridge or self.odometry == "estimated") and carla_msgs is None:
            raise ValueError("bridge / odometry estimated: the bridge's carla_msgs is not importable "
                             "(scripts/build_ros_interfaces.sh, then . scripts/env.sh)")


def planner_ros_arguments(role: str, lockstep_n: int, model_path: str, extra: dict[str, Any]) -> tuple[dict, list]:
    """(parameters, remap rules) of the planner for the simulator's topics: lockstep, sim time, reliable images,
    no debug outputs."""
    topics = topic_names(role)
    # images reliable: a lost image would shift which ticks the planner plans on (it counts images)
    params = {"model_path": model_path, "use_sim_time": True, "mode": "lockstep", "lockstep_every_n_images": lockstep_n,
              "image_reliability": "reliable", "tasks": "plan", "debug.publish_image": False,
              "debug.publish_markers": False, "publish_odom_frame_path": False, **extra}
    planner = f"/{PLANNER_NODE}"
    remaps = [f"{planner}/input/image:={topics['image']}", f"{planner}/input/camera_info:={topics['camera_info']}",
              f"{planner}/input/odometry:={topics['odometry']}", f"{planner}/input/route:={topics['route']}"]
    return params, remaps


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


def carla_route_messages(run: RouteRun):
    """The route as the Leaderboard 2.0 agent publishes it: ``CarlaRoute`` (map-frame poses, one RoadOption
    each; header left unset) and ``CarlaGnssRoute``. The leaderboard's ``ROS2Agent.set_global_plan`` appends
    the GNSS points to the CarlaRoute it has already published instead of to the CarlaGnssRoute, so the
    bridge's CarlaGnssRoute carries the road options and no coordinates; so does this one."""
    points, options = run.route_with_options()
    route = carla_msgs.CarlaRoute(road_options=[ROAD_OPTIONS[o] for o in options],
                                  poses=[route_pose(x, y, h) for (x, y), h in zip(points, route_headings(points))])
    return route, carla_msgs.CarlaGnssRoute(road_options=list(route.road_options))


def route_headings(points: np.ndarray) -> np.ndarray:
    """The heading at each route point [N] (towards the next; the last repeats the one before)."""
    return np.arctan2(*np.diff(points, axis=0, append=points[-1:] * 2 - points[-2:-1]).T[::-1])


def route_pose(x: float, y: float, heading: float) -> Pose:
    pose = Pose()
    pose.position.x, pose.position.y = float(x), float(y)
    pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = quaternion_from_yaw(float(heading))
    return pose


class SimulatorNode(Node):
    """The simulator's DDS face: sensors out, controls in, plus the oracle's planner topics."""

    def __init__(self, role: str, odometry: str = "true", bridge: bool = False, **kwargs: Any):
        super().__init__("wam_diff2_sim", **kwargs)
        self.sensors = topic_names(role)
        self.control_topics = controller_topics(role)
        t, c = self.sensors, self.control_topics
        self.bridge = bridge
        self.clock_pub = self.create_publisher(ClockMsg, "/clock", BRIDGE_QOS)
        self.estimated = odometry == "estimated"
        self.odometry_pub = self.gnss_pub = self.imu_pub = self.speed_pub = None
        self.estimates: dict[int, Odometry] = {}
        self.localization_topics = localization_topics(role)
        if self.estimated:              # GNSS, IMU, speedometer out; the localization node's odometry in
            loc = self.localization_topics
            self.gnss_pub = self.create_publisher(NavSatFix, loc["gnss"], BRIDGE_QOS)
            self.imu_pub = self.create_publisher(Imu, loc["imu"], BRIDGE_QOS)
            self.speed_pub = self.create_publisher(carla_msgs.CarlaSpeedometer, loc["speedometer"], BRIDGE_QOS)
            self.estimate_sub = self.create_subscription(Odometry, t["odometry"], self._on_estimate, RECEIVE_QOS)
        else:
            self.odometry_pub = self.create_publisher(Odometry, t["odometry"], BRIDGE_QOS)
        # the bridge's camera: reliable, depth 10; otherwise keep all, so that no image is ever lost
        self.image_pub = self.create_publisher(Image, t["image"], BRIDGE_QOS if bridge else KEEP_ALL_QOS)
        self.info_pub = self.create_publisher(CameraInfo, t["camera_info"], BRIDGE_QOS)
        self.carla_controls: dict[int, Any] = {}
        if bridge:                      # the leaderboard's agent: the route out, CARLA's control in
            self.route_pub = self.create_publisher(carla_msgs.CarlaRoute, c["carla_route"], LATCHED_QOS)
            self.gnss_route_pub = self.create_publisher(carla_msgs.CarlaGnssRoute, f"{c['carla_route']}_gnss",
                                                        LATCHED_QOS)
            self.carla_control_sub = self.create_subscription(
                carla_msgs.CarlaEgoVehicleControl, c["carla_control"], self._on_carla_control, LATEST_RELIABLE_QOS)
        else:
            self.route_pub = self.create_publisher(Path, t["route"], LATCHED_QOS)
        self.command_pub = self.create_publisher(String, c["command"], LATEST_RELIABLE_QOS)
        self.oracle_plan_pub = self.create_publisher(Trajectory, c["trajectory"], LATEST_RELIABLE_QOS)
        self.oracle_status_pub = self.create_publisher(PlannerStatus, c["planner_status"], LATCHED_QOS)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.controls: dict[int, VehicleControl] = {}
        self.trajectories: dict[int, Trajectory] = {}
        self.ready_at: float | None = None          # wall time of the leaderboard status True
        self.planner_ready_at: float | None = None  # wall time the planner's READY was seen
        self.planner_diagnostics: dict[str, str] = {}   # the planner's newest /diagnostics key/values
        self.control_sub = self.create_subscription(VehicleControl, "/wam_diff2_controller/output/control",
                                                    self._on_control, RECEIVE_QOS)
        self.trajectory_sub = self.create_subscription(Trajectory, c["trajectory"], self._on_trajectory, RECEIVE_QOS)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, RECEIVE_QOS)
        self.create_subscription(Bool, c["leaderboard_status"], self._on_ready, LATCHED_QOS)
        self.create_subscription(PlannerStatus, c["planner_status"], self._on_planner_status, LATCHED_QOS)

    # ---- receiving
    def _on_control(self, msg: VehicleControl) -> None:
        with self._cond:
            self.controls[stamp_ns(msg.header.stamp)] = msg
            self._cond.notify_all()

    def _on_carla_control(self, msg) -> None:
        with self._cond:
            self.carla_controls[stamp_ns(msg.header.stamp)] = msg
            self._cond.notify_all()

    def take_carla_control(self, stamp: int, timeout_s: float):
        msg = self.wait(lambda: self.carla_controls.get(stamp), timeout_s)
        with self._lock:
            self.carla_controls = {k: v for k, v in self.carla_controls.items() if k > stamp}
        return msg

    def _on_estimate(self, msg: Odometry) -> None:
        with self._cond:
            self.estimates[stamp_ns(msg.header.stamp)] = msg
            self._cond.notify_all()

    def take_estimate(self, stamp: int, timeout_s: float) -> Odometry | None:
        msg = self.wait(lambda: self.estimates.get(stamp), timeout_s)
        with self._lock:
            self.estimates = {k: v for k, v in self.estimates.items() if k > stamp}
        return msg

    def _on_trajectory(self, msg: Trajectory) -> None:
        with self._cond:
            self.trajectories[stamp_ns(msg.header.stamp)] = msg
            self._cond.notify_all()

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

    def wait(self, predicate, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                value = predicate()
                remaining = deadline - time.monotonic()
                if value or remaining <= 0:
                    return value
                self._cond.wait(min(remaining, 0.5))

    def take_control(self, stamp: int, timeout_s: float) -> VehicleControl | None:
        msg = self.wait(lambda: self.controls.get(stamp), timeout_s)
        with self._lock:
            self.controls = {k: v for k, v in self.controls.items() if k > stamp}
        return msg

    def take_trajectory(self, stamp: int, timeout_s: float) -> Trajectory | None:
        msg = self.wait(lambda: self.trajectories.get(stamp), timeout_s)
        with self._lock:
            self.trajectories = {k: v for k, v in self.trajectories.items() if k > stamp}
        return msg

    # ---- publishing
    def publish_route(self, run: RouteRun) -> None:
        if self.bridge:
            route, gnss_route = carla_route_messages(run)
            self.route_pub.publish(route)
            self.gnss_route_pub.publish(gnss_route)
            return
        header = Header(stamp=ns_to_stamp(run.stamp_ns), frame_id="map")
        path = Path(header=header)
        points = run.route_xy()
        path.poses = [PoseStamped(header=header, pose=route_pose(x, y, h))
                      for (x, y), h in zip(points, route_headings(points))]
        self.route_pub.publish(path)

    def publish_tick(self, run: RouteRun, command: str | None, camera: bool,
                     sensors: DemoSensors | None = None) -> None:
        """/clock, odometry (or, with ``sensors``, GNSS + speedometer + IMU), the command and (when ``camera``)
        camera_info + image for the tick, in that order."""
        stamp = ns_to_stamp(run.stamp_ns)
        self.clock_pub.publish(ClockMsg(clock=stamp))
        ego, role = run.world.ego, self.sensors["odometry"].split("/")[2]
        if sensors is not None:
            fix, imu, speed = sensor_messages(sensors.read(ego), stamp, self.localization_topics)
            self.gnss_pub.publish(fix)
            self.speed_pub.publish(speed)
            self.imu_pub.publish(imu)
        else:
            odom = Odometry(header=Header(stamp=stamp, frame_id="map"), child_frame_id=role)
            odom.pose.pose.position.x, odom.pose.pose.position.y = float(ego.x), float(ego.y)
            o = odom.pose.pose.orientation
            o.x, o.y, o.z, o.w = quaternion_from_yaw(float(ego.yaw))
            odom.twist.twist.linear.x = float(ego.speed)        # child frame: a rear axle never slides
            odom.twist.twist.angular.z = float(ego.yaw_rate)
            self.odometry_pub.publish(odom)
        if command is not None:
            self.command_pub.publish(String(data=command))
        if camera:
            cam = run.renderer.camera
            header = Header(stamp=stamp, frame_id=sensor_frame(self.sensors["image"].removesuffix("/image")))
            info = CameraInfo(header=header, height=cam.height, width=cam.width, distortion_model="plumb_bob")
            info.d = [0.0] * 5
            info.k = [cam.fx, 0.0, cam.cx, 0.0, cam.fy, cam.cy, 0.0, 0.0, 1.0]
            info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
            info.p = [cam.fx, 0.0, cam.cx, 0.0, 0.0, cam.fy, cam.cy, 0.0, 0.0, 0.0, 1.0, 0.0]
            self.info_pub.publish(info)
            bgra = cv2.cvtColor(run.render(), cv2.COLOR_RGB2BGRA)
            self.image_pub.publish(Image(header=header, height=bgra.shape[0], width=bgra.shape[1], encoding="bgra8",
                                         is_bigendian=0, step=4 * bgra.shape[1], data=bgra.tobytes()))

    def publish_oracle_plan(self, stamp: int, plan: Plan, frame_id: str) -> None:
        msg = Trajectory(header=Header(stamp=ns_to_stamp(stamp), frame_id=frame_id), command="oracle", valid=True)
        for k, (x, y) in enumerate(plan.waypoints):
            point = TrajectoryPoint(x=float(x), y=float(y))
            point.time_from_start.sec, point.time_from_start.nanosec = divmod((k + 1) * 500_000_000, 1_000_000_000)
            msg.points.append(point)
        self.oracle_plan_pub.publish(msg)


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted parameter names as a ROS parameter file nests them: {"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        *groups, last = name.split(".")
        level = out
        for g in groups:
            level = level.setdefault(g, {})
        level[last] = value
    return out


def wait_until(condition, timeout_s: float, poll_s: float = 0.0005) -> bool:
    """Poll ``condition`` (state another thread changes without notifying us) until true or the timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


class _Spinner:
    def __init__(self, node: Node, executor):
        self.node, self.executor = node, executor
        executor.add_node(node)
        self.thread = threading.Thread(target=executor.spin, daemon=True, name=f"spin-{node.get_name()}")
        self.thread.start()

    def stop(self) -> None:
        stop_worker = getattr(self.node, "stop_worker", None)
        if stop_worker is not None:
            stop_worker()
        self.executor.shutdown()
        self.thread.join(10.0)
        self.node.destroy_node()


@dataclass
class _Empty:
    """The leaderboard's empty control when none arrives in time (coast)."""
    throttle: float = 0.0
    steer: float = 0.0
    brake: float = 0.0
    reason: str = "no control in time"


@dataclass
class _Applied:
    """bridge: a CARLA control as the leaderboard applies it, with the controller's reason for it."""
    throttle: float
    steer: float
    brake: float
    reason: str
    header: Header


class RosClosedLoop:
    """Nodes, DDS context and the handshake; :meth:`run_route` drives one route. A context manager."""

    def __init__(self, settings: RosLoopSettings):
        self.settings = settings
        self.context: rclpy.Context | None = None
        self._spinners: list[_Spinner] = []
        self._process: subprocess.Popen | None = None
        self.images_published = 0
        self.handshake: dict[str, Any] = {}
        self.planner_node = None          # the in-process planner: its counts go into each route's result
        self.localization = None          # odometry estimated: the localization node
        self.localization_errors: list[tuple[float, float]] = []   # (position m, heading rad) per tick, all routes
        self.launched: dict[str, Any] = {}  # bridge: the launch file's nodes by name (ResolvedNode)
        self._files: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> "RosClosedLoop":
        st = self.settings
        domain = st.domain_id if st.domain_id is not None else int(os.environ.get("ROS_DOMAIN_ID", "0"))
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        try:
            self.sim = SimulatorNode(st.role, st.odometry, st.bridge, context=self.context)
            self._spinners.append(_Spinner(self.sim, SingleThreadedExecutor(context=self.context)))
            if st.bridge:
                self.launched = {n.spec.name: n for n in resolve_nodes(self._bridge_launch_values())}
            if st.odometry == "estimated":
                self.localization = LocalizationNode(context=self.context, **self._node_arguments(
                    LOCALIZATION_NODE, {"role_name": st.role, "use_sim_time": True}))
                self._spinners.append(_Spinner(self.localization, SingleThreadedExecutor(context=self.context)))
            controller_params = {"role_name": st.role, "use_sim_time": True,
                                 "control_consumer": "vehicle_control",   # the simulator applies ~/output/control
                                 "route.publish_command": st.command_source == "route",
                                 "pacing_every_n_ticks": st.lockstep_n, "pacing": st.pacing,
                                 **{GAINS_PREFIX + k: v for k, v in vars(st.gains).items()}}
            self.controller = ControllerNode(context=self.context, **self._node_arguments(
                CONTROLLER_NODE, controller_params))
            self._spinners.append(_Spinner(self.controller, SingleThreadedExecutor(context=self.context)))
            self._start_planner(domain)
            self._handshake()
            if st.planner_slowdown != 1.0:
                self._slow_down_planner(st.planner_slowdown)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _bridge_launch_values(self) -> dict[str, str]:
        """bridge: launch/leaderboard.launch.py's arguments as the agent passes them, with the demo car's gains
        in the controller's parameter file and the planner options in the planner's (files in a temporary
        folder, removed on exit)."""
        st = self.settings
        self._files = tempfile.TemporaryDirectory(prefix="wam_diff2_bridge_")
        planner = dict(st.planner_parameters)
        device = planner.pop("device", None)
        files = {"planner_params_file": planner, "controller_params_file": {
            "pacing": st.pacing, **{GAINS_PREFIX + k: v for k, v in vars(st.gains).items()}}}
        for argument, values in files.items():
            files[argument] = os.path.join(self._files.name, f"{argument}.yaml")
            with open(files[argument], "w") as f:
                yaml.safe_dump({"/**": {"ros__parameters": nested(values)}}, f)
        return launch_values({**AGENT_ARGUMENTS, "model_path": st.model_path, "role_name": st.role,
                              "lockstep_n": str(st.lockstep_n), **({"device": device} if device else {}), **files})

    def _node_arguments(self, name: str, parameters: dict[str, Any], remaps: list[str] = ()) -> dict[str, Any]:
        """The keyword arguments of node ``name``: ``parameters`` and ``remaps`` (this loop's own), or, bridge,
        the launch file's parameters, parameter file and remappings for the agent's arguments."""
        params_file = None
        if self.settings.bridge:
            node = self.launched[name]
            parameters, params_file = node.parameters, node.params_file
            remaps = [f"{source}:={target}" for source, target in node.remappings]
        return {"parameter_overrides": [Parameter(k, value=v) for k, v in parameters.items()],
                "cli_args": ["--ros-args", *(["--params-file", params_file] if params_file else []),
                             *[a for r in remaps for a in ("-r", r)]],
                "use_global_arguments": False}

    def _start_planner(self, domain: int) -> None:
        st = self.settings
        if st.planner == "oracle":
            with self.sim._lock:
                self.sim.planner_ready_at = time.monotonic()     # the oracle is the planner: READY now
            self.sim.oracle_status_pub.publish(PlannerStatus(state=PlannerStatus.READY, model_path="oracle",
                                                             message="the demo world's expert (an oracle)"))
            return
        node = self._node_arguments(PLANNER_NODE, *planner_ros_arguments(st.role, st.lockstep_n, st.model_path,
                                                                            st.planner_parameters))
        if st.planner == "subprocess":
            args = [sys.executable, "-m", "wam_diff2_ros.planner.node", *node["cli_args"]]
            for p in node["parameter_overrides"]:
                args += ["-p", f"{p.name}:={str(p.value).lower() if isinstance(p.value, bool) else p.value}"]
            self._process = subprocess.Popen(args, env={**os.environ, "ROS_DOMAIN_ID": str(domain)})
            return
        from ..planner.node import PlannerNode      # torch and the model: only when planning in-process
        planner = PlannerNode(PLANNER_NODE, context=self.context, **node)
        self._spinners.append(_Spinner(planner, MultiThreadedExecutor(num_threads=3, context=self.context)))
        self.planner_node = planner

    def _slow_down_planner(self, factor: float) -> None:
        """The in-process planner's policy (configured: READY) sleeps (factor - 1) x each step's own time."""
        policy = self.planner_node._policy
        step = policy.step

        def slowed(*args, **kwargs):
            t = time.perf_counter()
            out = step(*args, **kwargs)
            time.sleep((factor - 1.0) * (time.perf_counter() - t))
            return out

        policy.step = slowed

    def _handshake(self) -> None:
        """Wait, like the leaderboard's agent, for the latched True on the ``leaderboard_status`` topic."""
        st, t0 = self.settings, time.monotonic()
        ready = self.sim.wait(lambda: self.sim.ready_at is not None, st.ready_timeout_s)
        if not ready:
            raise TimeoutError(f"no True on {self.sim.control_topics['leaderboard_status']} within "
                               f"{st.ready_timeout_s} s (planner: {st.planner})")
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"the planner process exited with {self._process.returncode}")
        # tick 0 only after every link is matched at both ends: a sample sent before its reader has
        # matched the writer is lost, and a lost image would shift the planner's lockstep count
        sim, planner = self.sim, st.planner != "oracle"
        odometry_readers = 2 if planner else 1                      # the controller (and the planner)
        if sim.estimated:                                           # the localization node between them
            odometry_readers += 1                                   # the simulator's own (estimate vs truth)
            writers = [(pub, 1) for pub in (sim.gnss_pub, sim.imu_pub, sim.speed_pub)]
            writers.append((self.localization._odometry_pub, odometry_readers))
        else:
            writers = [(sim.odometry_pub, odometry_readers)]       # (publisher, subscribers it must have matched)
        writers += [(sim.image_pub, 1), (sim.command_pub, 1)] if planner else []
        readers = [sim.control_sub] + ([sim.trajectory_sub] if planner else []) \
            + ([sim.estimate_sub] if sim.estimated else []) + ([sim.carla_control_sub] if sim.bridge else [])
        controller_inputs = {sim.sensors["odometry"]} | ({sim.control_topics["trajectory"]} if not planner else set())
        readers += [r for r in self.controller.subscriptions if r.topic_name in controller_inputs]

        def unmatched() -> list[str]:
            missing = [f"{w.topic_name} has {w.get_subscription_count()} of {n} subscribers matched"
                       for w, n in writers if w.get_subscription_count() < n]
            missing += [f"{r.topic_name}: no publisher matched" for r in readers if r.get_publisher_count() == 0]
            diagnostics = sim.planner_diagnostics
            if planner and not (diagnostics.get("lifecycle_state") == "active" and all(
                    int(diagnostics.get(f"{k}_publishers", 0)) > 0 for k in ("image", "odometry", "command"))):
                state = {k: diagnostics.get(k, "?") for k in ("lifecycle_state", "image_publishers",
                                                              "odometry_publishers", "command_publishers")}
                missing.append(f"the planner's /diagnostics: {state}")
            return missing

        if not wait_until(lambda: not unmatched(), 30.0, poll_s=0.05):
            raise TimeoutError(f"not matched within 30 s: {'; '.join(unmatched())} (planner: {st.planner})")
        # DDS orders messages per topic, not across topics: the planner's READY may reach us a little
        # after the controller's Bool that it caused; allow READY_REORDER_S
        sim.wait(lambda: sim.planner_ready_at is not None, 2.0)
        self.handshake = {"ready_wait_s": round(sim.ready_at - t0, 3),
                          "planner_ready_before_status": sim.planner_ready_at is not None
                          and sim.planner_ready_at <= sim.ready_at + READY_REORDER_S}

    def __exit__(self, *exc) -> None:
        for spinner in reversed(self._spinners):
            spinner.stop()
        self._spinners.clear()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(20.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
        if self.context is not None:
            rclpy.shutdown(context=self.context)
            self.context = None
        if self._files is not None:
            self._files.cleanup()
            self._files = None

    # ------------------------------------------------------------------ one route
    def run_route(self, run: RouteRun) -> RouteResult:
        st, sim = self.settings, self.sim
        oracle = ExpertOracle() if st.planner == "oracle" else None
        camera = st.planner != "oracle"
        routes_before = self.controller.counts["routes_received"]
        sim.publish_route(run)
        if st.command_source == "route" and not wait_until(
                lambda: self.controller.counts["routes_received"] > routes_before, 10.0):
            raise TimeoutError("the controller did not receive the route")
        counts_before = dict(self.controller.counts)
        planner_before = self.planner_counts()
        stats = {"control_timeouts": 0, "plan_timeouts": 0, "control_wait_ms": [], "plan_wait_ms": []}
        sensors = route_sensors(run.settings.seed, run.index, st.sensor_noise) if sim.estimated else None
        errors: list[tuple[float, float]] = []          # estimated odometry: (position m, heading rad) per tick
        missing_estimates = 0
        wall0 = time.monotonic()
        frame = "base_link"
        while not run.done:
            stamp = run.stamp_ns
            planning = (self.images_published % st.lockstep_n == 0) if camera else run.tick % st.lockstep_n == 0
            sim.publish_tick(run, run.command() if st.command_source == "world" else None, camera, sensors)
            if camera:
                self.images_published += 1
            t = time.monotonic()
            msg = self._take_carla_control(stamp) if st.bridge else sim.take_control(stamp, st.control_timeout_s)
            stats["control_wait_ms"].append((time.monotonic() - t) * 1e3)
            if msg is None:
                stats["control_timeouts"] += 1
            else:
                frame = msg.header.frame_id or frame
            if sensors is not None:                       # the estimate the control was made on, against the truth
                estimate = sim.take_estimate(stamp, 1.0)
                if estimate is None:
                    missing_estimates += 1
                else:
                    p, o, ego = estimate.pose.pose.position, estimate.pose.pose.orientation, run.world.ego
                    errors.append((math.hypot(p.x - ego.x, p.y - ego.y),
                                   abs(wrap_angle(yaw_from_quaternion(o.x, o.y, o.z, o.w) - ego.yaw))))
            if oracle is not None and planning:          # the oracle plans on the tick's state, after the control
                plan = oracle(run)
                sim.publish_oracle_plan(stamp, plan, frame)
                run.count_plan(plan)
            if planning and (st.timing == "lockstep" or oracle is not None):
                # the tick's plan must reach the controller before the next tick (lockstep)
                t = time.monotonic()
                trajectory = sim.take_trajectory(stamp, st.plan_timeout_s if oracle is None else 10.0)
                delivered = trajectory is not None and wait_until(
                    lambda: (self.controller.plan_stamp_ns or -1) >= stamp, 10.0)
                stats["plan_wait_ms"].append((time.monotonic() - t) * 1e3)
                if not delivered:
                    stats["plan_timeouts"] += 1
                if trajectory is not None and oracle is None:
                    run.plans += 1
                    run.plans_valid += int(trajectory.valid)
                    run.plans_retried += int(trajectory.stats.retries > 0)
                    run.score_plan(np.array([(p.x, p.y) for p in trajectory.points]) if trajectory.valid else None)
            elif oracle is None:
                with sim._lock:                           # leaderboard timing: count what arrived
                    arrived = [m for k, m in sim.trajectories.items() if k <= stamp]
                    sim.trajectories = {k: m for k, m in sim.trajectories.items() if k > stamp}
                run.plans += len(arrived)
                run.plans_valid += sum(int(m.valid) for m in arrived)
                run.plans_retried += sum(int(m.stats.retries > 0) for m in arrived)
            run.apply(msg if msg is not None else _Empty())
            if st.timing == "leaderboard":
                due = wall0 + run.tick * run.dt_ns / 1e9 / st.realtime_factor
                time.sleep(max(0.0, due - time.monotonic()))
        waits, plan_waits = stats.pop("control_wait_ms"), stats.pop("plan_wait_ms")
        counts = {k: v - counts_before.get(k, 0) for k, v in self.controller.counts.items()
                  if v != counts_before.get(k, 0)}                 # this route's share
        extra = {"loop": "ros", "planner": st.planner, "timing": st.timing, "lockstep_n": st.lockstep_n,
                 "pacing": st.pacing, "planner_slowdown": st.planner_slowdown, **stats,
                 "control_wait_ms_mean": float(np.mean(waits)) if waits else None,
                 "control_wait_ms_max": float(np.max(waits)) if waits else None,
                 "plan_wait_ms_mean": float(np.mean(plan_waits)) if plan_waits else None,
                 "controller": counts, **self.handshake, "odometry": st.odometry}
        if sensors is not None:
            self.localization_errors += errors
            extra["localization"] = {**error_summary(*zip(*errors)), "ticks_without_estimate": missing_estimates} \
                if errors else {"ticks_without_estimate": missing_estimates}
        if self.planner_node is not None:
            extra["planner_counts"] = {k: v - planner_before.get(k, 0) for k, v in self.planner_counts().items()
                                       if v != planner_before.get(k, 0)}
        return run.result(extra)

    def _take_carla_control(self, stamp: int) -> "_Applied | None":
        """bridge: the tick's CarlaEgoVehicleControl as the leaderboard waits for it (``control_timeout_s``), with
        the reason of the controller's own message for the same tick (scoring only; "" if it is not there)."""
        carla = self.sim.take_carla_control(stamp, self.settings.control_timeout_s)
        if carla is None:
            return None
        own = self.sim.take_control(stamp, 0.5)
        return _Applied(carla.throttle, carla.steer, carla.brake, own.reason if own is not None else "", carla.header)

    def planner_counts(self) -> dict[str, int]:
        """The in-process planner's counters so far (images received, processed, ...); {} otherwise."""
        if self.planner_node is None:
            return {}
        return self.planner_node.counts()


# ----------------------------------------------------------------------------- command line
def planner_parameters(args, engine) -> dict[str, Any]:
    """The planner parameters the command's options set, by the planner table's names (model_path
    apart; options not given leave the node's own, so the checkpoint's decoding settings apply)."""
    from wam_diff2_core.params.planner import ENGINE_PREFIX, FLAG_PARAMETERS, cli_dest

    flags = {name: getattr(args, cli_dest(name), None) for name in FLAG_PARAMETERS if name != "model_path"}
    return {**{k: v for k, v in flags.items() if v is not None}, ENGINE_PREFIX + "cpu_threads": engine.cpu_threads}


def run(args) -> int:
    """``wam-diff2-ros closed-loop``: the routes of ``wam-diff2 closed-loop``, driven over DDS."""
    from wam_diff2_core.cli.closed_loop import print_summary, route_batch
    from wam_diff2_core.sim.route_batch import drive_routes, write_summary
    from wam_diff2_core.utils.atomic import atomic_directory

    batch = route_batch(args)
    odometry = "estimated" if args.bridge else args.odometry
    settings = RosLoopSettings(role=args.role, planner="oracle" if args.oracle else args.planner_process,
                               model_path=args.model or "", planner_parameters=planner_parameters(args, batch.engine),
                               lockstep_n=batch.lockstep_n, timing=args.timing,
                               command_source="route" if args.bridge else args.command_source,
                               gains=batch.gains, domain_id=args.domain_id, odometry=odometry, bridge=args.bridge,
                               pacing=args.pacing, planner_slowdown=args.planner_slowdown)
    record, notes = {}, []
    with atomic_directory(args.out, overwrite=args.overwrite) as out:
        with RosClosedLoop(settings) as loop:
            results = drive_routes(batch, out, loop.run_route)
        if loop.localization_errors:
            loc = record["localization"] = error_summary(*zip(*loop.localization_errors))
            notes.append(f"localization (estimate vs truth, {loc['ticks']} ticks): position median "
                         f"{loc['position_median_m']:.3f} m, p95 {loc['position_p95_m']:.3f} m; heading median "
                         f"{loc['heading_median_deg']:.3f} deg, p95 {loc['heading_p95_deg']:.3f} deg")
        summary = write_summary(batch, out, results, "ros",
                                {"timing": args.timing, "bridge": args.bridge, "odometry": odometry}, record)
    print_summary(args.out, batch, summary, notes)
    return 0
