"""The WAM-Diff2 agent for the CARLA Leaderboard 2.0 / Bench2Drive, as a leaderboard ROS 2 agent.

    export WAM_DIFF2_MODEL_PATH=/path/to/checkpoint          # else $TEAM_CONFIG; "demo": the installed demo model
    export TEAM_AGENT=$(ros2 pkg prefix --share wam_diff2_ros)/agents/wam_diff2_agent.py
    python3 ${LEADERBOARD_ROOT}/leaderboard/leaderboard_evaluator.py --agent=${TEAM_AGENT} \\
        --routes=${ROUTES} --track=SENSORS ...                                 # docs/carla.md, section 2

The leaderboard's ``ROS2Agent`` (``leaderboard/autoagents/ros2_agent.py``) starts the
carla-ros-bridge in passive mode, spawns :meth:`WamDiff2Agent.sensors` on the ego (role
``hero``) through the bridge, then runs ``ros2 launch`` with :meth:`get_ros_entrypoint`:
this package's ``leaderboard.launch.py`` (localization + planner + controller). It waits for
the latched True on the bridge's status topic of ``hero`` (the controller sends it once the planner is
READY), publishes the route on its ``global_plan`` and takes one ``vehicle_control_cmd`` per tick,
stamped with the tick's time (the names: ``controller_topics`` in wam_diff2_core/topics.py).

Harness (Bench2Drive runs several evaluators on one host, CARLA ports 150 apart): before the base class
starts anything, the agent sets ``ROS_DOMAIN_ID`` from its evaluator's CARLA port (one domain per
150-port block) and discovery on this host only, so evaluators do not cross-talk; it checks the
checkpoint (``$WAM_DIFF2_MODEL_PATH``, else ``$TEAM_CONFIG``, a directory or Bench2Drive's
``<checkpoint>+...``; the demo model only with ``WAM_DIFF2_MODEL_PATH=demo``) so a bad one fails before
the bridge is spawned; a planner whose configure fails (ERROR on its status) makes the constructor raise
with the planner's reason instead of leaving the leaderboard waiting for READY. Under Bench2Drive
(``$SAVE_PATH`` and its ``+<save_name>`` on the agent config) it writes ``metric_info.json`` per route
(its base class's ``get_metric_info()`` per step) for Bench2Drive's efficiency and smoothness.

Georeference: the localization node starts with CARLA's default (42.0 / 2.0). When the leaderboard
hands over the route (:meth:`WamDiff2Agent.set_global_plan`, before the first tick) the agent
solves the town's georeference from the route's first point, known both as GNSS and as world
coordinates (as public Bench2Drive agents do), and sets it on the localization node
(``geo.lat_ref_deg`` / ``geo.lon_ref_deg``), so a town whose OpenDRIVE header names its own is
localized right too.

Sensors: the front camera at the resolution, field of view and place the model was trained
with: the checkpoint's camera rig (``wam_diff2_core/camera_rig.py``: the ``camera`` block of its
diffusion_config.json, else the preset named by ``WAM_DIFF2_CAMERA``: ``b2d`` for Bench2Drive's
1600 x 900, fov 70 camera, ``demo`` for the demo world's; checked before the bridge starts), also
given to the planner for its debug image; and the SENSORS track's GNSS, IMU and speedometer for
the localization node, GNSS and IMU on the rear axle (the point the planner's odometry and the
model's waypoints refer to).
"""
from __future__ import annotations

import glob
import os
import threading

from leaderboard.autoagents.autonomous_agent import Track
from leaderboard.autoagents.ros2_agent import ROS2Agent

from wam_diff2_core.localization.georeference import GeoReference
from wam_diff2_core.params.leaderboard import (AGENT_ARGUMENTS, CAMERA_ID, GNSS_ID, IMU_ID, PACKAGE, ROLE_NAME,
                                               SPEEDOMETER_ID, MetricLog, evaluator_environment, model_path_from,
                                               save_directory)
from wam_diff2_core.params.localization import NODE as LOCALIZATION_NODE
from wam_diff2_core.camera_rig import planner_camera_arguments, rig_for_checkpoint
from wam_diff2_core.geometry import DEMO_EGO_BOX
from wam_diff2_core.topics import PLANNER_NODE
from wam_diff2_ros.parameters import set_remote_parameters

DEMO_MODEL = ("models", "wam-diff2-demo-b32")          # under the package's share directory
# the rear axle (the odometry's origin, where GNSS and IMU sit) behind the vehicle's origin: the demo car's
AXLE_BEHIND_CENTRE_M = DEMO_EGO_BOX.centre_from_axle_m


def get_entry_point():
    return "WamDiff2Agent"


def model_path(environ=os.environ) -> str:
    """The checkpoint (``wam_diff2_core.params.leaderboard.model_path_from``), checked before anything starts:
    a directory with a readable ``config.json`` of a model this package loads and safetensors weights.
    Raises ValueError / FileNotFoundError naming the variable it came from and what is wrong."""
    from ament_index_python.packages import get_package_share_directory
    from wam_diff2_core.model.checkpoint import CheckpointError, read_model_config

    path, source = model_path_from(environ, os.path.join(get_package_share_directory(PACKAGE), *DEMO_MODEL))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{source}: {path!r} is not a checkpoint directory")
    try:
        read_model_config(path)
    except CheckpointError as exc:
        raise ValueError(f"{source}: {exc}") from None
    if not glob.glob(os.path.join(path, "*.safetensors")):
        raise FileNotFoundError(f"{source}: {path!r} has no *.safetensors weights")
    return path


