"""The WAM-Diff2 planner on carla-ros-bridge topics, for CARLA in synchronous mode.

    ros2 launch carla_ros_bridge carla_ros_bridge_with_example_ego_vehicle.launch.py synchronous_mode:=true
    ros2 launch wam_diff2_ros carla_planner.launch.py model_path:=/path/to/checkpoint role_name:=ego_vehicle

Remaps the node's inputs onto carla-ros-bridge's topics of <role_name> (wam_diff2_core/topics.py):
the <camera_id> image (bgra8) and camera_info, the odometry and the waypoints (the latched route;
the command is derived from its geometry), and runs on simulation time. Lockstep mode plans on every N-th
camera tick (CARLA ticks at 20 Hz; N=10 plans at 2 Hz, one plan per 0.5 s waypoint step) while a
controller acts on the newest plan every tick. Publish a RoadOption on
/<node_name>/input/command to override the route. The camera.* parameters must describe the
camera you spawned (defaults: the bridge example's rgb_front, x 2.0 m, z 2.0 m, 90 deg FOV).
``namespace``, ``device``, ``params_file`` and ``image_reliability`` (here ``reliable`` by
default, as the bridge publishes) are the planner arguments every launch file shares
(wam_diff2_ros/planner/launching.py).
"""
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument

from wam_diff2_core.topics import DEFAULT_CAMERA, DEFAULT_ROLE
from wam_diff2_ros.planner.launching import (bridge_remappings, declare_planner_arguments, launch_argument, planner_node,
                                          planner_parameters)


def generate_launch_description():
    share = get_package_share_directory("wam_diff2_ros")
    return LaunchDescription([
        # the bridge publishes its camera reliable; on best effort most raw frames of more than
        # ~0.5 MB never arrive over Fast DDS (wam_diff2_ros/README.md, image QoS)
        *declare_planner_arguments(share, image_reliability="reliable"),
        DeclareLaunchArgument("role_name", default_value=DEFAULT_ROLE, description="CARLA ego role name"),
        DeclareLaunchArgument("camera_id", default_value=DEFAULT_CAMERA, description="front camera sensor id"),
        DeclareLaunchArgument("mode", default_value="lockstep", description="realtime | lockstep"),
        DeclareLaunchArgument("lockstep_every_n_images", default_value="10",
                              description="lockstep: plan on every N-th camera tick"),
        planner_node(
            planner_parameters(launch_argument, {
                "use_sim_time": True,
                "mode": launch_argument("mode"),
                "lockstep_every_n_images": launch_argument("lockstep_every_n_images"),
                "image_transport": "raw",
            }),
            remappings=bridge_remappings(launch_argument),
        ),
    ])
