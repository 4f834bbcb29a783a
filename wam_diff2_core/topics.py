"""Topic and node-name defaults, once: carla-ros-bridge's names and the planner node's inputs.

The nodes, the bag evaluator, the bag player and the demo world's bags and closed loop all take
their defaults from here (ROS-free: names only).

    carla_topics("hero")["image"]  # '/carla/hero/rgb_front/image'
    carla_topic_parts("image", LaunchConfiguration("role_name"), "rgb_front")   # a launch file's remapping

    python -m wam_diff2_core.topics carla image --role hero         # one name, for shell scripts
    python -m wam_diff2_core.topics carla                           # every "<key> <topic>", a line each
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any

PACKAGE = "wam_diff2_ros"                                  # the ROS package (its nodes, msg/, launch/)
DEFAULT_ROLE = "ego_vehicle"                              # carla-ros-bridge's default role name
PLANNER_NODE = "wam_diff2_planner"                        # the planner node's default name
CONTROLLER_NODE = "wam_diff2_controller"                  # the controller node's default name
LOCALIZATION_NODE = "wam_diff2_localization"              # the localization node's default name
DEFAULT_COMMAND_TOPIC = f"/{PLANNER_NODE}/input/command"  # the planner node's command input
CARLA_NAMESPACE = "/carla"                                # carla-ros-bridge's topics: /carla/<role>/...
DEFAULT_CAMERA = "rgb_front"                              # the front camera's sensor id
DEFAULT_GNSS, DEFAULT_IMU, DEFAULT_SPEEDOMETER = "gnss", "imu", "speedometer"   # the localization sensors' ids


def carla_namespace(role: str = DEFAULT_ROLE) -> str:
    """The namespace of an ego ``role``'s bridge topics (``/carla/<role>``)."""
    return f"{CARLA_NAMESPACE}/{role}"


def carla_topics(role: str = DEFAULT_ROLE, camera: str = DEFAULT_CAMERA) -> dict[str, str]:
    """carla-ros-bridge's topics of an ego ``role``: odometry, objects, route (``waypoints``), camera."""
    base = carla_namespace(role)
    return {"odometry": f"{base}/odometry", "objects": f"{base}/objects", "route": f"{base}/waypoints",
            "camera_info": f"{base}/{camera}/camera_info", "image": f"{base}/{camera}/image"}


def controller_topics(role: str = DEFAULT_ROLE, planner: str = PLANNER_NODE) -> dict[str, str]:
    """Every topic the controller uses, for a CARLA ego ``role`` and a planner node name."""
    carla, plan, bridge = carla_namespace(role), f"/{planner.strip('/')}", carla_topics(role)
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


def localization_topics(role: str = DEFAULT_ROLE, gnss_id: str = DEFAULT_GNSS, imu_id: str = DEFAULT_IMU,
                        speedometer_id: str = DEFAULT_SPEEDOMETER) -> dict[str, str]:
    """Every topic the localization node uses, for a CARLA ego ``role`` and its sensors' ids."""
    carla, routes = carla_namespace(role), controller_topics(role)
    return {"gnss": f"{carla}/{gnss_id}", "imu": f"{carla}/{imu_id}", "speedometer": f"{carla}/{speedometer_id}",
            "odometry": routes["odometry"], "route": routes["route"], "carla_route": routes["carla_route"],
            "diagnostics": "/diagnostics", "tf": "/tf"}


_ROLE_MARK, _CAMERA_MARK = "\x00role\x00", "\x00camera\x00"


def carla_topic_parts(name: str, role: Any, camera: Any = DEFAULT_CAMERA) -> tuple[Any, ...]:
    """``carla_topics(role, camera)[name]`` where ``role`` or ``camera`` is no string (a launch substitution,
    a launch argument's spec): the topic's literal pieces and those objects, in order."""
    topic = carla_topics(_ROLE_MARK, _CAMERA_MARK)[name]
    marks = {_ROLE_MARK: role, _CAMERA_MARK: camera}
    parts: list[Any] = []
    for piece in re.split(f"({_ROLE_MARK}|{_CAMERA_MARK})", topic):
        value = marks.get(piece, piece)
        if isinstance(value, str) and parts and isinstance(parts[-1], str):
            parts[-1] += value                     # adjacent literal pieces as one
        elif not isinstance(value, str) or value:
            parts.append(value)
    return tuple(parts)


_TABLES = {"carla": carla_topics, "controller": controller_topics, "localization": localization_topics}


def main(argv: list[str] | None = None) -> int:
    """Print topic names, so that shell scripts ask for them instead of spelling them."""
    parser = argparse.ArgumentParser(prog="python -m wam_diff2_core.topics", description=main.__doc__)
    parser.add_argument("table", choices=tuple(_TABLES), help="whose topics")
    parser.add_argument("name", nargs="?", help="the topic's key, e.g. odometry (default: every '<key> <topic>')")
    parser.add_argument("--role", default=DEFAULT_ROLE, help=f"the CARLA ego role (default {DEFAULT_ROLE})")
    args = parser.parse_args(argv)
    topics = _TABLES[args.table](args.role)
    if args.name is None:
        print("\n".join(f"{name} {topic}" for name, topic in topics.items()))
    elif args.name in topics:
        print(topics[args.name])
    else:
        parser.error(f"name: {args.name!r} is not one of {sorted(topics)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
