"""The QoS profiles the nodes share (each node names its topics' QoS from these).

    node.create_publisher(Path, "~/route", LATCHED_QOS)
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# the newest message, kept for subscribers that join later: routes, statuses
LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                         history=HistoryPolicy.KEEP_LAST)
# the newest message, not lost on the wire (matches reliable publishers of any durability): commands, plans, controls
LATEST_RELIABLE_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
# a /clock subscription as rclpy's and rclcpp's own (best effort): a reliable /clock publisher matches it
CLOCK_SUBSCRIPTION_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT,
                                    durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
# a /clock publisher: reliable matches best-effort time sources and reliable subscribers alike
CLOCK_PUBLISHER_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                                 history=HistoryPolicy.KEEP_LAST)
# odometry as the bridge publishes it (reliable, keep 10); best-effort readers match
ODOMETRY_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                          history=HistoryPolicy.KEEP_LAST)
# tf2_ros's TransformBroadcaster QoS (reliable, volatile, keep last 100), so tf2 listeners match as with any broadcaster
TF_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                    history=HistoryPolicy.KEEP_LAST)
