"""The WAM-Diff2 planner alone (a lifecycle node that configures and activates itself).

    ros2 launch wam_diff2_ros planner.launch.py            # the installed demo Block-32 model
    ros2 launch wam_diff2_ros planner.launch.py model_path:=/path/to/checkpoint
    ros2 launch wam_diff2_ros planner.launch.py model_path:=... params_file:=my_planner.yaml use_sim_time:=true

Without ``model_path`` the planner loads the demo Block-32 model installed with the package
(share/wam_diff2_ros/models/wam-diff2-demo-b32: trained on the synthetic demo world only, see
models/README.md).

Inputs are the node's own topics (/wam_diff2_planner/input/...): remap them with
carla_planner.launch.py, bag_replay.launch.py or your own launch file. Without a ROS
installation the same node starts with
``wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:=...``.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue


def generate_launch_description():
    share = get_package_share_directory("wam_diff2_ros")
    default_params = os.path.join(share, "config", "planner.yaml")
    return LaunchDescription([
        DeclareLaunchArgument("model_path", default_value=os.path.join(share, "models", "wam-diff2-demo-b32"),
                              description="checkpoint directory (Qwen3-VL or WAM-Diff2) or hub id; "
                                          "default: the installed demo Block-32 model"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="planner parameters (defaults: the package's config/planner.yaml)"),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="follow /clock"),
        DeclareLaunchArgument("node_name", default_value="wam_diff2_planner"),
        LifecycleNode(
            package="wam_diff2_ros",
            executable="wam-diff2-planner",
            name=LaunchConfiguration("node_name"),
            namespace="",
            output="screen",
            parameters=[
                LaunchConfiguration("params_file"),
                {
                    "model_path": ParameterValue(LaunchConfiguration("model_path"), value_type=str),
                    "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
                },
            ],
        ),
    ])
