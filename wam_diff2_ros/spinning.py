"""Spin a node's executor until Ctrl-C or an external shutdown, both of which end it quietly.

    executor.add_node(node)
    spin_until_shutdown(executor)      # returns on Ctrl-C / rclpy.shutdown(); a real error raises

rclpy's SIGINT handler shuts the context down at once, from the signal, while the executor may
be building its next wait set; that one then raises ``RCLError`` ("the given context is not
valid") instead of ``ExternalShutdownException``. After a shutdown that is the shutdown, not an
error, so the node exits 0 as it does on the other two paths.
"""
from __future__ import annotations

from rclpy.executors import Executor, ExternalShutdownException
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy


def spin_until_shutdown(executor: Executor) -> None:
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except _rclpy.RCLError:
        if executor.context.ok():      # the context is still up: a real failure
            raise
