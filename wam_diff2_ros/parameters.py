"""The nodes' ROS parameters, declared from the core's spec tables (``wam_diff2_core.params.planner`` /
``.controller`` / ``.localization``), which hold the defaults, ranges, validation, YAML files and README tables.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from wam_diff2_core.params.spec import CONFIGURE, START, ParamSpec


def _constraints(spec: ParamSpec) -> str:
    parts = []
    if spec.choices is not None:
        parts.append("one of: " + ", ".join(spec.choices))
    if spec.apply == CONFIGURE:
        parts.append("applied on configure; rejected while a model is loaded (cleanup first)")
    if spec.apply == START:
        parts.append("read once at start")
    return "; ".join(parts)


def descriptor(spec: ParamSpec):
    """An rcl_interfaces ParameterDescriptor (ranges are enforced by rclpy as well as here)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    d = ParameterDescriptor(name=spec.name, description=spec.description,
                            additional_constraints=_constraints(spec), read_only=spec.apply == START)
    if spec.kind is int and (spec.low is not None or spec.high is not None):
        d.integer_range = [IntegerRange(from_value=int(spec.low if spec.low is not None else -2**63),
                                        to_value=int(spec.high if spec.high is not None else 2**63 - 1), step=0)]
    elif spec.kind is float and (spec.low is not None or spec.high is not None):
        d.floating_point_range = [FloatingPointRange(
            from_value=float(spec.low if spec.low is not None else -sys.float_info.max),
            to_value=float(spec.high if spec.high is not None else sys.float_info.max), step=0.0)]
    return d


def declare_all(node, specs: Iterable[ParamSpec]) -> dict[str, str]:
    """Declare every spec of ``specs`` on ``node`` with its descriptor; values come from overrides (YAML, -p).

    An override rclpy refuses (wrong type, out of range) does not stop the node: the parameter is
    declared with its default and the refusal is returned ({name: reason}), so configure can
    fail with that reason while the node stays up to report it.
    """
    from rclpy.parameter import Parameter

    rejected: dict[str, str] = {}
    for spec in specs:
        # no default: declared statically typed and unset (a list spec is a string array, not list()'s BYTE_ARRAY)
        unset = Parameter.Type.STRING_ARRAY if spec.kind is list else Parameter.Type.from_parameter_value(spec.kind())
        initial = spec.default if spec.default is not None else unset
        try:
            node.declare_parameter(spec.name, initial, descriptor(spec))
        except Exception as exc:  # rclpy raises several exception types for a refused override
            node.declare_parameter(spec.name, initial, descriptor(spec), ignore_override=True)
            rejected[spec.name] = f"{spec.name}: the given value was refused ({exc})"
    return rejected


def read_all(node, specs: Iterable[ParamSpec]) -> dict[str, Any]:
    """Every spec's current value on ``node``; None for a parameter declared unset."""
    from rclpy.exceptions import ParameterUninitializedException

    values = {}
    for spec in specs:
        try:
            values[spec.name] = node.get_parameter(spec.name).value
        except ParameterUninitializedException:
            values[spec.name] = None
    return values


def set_remote_parameters(node, target: str, values: dict[str, Any], timeout_s: float = 10.0) -> None:
    """Set ``values`` on the node named ``target`` (``/wam_diff2_localization``) at once (its
    ``set_parameters_atomically`` service: all or none, one change seen), from ``node``, which another
    thread spins (as the leaderboard's ``ROS2Agent`` spins its ``ros_node``). Raises RuntimeError naming the
    service, or the refused values and the node's reason."""
    import threading

    from rcl_interfaces.srv import SetParametersAtomically
    from rclpy.parameter import Parameter

    service = f"/{target.strip('/')}/set_parameters_atomically"
    client = node.create_client(SetParametersAtomically, service)
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise RuntimeError(f"{service} did not appear within {timeout_s:g} s: is {target} running?")
        done = threading.Event()
        future = client.call_async(SetParametersAtomically.Request(
            parameters=[Parameter(k, value=v).to_parameter_msg() for k, v in values.items()]))
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            raise RuntimeError(f"{service}: no answer within {timeout_s:g} s")
        result = future.result().result
        if not result.successful:
            raise RuntimeError(f"{target} refused {values}: {result.reason}")
    finally:
        node.destroy_client(client)
