"""Test helpers to drive a planner over real DDS: synthetic inputs and an output probe.

Used by the ROS tests (``from test.support.ros_helpers import Probe``, the checkout's root on sys.path); handy
for smoke runs without a simulator too:

    ctx = rclpy.Context(); rclpy.init(context=ctx, domain_id=unique_domain_id(0))
    probe = Probe("/wam_diff2_planner", context=ctx).start()
    probe.publish_image(image_msg(stamp_ns=probe.now_ns()))
    probe.wait_for(lambda: probe.trajectories, timeout_s=30)
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import ChangeState, GetState
from nav_msgs.msg import Odometry, Path
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import Float64, Header, String
from visualization_msgs.msg import MarkerArray

from wam_diff2_core.geometry import quaternion_from_yaw

from wam_diff2_core.frame_inputs import stamp_ns as stamp_to_ns

from wam_diff2_ros.conversions import ns_to_stamp
from wam_diff2_ros.msg import Detection2DArray, PlannerStatus, StageTimes, Trajectory
from wam_diff2_ros.planner.interface import INPUT_TOPICS, OUTPUT_TOPICS
from wam_diff2_ros.qos import LATCHED_QOS, LATEST_RELIABLE_QOS


def wait_for(condition: Callable[[], Any], timeout_s: float, poll_s: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy; return it (or the last falsy value)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll_s)


@contextlib.contextmanager
def ros_context(offset: int) -> Iterator[Any]:
    """A fresh rclpy context on :func:`unique_domain_id` ``(offset)``, shut down on exit (a module's fixture)."""
    import rclpy
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=unique_domain_id(offset))
    try:
        yield context
    finally:
        rclpy.shutdown(context=context)


def spin_in_thread(context, *nodes, executor_type=SingleThreadedExecutor):
    """``nodes`` spun by one executor in a daemon thread: (executor, thread); shut the executor down to stop."""
    executor = executor_type(context=context)
    for node in nodes:
        executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return executor, thread


@contextlib.contextmanager
def planner_and_probe(context, node, probe_name: str = "wam_diff2_probe") -> Iterator[tuple[Any, "Probe"]]:
    """(node, probe): ``node`` (a planner node, which this takes over) spinning in a 4-thread executor in its
    own thread, and a :class:`Probe` on its topics; on exit the probe stops, then the node's worker, the
    executor and the node (also when the probe fails to start)."""
    from rclpy.executors import MultiThreadedExecutor
    executor, thread = spin_in_thread(context, node, executor_type=functools.partial(MultiThreadedExecutor,
                                                                                    num_threads=4))
    probe = None
    try:
        probe = Probe(node.get_fully_qualified_name(), name=probe_name, context=context).start()
        yield node, probe
    finally:
        if probe is not None:
            probe.stop()
        node.stop_worker()
        executor.shutdown()
        thread.join(10.0)
        node.destroy_node()


def unique_domain_id(offset: int) -> int:
    """A DDS domain per process and test module (offset 0..9), so parallel test runs do not talk.

    Fast DDS accepts domain ids up to 232; ids here stay within 1..230.
    """
    if not 0 <= offset < 10:
        raise ValueError(f"offset: {offset} is not in 0..9")
    return 1 + (os.getpid() % 23) * 10 + offset


def planner_command(params_file: str | pathlib.Path, checkpoint: str | pathlib.Path, topics: Mapping[str, str],
                    params: Mapping[str, Any] | None = None) -> list[str]:
    """``wam-diff2-planner`` as a replay test or a smoke run starts it: ``params_file``, then sim time,
    the CPU, no warm-up, no image timeout and no debug outputs, then ``params`` (``{"decoding.block_size":
    1}``); its inputs remapped to ``topics`` (``{"image": "/carla/ego_vehicle/rgb_front/image", ...}``)."""
    settings = {"model_path": str(checkpoint), "use_sim_time": "true", "device": "cpu", "warmup": "false",
                "image_timeout_s": "3600.0", "debug.publish_image": "false", "debug.publish_markers": "false",
                **(params or {})}
    cmd = [str(pathlib.Path(sys.executable).parent / "wam-diff2-planner"), "--ros-args",
           "--params-file", str(params_file)]
    for name, value in settings.items():
        cmd += ["-p", f"{name}:={value}"]
    for key, topic in topics.items():
        cmd += ["-r", f"~/input/{key}:={topic}"]
    return cmd