class PlannerWatch:
    """While the leaderboard's constructor waits (without a timeout) for the role's ``leaderboard_status`` topic: a node of its
    own that, when the planner reports ERROR (its configure failed: no READY will ever come), keeps the reason
    and releases that wait with a False, so the agent fails at once instead of at the leaderboard's watchdog."""

    def __init__(self, role: str = ROLE_NAME, planner: str = PLANNER_NODE):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import Bool
        from wam_diff2_core.topics import controller_topics
        from wam_diff2_ros.qos import LATCHED_QOS
        from wam_diff2_ros.msg import PlannerStatus

        self.failure: str | None = None
        self._error, self._bool = PlannerStatus.ERROR, Bool
        self.context = rclpy.Context()
        rclpy.init(context=self.context)              # the evaluator's domain: set in the environment already
        self.node = rclpy.create_node("wam_diff2_agent_watch", context=self.context)
        topics = controller_topics(role, planner)
        self._release = self.node.create_publisher(Bool, topics["leaderboard_status"], LATCHED_QOS)
        self.node.create_subscription(PlannerStatus, topics["planner_status"], self._on_status, LATCHED_QOS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True, name="wam-diff2-agent-watch")
        self.thread.start()

    def _on_status(self, msg) -> None:
        if msg.state == self._error and self.failure is None:
            self.failure = msg.message or "ERROR without a message"
            self._release.publish(self._bool(data=False))

    def stop(self) -> None:
        import rclpy
        self.executor.shutdown()
        self.thread.join(5.0)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def georeference_from_plan(global_plan_gps, global_plan_world_coord) -> GeoReference | None:
    """The route's georeference from its first point: ``global_plan_gps[0]`` is ``({"lat", "lon", "z"}, option)``,
    ``global_plan_world_coord[0]`` is ``(carla.Transform, option)`` (CARLA's frame: y points south, hence the
    sign for the map frame). None when either plan is empty."""
    if not global_plan_gps or not global_plan_world_coord:
        return None
    gnss, location = global_plan_gps[0][0], global_plan_world_coord[0][0].location
    return GeoReference.solve(float(gnss["lat"]), float(gnss["lon"]), float(location.x), -float(location.y))


class WamDiff2Agent(ROS2Agent):

    def __init__(self, carla_host, carla_port, debug=False):
        # before the base class starts the bridge, the launch and rclpy: this evaluator's own ROS domain,
        # discovery on this host only, and the checkpoint checked
        os.environ.update(evaluator_environment(int(carla_port)))
        self._model_path = model_path()
        self._camera = rig_for_checkpoint(self._model_path)
        self._metrics: MetricLog | None = None
        self._step = 0
        watch = PlannerWatch()
        try:
            super().__init__(carla_host, carla_port, debug)
        finally:
            watch.stop()
        if watch.failure is not None:
            self.destroy()                                 # the bridge and the launch: not left behind
            raise RuntimeError(f"the planner failed to configure ({self._model_path}): {watch.failure}")

    def get_ros_entrypoint(self):
        # called by the base class's constructor, before setup()
        return {"package": PACKAGE, "launch_file": "leaderboard.launch.py",
                "parameters": {"model_path": self._model_path, **AGENT_ARGUMENTS,
                               **planner_camera_arguments(self._camera, AXLE_BEHIND_CENTRE_M)}}

    def set_global_plan(self, global_plan_gps, global_plan_world_coord):
        super().set_global_plan(global_plan_gps, global_plan_world_coord)
        reference = georeference_from_plan(global_plan_gps, global_plan_world_coord)
        if reference is not None:       # the base class spins ros_node in its own thread
            set_remote_parameters(self.ros_node, LOCALIZATION_NODE, {"geo.lat_ref_deg": reference.lat_deg,
                                                                     "geo.lon_ref_deg": reference.lon_deg})

    def setup(self, path_to_conf_file):
        self.track = Track.SENSORS
        # Bench2Drive appends "+<save_name>" to the agent config; its base class has get_metric_info()
        directory = save_directory(os.environ, path_to_conf_file)
        if directory is not None and hasattr(self, "get_metric_info"):
            self._metrics = MetricLog(directory)

    def run_step(self, input_data, timestamp):
        control = super().run_step(input_data, timestamp)
        if self._metrics is not None:
            if getattr(self, "hero_actor", None) is None:
                self.get_hero()                            # Bench2Drive's base: the ego its metrics read
            self._metrics.add(self._step, self.get_metric_info())
        self._step += 1
        return control

    def destroy(self):
        if self._metrics is not None:
            self._metrics.write()
        super().destroy()

    def sensors(self):
        rig, axle_x = self._camera, -AXLE_BEHIND_CENTRE_M      # the rear axle, from the vehicle's centre
        return [
            {"type": "sensor.camera.rgb", "id": CAMERA_ID,
             "x": rig.x_m, "y": -rig.y_m, "z": rig.z_m,                          # CARLA: y right, pitch up
             "roll": 0.0, "pitch": -rig.pitch_deg, "yaw": 0.0,
             "width": rig.width, "height": rig.height, "fov": rig.fov_deg},
            {"type": "sensor.other.gnss", "id": GNSS_ID, "x": axle_x, "y": 0.0, "z": 0.0},
            {"type": "sensor.other.imu", "id": IMU_ID, "x": axle_x, "y": 0.0, "z": 0.0,
             "roll": 0.0, "pitch": 0.0, "yaw": 0.0},
            {"type": "sensor.speedometer", "id": SPEEDOMETER_ID, "reading_frequency": 20},
        ]
