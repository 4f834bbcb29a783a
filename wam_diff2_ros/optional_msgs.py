"""Message packages of other stacks the nodes use where they are installed, and why not where they are not.

carla_msgs and derived_object_msgs come with a CARLA ROS bridge install and tf2_msgs with a ROS install
(here: built from the upstream interface packages by scripts/build_ros_interfaces.sh). A node that needs
one for a setting names the ``*_ERROR`` in its configuration error instead of failing to import; the
planner simply has no ``~/input/objects`` without derived_object_msgs.
"""
from __future__ import annotations

import importlib

try:  # CARLA's control and route messages
    import carla_msgs.msg as carla_msgs
    CARLA_MSGS_ERROR = ""
except ImportError as _exc:
    carla_msgs = None
    CARLA_MSGS_ERROR = str(_exc)

try:  # carla-ros-bridge's objects (the planner's ~/input/objects)
    import derived_object_msgs.msg as derived_object_msgs
except ImportError:
    derived_object_msgs = None

try:  # /tf
    from tf2_msgs.msg import TFMessage
    TF2_MSGS_ERROR = ""
except ImportError as _exc:
    TFMessage = None
    TF2_MSGS_ERROR = str(_exc)


def message_class(msgtype: str):
    """``pkg/msg/Type`` -> the rclpy message class, or None when the package is not importable here."""
    try:
        package, kind, name = msgtype.split("/")
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    except (ValueError, ImportError, AttributeError):
        return None
