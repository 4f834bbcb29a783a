"""Topic and node-name defaults, once: carla-ros-bridge's names and the planner node's inputs.

The nodes, the bag evaluator, the bag player and the demo world's bags and closed loop all take
their defaults from here (ROS-free: names only).

    carla_topics("hero")["image"]  # '/carla/hero/rgb_front/image'
"""
from __future__ import annotations

DEFAULT_ROLE = "ego_vehicle"                              # carla-ros-bridge's default role name
PLANNER_NODE = "wam_diff2_planner"                        # the planner node's default name
CONTROLLER_NODE = "wam_diff2_controller"                  # the controller node's default name
LOCALIZATION_NODE = "wam_diff2_localization"              # the localization node's default name
DEFAULT_COMMAND_TOPIC = f"/{PLANNER_NODE}/input/command"  # the planner node's command input


def carla_topics(role: str = DEFAULT_ROLE, camera: str = "rgb_front") -> dict[str, str]:
    """carla-ros-bridge's topics of an ego ``role``: odometry, other agents (``objects``), route
    (``waypoints``), camera image and info."""
    base = f"/carla/{role}"
    return {"odometry": f"{base}/odometry", "objects": f"{base}/objects", "route": f"{base}/waypoints",
            "camera_info": f"{base}/{camera}/camera_info", "image": f"{base}/{camera}/image"}
