"""Two planners side by side on one camera, an A/B test: the Block-32 model and the AR model.

    ros2 launch wam_diff2_ros two_planners.launch.py            # the installed demo models
    ros2 launch wam_diff2_ros two_planners.launch.py block32_model_path:=/path/to/b32 ar_model_path:=/path/to/ar \\
        image_topic:=/cam/front/image_raw odometry_topic:=/odom device:=cuda:0

Each planner runs in its own namespace (``block32``, ``ar``: wam_diff2_ros/planner/launching.py,
TWO_PLANNERS) and answers on its own topics, /block32/wam_diff2_planner/output/trajectory and
/ar/wam_diff2_planner/output/trajectory (``stats.block_size`` says which model decoded), from the
same camera and odometry (defaults: carla-ros-bridge's for role ego_vehicle). ``device``,
``image_reliability`` and ``params_file`` apply to both. Compare recorded runs with
``wam-diff2 eval-bag --compare``. test/ros/test_two_planners.py starts the two nodes with these
parameters over DDS.
"""
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument

from wam_diff2_core.topics import carla_topics
from wam_diff2_ros.planner.launching import (TWO_PLANNERS, declare_planner_arguments, demo_model, launch_argument,
                                          planner_node, two_planners)


def generate_launch_description():
    share = get_package_share_directory("wam_diff2_ros")
    topics = carla_topics()
    return LaunchDescription([
        *declare_planner_arguments(share, names=("params_file", "device", "image_reliability")),
        *(DeclareLaunchArgument(f"{namespace}_model_path", default_value=demo_model(share, model),
                                description=f"checkpoint of the planner in /{namespace} (default: the demo {model})")
          for namespace, model in TWO_PLANNERS.items()),
        DeclareLaunchArgument("image_topic", default_value=topics["image"], description="the camera both plan on"),
        DeclareLaunchArgument("odometry_topic", default_value=topics["odometry"]),
        *(planner_node(parameters, remappings, namespace=namespace)
          for namespace, parameters, remappings in two_planners(launch_argument)),
    ])
