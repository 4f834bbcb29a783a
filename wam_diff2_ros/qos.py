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
