"""Spin a node's executor until Ctrl-C or an external shutdown, both of which end it quietly.

    executor.add_node(node)
    spin_until_shutdown(executor)      # returns on Ctrl-C / rclpy.shutdown(); a real error raises

    def main(args=None) -> int:        # a node's main(): init, spin, tear down
        run_node(ControllerNode, args)
        return 0

rclpy's SIGINT handler shuts the context down at once, from the signal, while the executor may
be building its next wait set; that one then raises ``RCLError`` ("the given context is not
valid") instead of ``ExternalShutdownException``. After a shutdown that is the shutdown, not an
error, so the node exits 0 as it does on the other two paths.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import rclpy
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node

NodeT = TypeVar("NodeT", bound=Node)
T = TypeVar("T")


def spin_until_shutdown(executor: Executor) -> None:
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except _rclpy.RCLError:
        if executor.context.ok():      # the context is still up: a real failure
            raise


def run_node(make_node: Callable[[], NodeT], args: list[str] | None = None,
             before_teardown: Callable[[NodeT], T] | None = None) -> T | None:
    """``rclpy.init``, spin ``make_node()`` until Ctrl-C or shutdown, then shut the executor, the node and
    rclpy down. ``before_teardown(node)`` runs first on the way out (also after an error); its result is returned.

    One thread: the nodes' callbacks only store inputs and act on ticks (the planner decodes in its own
    worker), and rclpy's MultiThreadedExecutor busy-spun a core and the GIL, starving the decode (README).
    """
    rclpy.init(args=args)
    node = make_node()
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    result = None
    try:
        spin_until_shutdown(executor)
    finally:
        if before_teardown is not None:
            result = before_teardown(node)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return result
