"""The QoS profiles of the nodes and tools, each defined once here (besides rclpy's ``qos_profile_sensor_data``).

A reliable publisher matches best-effort and reliable subscribers alike; a transient-local one matches
volatile and transient-local subscribers.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy


def keep_last_qos(depth: int, *, reliable: bool = True, latched: bool = False) -> QoSProfile:
    """Keep last ``depth``; reliable or best effort; transient local (``latched``) or volatile."""
    return QoSProfile(depth=depth, history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)


# the newest message, kept for subscribers that join later: routes, statuses
LATCHED_QOS = keep_last_qos(1, latched=True)
# the newest message, not lost on the wire: commands, plans, controls, the planner's outputs, a /clock publisher
LATEST_RELIABLE_QOS = keep_last_qos(1)
# a /clock subscription as rclpy's and rclcpp's own (best effort): a reliable /clock publisher matches it
CLOCK_SUBSCRIPTION_QOS = keep_last_qos(10, reliable=False)
# carla-ros-bridge's sensors, camera and odometry (reliable, keep last 10)
BRIDGE_QOS = keep_last_qos(10)
# the closed loop's simulator reading controls, plans, estimates and /diagnostics
RECEIVE_QOS = keep_last_qos(20)
# tf2_ros's TransformBroadcaster (so tf2 listeners match as with any broadcaster) and replayed streams: a deep
# history lets a slow reliable reader (a Python node on a busy machine) catch up
DEEP_RELIABLE_QOS = keep_last_qos(100)
# reliable, keep all: no message lost on the wire or overwritten in a reader's queue (lockstep counts images)
KEEP_ALL_QOS = QoSProfile(depth=0, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.VOLATILE)
