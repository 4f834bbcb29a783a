"""The WAM-Diff2 planner alone (a lifecycle node that configures and activates itself).

    ros2 launch wam_diff2_ros planner.launch.py            # the installed demo Block-32 model
    ros2 launch wam_diff2_ros planner.launch.py model_path:=/path/to/checkpoint device:=cuda:1
    ros2 launch wam_diff2_ros planner.launch.py model_path:=... params_file:=my_planner.yaml use_sim_time:=true
    ros2 launch wam_diff2_ros planner.launch.py namespace:=ar model_path:=.../wam-diff2-demo-ar

Without ``model_path`` the planner loads the demo Block-32 model installed with the package
(share/wam_diff2_ros/models/wam-diff2-demo-b32: trained on the synthetic demo world only, see
models/README.md). ``namespace``, ``device``, ``image_reliability`` and ``params_file`` are the
arguments every planner launch file shares (wam_diff2_ros/planner/launching.py).

Inputs are the node's own topics (/<namespace>/wam_diff2_planner/input/...): remap them with
carla_planner.launch.py, bag_replay.launch.py or your own launch file. Without a ROS
installation the same node starts with
``wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:=...``.
"""
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument

from wam_diff2_ros.planner.launching import (declare_planner_arguments, demo_model, launch_argument, planner_node,
                                          planner_parameters)


def generate_launch_description():
    share = get_package_share_directory("wam_diff2_ros")
    return LaunchDescription([
        *declare_planner_arguments(share, model_path=demo_model(share)),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="follow /clock"),
        DeclareLaunchArgument("node_name", default_value="wam_diff2_planner"),
        planner_node(planner_parameters(launch_argument, {"use_sim_time": launch_argument("use_sim_time")}),
                     name=launch_argument("node_name")),
    ])
