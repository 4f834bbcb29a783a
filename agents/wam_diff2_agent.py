"""The WAM-Diff2 agent for the CARLA Leaderboard 2.0 / Bench2Drive, as a leaderboard ROS 2 agent.

    export WAM_DIFF2_MODEL_PATH=/path/to/checkpoint          # default: the installed demo model
    export TEAM_AGENT=$(ros2 pkg prefix --share wam_diff2_ros)/agents/wam_diff2_agent.py
    python3 ${LEADERBOARD_ROOT}/leaderboard/leaderboard_evaluator.py --agent=${TEAM_AGENT} \\
        --routes=${ROUTES} --track=SENSORS ...                                 # docs/carla.md, section 2

The leaderboard's ``ROS2Agent`` (``leaderboard/autoagents/ros2_agent.py``) starts the
carla-ros-bridge in passive mode, spawns :meth:`WamDiff2Agent.sensors` on the ego (role
``hero``) through the bridge, then runs ``ros2 launch`` with :meth:`get_ros_entrypoint`:
this package's ``leaderboard.launch.py`` (localization + planner + controller). It waits for
the latched True on ``/carla/hero/status`` (the controller sends it once the planner is
READY), publishes the route on ``/carla/hero/global_plan`` and takes one
``/carla/hero/vehicle_control_cmd`` per tick, stamped with the tick's time.

Georeference: the localization node starts with CARLA's default (42.0 / 2.0). When the leaderboard
hands over the route (:meth:`WamDiff2Agent.set_global_plan`, before the first tick) the agent
solves the town's georeference from the route's first point, known both as GNSS and as world
coordinates (as public Bench2Drive agents do), and sets it on the localization node
(``geo.lat_ref_deg`` / ``geo.lon_ref_deg``), so a town whose OpenDRIVE header names its own is
localized right too.

Sensors: the front camera at the resolution, field of view and place the model was trained
with (the demo world's camera, ``wam_diff2_core.sim.camera.CameraSettings``: 320 x 180,
90 deg, 1.7 m ahead of the rear axle at 1.6 m; CARLA places sensors from the vehicle's
centre), and the SENSORS track's GNSS, IMU and speedometer for the localization node, GNSS
and IMU on the rear axle (the point the planner's odometry and the model's waypoints refer to).
"""
from __future__ import annotations

import os

from leaderboard.autoagents.autonomous_agent import Track
from leaderboard.autoagents.ros2_agent import ROS2Agent

from wam_diff2_core.localization import GeoReference
from wam_diff2_core.params.leaderboard import AGENT_ARGUMENTS, CAMERA_ID, GNSS_ID, IMU_ID, PACKAGE, SPEEDOMETER_ID
from wam_diff2_core.params.localization import NODE as LOCALIZATION_NODE
from wam_diff2_core.sim.camera import CameraSettings
from wam_diff2_core.sim.vehicles import BicycleParams
from wam_diff2_ros.parameters import set_remote_parameters

MODEL_PATH_ENV = "WAM_DIFF2_MODEL_PATH"
DEMO_MODEL = ("models", "wam-diff2-demo-b32")          # under the package's share directory


def get_entry_point():
    return "WamDiff2Agent"


def model_path() -> str:
    """``$WAM_DIFF2_MODEL_PATH``, else the demo model installed with the package."""
    path = os.environ.get(MODEL_PATH_ENV, "")
    if not path:
        from ament_index_python.packages import get_package_share_directory
        path = os.path.join(get_package_share_directory("wam_diff2_ros"), *DEMO_MODEL)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{MODEL_PATH_ENV}: {path!r} is not a checkpoint directory")
    return path


def georeference_from_plan(global_plan_gps, global_plan_world_coord) -> GeoReference | None:
    """The route's georeference from its first point: ``global_plan_gps[0]`` is ``({"lat", "lon", "z"}, option)``,
    ``global_plan_world_coord[0]`` is ``(carla.Transform, option)`` (CARLA's frame: y points south, hence the
    sign for the map frame). None when either plan is empty."""
    if not global_plan_gps or not global_plan_world_coord:
        return None
    gnss, location = global_plan_gps[0][0], global_plan_world_coord[0][0].location
    return GeoReference.solve(float(gnss["lat"]), float(gnss["lon"]), float(location.x), -float(location.y))


class WamDiff2Agent(ROS2Agent):

    def get_ros_entrypoint(self):
        # called by the base class's constructor, before setup(): the model comes from the environment
        return {"package": PACKAGE, "launch_file": "leaderboard.launch.py",
                "parameters": {"model_path": model_path(), **AGENT_ARGUMENTS}}

    def set_global_plan(self, global_plan_gps, global_plan_world_coord):
        super().set_global_plan(global_plan_gps, global_plan_world_coord)
        reference = georeference_from_plan(global_plan_gps, global_plan_world_coord)
        if reference is not None:       # the base class spins ros_node in its own thread
            set_remote_parameters(self.ros_node, LOCALIZATION_NODE, {"geo.lat_ref_deg": reference.lat_deg,
                                                                     "geo.lon_ref_deg": reference.lon_deg})

    def setup(self, path_to_conf_file):
        self.track = Track.SENSORS

    def sensors(self):
        camera, car = CameraSettings(), BicycleParams()
        axle_x = -car.centre_from_axle_m               # the rear axle, from the vehicle's centre
        mount = camera.mount
        return [
            {"type": "sensor.camera.rgb", "id": CAMERA_ID,
             "x": axle_x + mount.x_m, "y": -mount.y_m, "z": mount.z_m,          # CARLA: y right, pitch up
             "roll": mount.roll_deg, "pitch": -mount.pitch_deg, "yaw": -mount.yaw_deg,
             "width": camera.width, "height": camera.height, "fov": camera.horizontal_fov_deg},
            {"type": "sensor.other.gnss", "id": GNSS_ID, "x": axle_x, "y": 0.0, "z": 0.0},
            {"type": "sensor.other.imu", "id": IMU_ID, "x": axle_x, "y": 0.0, "z": 0.0,
             "roll": 0.0, "pitch": 0.0, "yaw": 0.0},
            {"type": "sensor.speedometer", "id": SPEEDOMETER_ID, "reading_frequency": 20},
        ]
