"""The WAM-Diff2 agent for the CARLA leaderboard / Bench2Drive ROS agent setup: localization + planner + controller.

    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=/path/to/checkpoint
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=... role_name:=ego_vehicle lockstep_n:=5
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=... localization:=false   # the bridge's odometry

The leaderboard's SENSORS track gives GNSS, IMU and a speedometer, no odometry: with
``localization`` true (the default) the localization node turns /carla/<role_name>/<gnss_id>,
<imu_id> and <speedometer_id> into /carla/<role_name>/odometry (``lat_ref_deg`` /
``lon_ref_deg``: the town's georeference, CARLA's 42.0 / 2.0 by default; the agent sets each
route's own on the node once the route is known). agents/wam_diff2_agent.py starts this file.

The planner (a lifecycle node) plans in lockstep on every ``lockstep_n``-th camera tick of
/carla/<role_name>/<camera_id>/image, on simulation time; the controller answers every tick
(each /carla/<role_name>/odometry message, or each /clock message with tick_source:=clock)
with carla_msgs/CarlaEgoVehicleControl on /carla/<role_name>/vehicle_control_cmd, stamped
with the tick's sim time, and publishes the latched std_msgs/Bool True on
/carla/<role_name>/status once the planner is READY (model loaded, warmed up), which is when
the leaderboard starts ticking (never without carla_msgs: then the controller reports ERROR on
/diagnostics instead). The controller tracks the route (/carla/<role_name>/global_plan
CarlaRoute with RoadOptions, or /carla/<role_name>/waypoints) and sends its command to the
planner. ``fixed_delta_seconds`` is the simulator's tick (the leaderboard's 0.05 s): a plan
arriving more than lockstep_n ticks after its image counts as late in /diagnostics.
See docs/carla.md.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue

from wam_diff2_core.params.localization import DEFAULTS as LOCALIZATION_DEFAULTS


def generate_launch_description():
    share = get_package_share_directory("wam_diff2_ros")
    role = LaunchConfiguration("role_name")
    camera = LaunchConfiguration("camera_id")
    lockstep_n = LaunchConfiguration("lockstep_n")
    return LaunchDescription([
        DeclareLaunchArgument("model_path", description="checkpoint directory (Qwen3-VL or WAM-Diff2)"),
        DeclareLaunchArgument("role_name", default_value="hero", description="CARLA ego role name (leaderboard: hero)"),
        DeclareLaunchArgument("camera_id", default_value="rgb_front", description="front camera sensor id"),
        DeclareLaunchArgument("lockstep_n", default_value="10",
                              description="plan on every N-th camera tick (10 at 20 Hz: 2 Hz, one plan per 0.5 s)"),
        DeclareLaunchArgument("fixed_delta_seconds", default_value="0.05", description="simulator tick (seconds)"),
        DeclareLaunchArgument("tick_source", default_value="odometry",
                              description="controller tick: odometry (each odometry message) | clock (each /clock)"),
        DeclareLaunchArgument("device", default_value="auto", description="planner device: auto, cpu, cuda[:N]"),
        DeclareLaunchArgument("planner_params_file", default_value=os.path.join(share, "config", "planner.yaml")),
        DeclareLaunchArgument("controller_params_file",
                              default_value=os.path.join(share, "config", "controller.yaml")),
        DeclareLaunchArgument("localization", default_value="true",
                              description="true: odometry from GNSS + IMU + speedometer (SENSORS track); "
                                          "false: the bridge's odometry pseudo-sensor"),
        DeclareLaunchArgument("gnss_id", default_value="gnss", description="GNSS sensor id"),
        DeclareLaunchArgument("imu_id", default_value="imu", description="IMU sensor id"),
        DeclareLaunchArgument("speedometer_id", default_value="speedometer", description="speedometer sensor id"),
        DeclareLaunchArgument("lat_ref_deg", default_value=str(LOCALIZATION_DEFAULTS["geo.lat_ref_deg"]),
                              description="the town's georeference latitude (OpenDRIVE header; degrees)"),
        DeclareLaunchArgument("lon_ref_deg", default_value=str(LOCALIZATION_DEFAULTS["geo.lon_ref_deg"]),
                              description="the town's georeference longitude (degrees)"),
        Node(
            package="wam_diff2_ros",
            executable="wam-diff2-localization",
            name="wam_diff2_localization",
            namespace="",
            output="screen",
            condition=IfCondition(LaunchConfiguration("localization")),
            parameters=[{
                "role_name": role,
                "use_sim_time": True,
                "gnss_id": LaunchConfiguration("gnss_id"),
                "imu_id": LaunchConfiguration("imu_id"),
                "speedometer_id": LaunchConfiguration("speedometer_id"),
                "geo.lat_ref_deg": ParameterValue(LaunchConfiguration("lat_ref_deg"), value_type=float),
                "geo.lon_ref_deg": ParameterValue(LaunchConfiguration("lon_ref_deg"), value_type=float),
            }],
        ),
        LifecycleNode(
            package="wam_diff2_ros",
            executable="wam-diff2-planner",
            name="wam_diff2_planner",
            namespace="",
            output="screen",
            parameters=[
                LaunchConfiguration("planner_params_file"),
                {
                    "model_path": ParameterValue(LaunchConfiguration("model_path"), value_type=str),
                    "device": LaunchConfiguration("device"),
                    "use_sim_time": True,
                    "mode": "lockstep",
                    "lockstep_every_n_images": ParameterValue(lockstep_n, value_type=int),
                    "image_transport": "raw",
                    # the bridge publishes its camera reliable; on best effort most raw frames of more
                    # than ~0.5 MB never arrive over Fast DDS (wam_diff2_ros/README.md, image QoS)
                    "image_reliability": "reliable",
                },
            ],
            remappings=[
                ("~/input/image", ["/carla/", role, "/", camera, "/image"]),
                ("~/input/camera_info", ["/carla/", role, "/", camera, "/camera_info"]),
                ("~/input/odometry", ["/carla/", role, "/odometry"]),
                # no route remap: the controller sends the route's command to ~/input/command
            ],
        ),
        Node(
            package="wam_diff2_ros",
            executable="wam-diff2-controller",
            name="wam_diff2_controller",
            namespace="",
            output="screen",
            parameters=[
                LaunchConfiguration("controller_params_file"),
                {
                    "role_name": role,
                    "planner_name": "wam_diff2_planner",
                    "use_sim_time": True,
                    "tick_source": LaunchConfiguration("tick_source"),
                    "plan_deadline_s": ParameterValue(
                        PythonExpression([lockstep_n, " * ", LaunchConfiguration("fixed_delta_seconds")]),
                        value_type=float),
                    "route.publish_command": True,
                },
            ],
        ),
    ])