@contextlib.contextmanager
def running(cmd: list[str], env: Mapping[str, str], log_path: str | pathlib.Path,
            stop_timeout_s: float = 30.0) -> Iterator[subprocess.Popen]:
    """``cmd`` as a process with its output in ``log_path``; on leaving, stopped as ``ros2 launch``
    stops a node: SIGINT, then SIGKILL after ``stop_timeout_s``."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def image_msg(stamp_ns: int, height: int = 90, width: int = 160, encoding: str = "bgra8", padding: int = 8,
              seed: int = 0, frame_id: str = "camera") -> Image:
    """A random frame in ``encoding`` with ``padding`` bytes at the end of each row."""
    channels = {"bgra8": 4, "rgba8": 4, "bgr8": 3, "rgb8": 3, "mono8": 1}[encoding]
    step = width * channels + padding
    data = np.random.default_rng(seed).integers(0, 256, size=height * step, dtype=np.uint8)
    return Image(header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id), height=height, width=width,
                 encoding=encoding, is_bigendian=0, step=step, data=data.tobytes())


def odometry_msg(stamp_ns: int, x: float = 0.0, y: float = 0.0, yaw: float = 0.0, vx: float = 5.0, vy: float = 0.0,
                 yaw_rate: float = 0.0, frame_id: str = "map", child_frame_id: str = "ego_vehicle") -> Odometry:
    msg = Odometry(header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id), child_frame_id=child_frame_id)
    msg.pose.pose.position.x, msg.pose.pose.position.y = x, y
    q = quaternion_from_yaw(yaw)
    o = msg.pose.pose.orientation
    o.x, o.y, o.z, o.w = q
    msg.twist.twist.linear.x, msg.twist.twist.linear.y = vx, vy
    msg.twist.twist.angular.z = yaw_rate
    return msg


def route_msg(points_xy, frame_id: str = "map") -> Path:
    from geometry_msgs.msg import PoseStamped
    path = Path(header=Header(frame_id=frame_id))
    for x, y in points_xy:
        pose = PoseStamped(header=path.header)
        pose.pose.position.x, pose.pose.position.y = float(x), float(y)
        pose.pose.orientation.w = 1.0
        path.poses.append(pose)
    return path


def optional_output_types() -> dict[str, type]:
    """The planner's outputs on other stacks' types, where their packages import (scripts/build_ros_interfaces.sh
    builds them for the suite; a colcon workspace of this package alone, as colcon test runs, lacks them)."""
    types = {}
    try:
        from autoware_planning_msgs.msg import Trajectory as AutowareTrajectory
        types["autoware_trajectory"] = AutowareTrajectory
    except ImportError:
        pass
    try:
        from vision_msgs.msg import Detection2DArray as VisionDetections
        types["vision_detections"] = VisionDetections
    except ImportError:
        pass
    return types


class Probe(Node):
    """Publishes a planner's inputs and records all of its outputs (spun in its own thread)."""

    def __init__(self, planner: str = "/wam_diff2_planner", name: str = "wam_diff2_probe", **kwargs: Any):
        super().__init__(name, **kwargs)
        self.planner = planner
        self._lock = threading.Lock()
        self.received: dict[str, list] = {}
        kinds = {"trajectory": Trajectory, "path": Path, "path_odom": Path, "detections": Detection2DArray,
                 "debug_image": Image, "markers": MarkerArray, "processing_ms": Float64, "latency_ms": Float64,
                 "status": PlannerStatus, "stage_times": StageTimes, **optional_output_types()}
        for key, kind in kinds.items():
            self.received[key] = []
            self.create_subscription(kind, self.topic(OUTPUT_TOPICS[key]), self._recorder(key),
                                     LATCHED_QOS if key == "status" else LATEST_RELIABLE_QOS)
        self.received["diagnostics"] = []
        self.create_subscription(DiagnosticArray, "/diagnostics", self._recorder("diagnostics"), 50)
        self.image_pub = self.create_publisher(Image, self.topic(INPUT_TOPICS["image"]), qos_profile_sensor_data)
        self.odometry_pub = self.create_publisher(Odometry, self.topic(INPUT_TOPICS["odometry"]),
                                                  qos_profile_sensor_data)
        self.route_pub = self.create_publisher(Path, self.topic(INPUT_TOPICS["route"]), LATCHED_QOS)
        self.command_pub = self.create_publisher(String, self.topic(INPUT_TOPICS["command"]), LATEST_RELIABLE_QOS)
        self.change_state = self.create_client(ChangeState, planner + "/change_state")
        self.get_state = self.create_client(GetState, planner + "/get_state")
        self.odometry_pose = dict(x=0.0, y=0.0, yaw=0.0, vx=5.0, vy=0.0, yaw_rate=0.0)
        self.odometry_on = threading.Event()
        self.odometry_on.set()
        self.create_timer(0.05, self._publish_odometry)
        self._executor: SingleThreadedExecutor | None = None
        self._thread: threading.Thread | None = None

    def topic(self, private_name: str) -> str:
        """The planner's full topic name for one of its ``~/`` names."""
        return self.planner + private_name[1:] if private_name.startswith("~") else private_name

    def _recorder(self, key: str) -> Callable:
        def record(msg) -> None:
            with self._lock:
                self.received[key].append(msg)
        return record

    def _publish_odometry(self) -> None:
        if self.odometry_on.is_set():
            self.odometry_pub.publish(odometry_msg(self.now_ns(), **self.odometry_pose))

    # ---- running
    def start(self) -> "Probe":
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self)
        self._thread = threading.Thread(target=self._executor.spin, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
        if self._thread is not None:
            self._thread.join(5.0)
        self.destroy_node()

    def now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    # ---- reading
    def messages(self, key: str) -> list:
        with self._lock:
            return list(self.received[key])

    def with_stamp(self, key: str, stamp_ns: int) -> list:
        return [m for m in self.messages(key) if stamp_to_ns(m.header.stamp) == stamp_ns]

    def with_status(self, state: int) -> list:
        return [m for m in self.messages("status") if m.state == state]

    def clear(self, *keys: str) -> None:
        with self._lock:
            for key in keys or list(self.received):
                self.received[key].clear()

    wait_for = staticmethod(wait_for)             # the module's, for probe.wait_for(...)

    def diagnostic_values(self, name_prefix: str) -> dict[str, str] | None:
        """Key/values of the newest /diagnostics status whose name starts with ``name_prefix``."""
        for array in reversed(self.messages("diagnostics")):
            for status in array.status:
                if status.name.startswith(name_prefix):
                    values = {kv.key: kv.value for kv in status.values}
                    values["__level__"] = int.from_bytes(status.level, "little") if isinstance(status.level, bytes) \
                        else int(status.level)
                    values["__message__"] = status.message
                    return values
        return None

    def counter(self, name_prefix: str, key: str) -> int:
        values = self.diagnostic_values(name_prefix) or {}
        return int(values.get(key, 0))

    # ---- lifecycle
    def call(self, client, request, timeout_s: float = 60.0):
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise TimeoutError(f"service {client.srv_name} not available")
        future = client.call_async(request)
        done = self.wait_for(future.done, timeout_s)
        if not done:
            raise TimeoutError(f"service {client.srv_name} did not answer within {timeout_s} s")
        return future.result()

    def transition(self, label: str, timeout_s: float = 120.0) -> bool:
        request = ChangeState.Request()
        request.transition.label = label
        return self.call(self.change_state, request, timeout_s).success

    def state(self) -> str:
        return self.call(self.get_state, GetState.Request()).current_state.label
