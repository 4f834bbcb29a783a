"""Spin a node's executor until Ctrl-C or an external shutdown, both of which end it quietly.

rclpy's SIGINT handler shuts the context down at once, from the signal, while the executor may
be building its next wait set; that one then raises ``RCLError`` ("the given context is not
valid") instead of ``ExternalShutdownException``. After a shutdown that is the shutdown, not an
error, so the node exits 0 as it does on the other two paths.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Callable, TypeVar

import rclpy
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node

NodeT = TypeVar("NodeT", bound=Node)
T = TypeVar("T")


def spin_until_shutdown(executor: Executor) -> None:
    """Returns on Ctrl-C or rclpy.shutdown(); a real error raises."""
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


class SpinThread:
    """``node`` spun by ``executor`` (default: a SingleThreadedExecutor in the node's context) in a daemon
    thread until :meth:`stop`. What a callback raised ends the spinning and is kept in ``error`` (the
    traceback, also logged), not lost with the thread."""

    def __init__(self, node: Node, executor: Executor | None = None):
        self.node, self.error = node, ""
        self.executor = executor or SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        self.thread = threading.Thread(target=self._spin, daemon=True, name=f"spin-{node.get_name()}")
        self.thread.start()

    def _spin(self) -> None:
        try:
            spin_until_shutdown(self.executor)
        except Exception:
            self.error = traceback.format_exc()
            self.node.get_logger().error(f"a callback raised, spinning stopped:\n{self.error}")

    def stop(self, destroy_node: bool = True, timeout_s: float = 10.0) -> None:
        self.executor.shutdown()
        self.thread.join(timeout_s)
        if destroy_node:
            self.node.destroy_node()


def wait_until(condition: Callable[[], Any], timeout_s: float, poll_s: float = 0.0005) -> bool:
    """Poll ``condition`` (state another thread changes without notifying us) until true or the timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
