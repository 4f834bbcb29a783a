"""Message packages of other stacks the nodes use where they are installed, and why not where they are not.

carla_msgs comes with a CARLA ROS bridge install and tf2_msgs with a ROS install (here: built from the
upstream interface packages by scripts/build_ros_interfaces.sh). A node that needs one for a setting
names the ``*_ERROR`` in its configuration error instead of failing to import.

    from .optional_msgs import CARLA_MSGS_ERROR, carla_msgs
"""
from __future__ import annotations

try:  # CARLA's control and route messages
    import carla_msgs.msg as carla_msgs
    CARLA_MSGS_ERROR = ""
except ImportError as _exc:
    carla_msgs = None
    CARLA_MSGS_ERROR = str(_exc)

try:  # /tf
    from tf2_msgs.msg import TFMessage
    TF2_MSGS_ERROR = ""
except ImportError as _exc:
    TFMessage = None
    TF2_MSGS_ERROR = str(_exc)
