"""Replay a recorded bag into the WAM-Diff2 planner on the bag's clock.

    ros2 launch wam_diff2_ros bag_replay.launch.py bag:=/path/to/bag model_path:=/path/to/checkpoint
    ros2 launch wam_diff2_ros bag_replay.launch.py bag:=... model_path:=... image_topic:=/cam/front/image_raw \\
        odometry_topic:=/odom route_topic:=/route rate:=0.5

Runs ``ros2 bag play --clock`` and the planner with ``use_sim_time``, so every "now" (image
staleness, pipeline latency) is the bag's time. Topic defaults are carla-ros-bridge's for role
ego_vehicle. ``namespace``, ``device``, ``image_reliability`` and ``params_file`` are the planner
arguments every launch file shares (wam_diff2_ros/planner/launching.py). Playback starts
``play_delay_s`` after launch, when the model is loaded. A slow model plans on the newest frame and
skips the rest (realtime mode); play the bag slower (``rate``) to plan on more frames. Record the outputs with
``ros2 bag record /wam_diff2_planner/output/trajectory ...`` or evaluate offline without ROS
with the same core policy.
"""
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, TimerAction
from launch.substitutions import LaunchConfiguration

from wam_diff2_core.topics import DEFAULT_COMMAND_TOPIC, carla_topics
from wam_diff2_ros.planner.launching import declare_planner_arguments, launch_argument, planner_node, planner_parameters


def generate_launch_description():
    image, bridge = LaunchConfiguration("image_topic"), carla_topics()
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="bag directory or file to play"),
        *declare_planner_arguments(get_package_share_directory("wam_diff2_ros")),
        DeclareLaunchArgument("rate", default_value="1.0", description="bag playback rate"),
        DeclareLaunchArgument("play_delay_s", default_value="20.0",
                              description="start playing after this many seconds, once the model has loaded"),
        DeclareLaunchArgument("image_topic", default_value=bridge["image"]),
        DeclareLaunchArgument("image_transport", default_value="raw",
                              description="raw, or compressed to read <image_topic>/compressed"),
        DeclareLaunchArgument("camera_info_topic", default_value=bridge["camera_info"]),
        DeclareLaunchArgument("odometry_topic", default_value=bridge["odometry"]),
        DeclareLaunchArgument("route_topic", default_value=bridge["route"]),
        DeclareLaunchArgument("command_topic", default_value=DEFAULT_COMMAND_TOPIC),
        planner_node(
            planner_parameters(launch_argument, {
                "use_sim_time": True,
                "mode": "realtime",
                "image_transport": LaunchConfiguration("image_transport"),
            }),
            remappings=[
                ("~/input/image", image),
                ("~/input/image/compressed", [image, "/compressed"]),
                ("~/input/camera_info", LaunchConfiguration("camera_info_topic")),
                ("~/input/odometry", LaunchConfiguration("odometry_topic")),
                ("~/input/route", LaunchConfiguration("route_topic")),
                ("~/input/command", LaunchConfiguration("command_topic")),
            ],
        ),
        TimerAction(period=LaunchConfiguration("play_delay_s"), actions=[
            ExecuteProcess(
                cmd=["ros2", "bag", "play", LaunchConfiguration("bag"), "--clock", "--rate",
                     LaunchConfiguration("rate")],
                output="screen",
            ),
        ]),
    ])
