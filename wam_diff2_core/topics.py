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


def controller_topics(role: str = DEFAULT_ROLE, planner: str = PLANNER_NODE) -> dict[str, str]:
    """Every topic the controller uses, for a CARLA ego ``role`` and a planner node name."""
    carla, plan, bridge = f"/carla/{role}", f"/{planner.strip('/')}", carla_topics(role)
    return {
        "odometry": bridge["odometry"],
        "clock": "/clock",
        "trajectory": f"{plan}/output/trajectory",
        "planner_status": f"{plan}/status",
        "route": bridge["route"],
        "carla_route": f"{carla}/global_plan",
        "control": "~/output/control",
        "carla_control": f"{carla}/vehicle_control_cmd",
        "leaderboard_status": f"{carla}/status",
        "command": f"{plan}/input/command",
        "diagnostics": "/diagnostics",
    }


def localization_topics(role: str = DEFAULT_ROLE, gnss_id: str = "gnss", imu_id: str = "imu",
                        speedometer_id: str = "speedometer") -> dict[str, str]:
    """Every topic the localization node uses, for a CARLA ego ``role`` and its sensors' ids."""
    carla, routes = f"/carla/{role}", controller_topics(role)
    return {"gnss": f"{carla}/{gnss_id}", "imu": f"{carla}/{imu_id}", "speedometer": f"{carla}/{speedometer_id}",
            "odometry": routes["odometry"], "route": routes["route"], "carla_route": routes["carla_route"],
            "diagnostics": "/diagnostics", "tf": "/tf"}
