"""The nodes' /diagnostics: published on a wall-time timer, and the controller's and the localization node's status
as pure functions of their state (the planner's: planner/diagnostics.py).
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from std_msgs.msg import Header

from wam_diff2_core.frame_inputs import NS_PER_S
from wam_diff2_core.localization.odometry_filter import OdometryFilter, V, X, Y, YAW

from .msg import PlannerStatus

STATE_NAMES = {getattr(PlannerStatus, name): name for name in ("UNCONFIGURED", "LOADING", "READY", "ERROR")}
WINDOW = 200                       # recent plans, ticks and holds the means and maxima run over
LOCALIZATION_SENSORS = ("gnss", "imu", "speed")
# Fixes the gate refuses in a row before /diagnostics warns: one is an outlier the gate is there for,
# two in a row are not noise any more (5 sigma each) but the estimate or the GNSS having moved.
GATE_WARN_IN_ROW = 2


def publish_periodically(node: Node, topic: str, period_s: float, status: Callable[[], DiagnosticStatus],
                         **timer_options: Any) -> Callable[[], None]:
    """Publish ``status()`` on ``topic`` every ``period_s`` of wall time (diagnostics keep coming while the
    simulator is paused: sim time stands still); returns the function that publishes it once."""
    publisher = node.create_publisher(DiagnosticArray, topic, 10)

    def publish() -> None:
        publisher.publish(DiagnosticArray(header=Header(stamp=node.get_clock().now().to_msg()), status=[status()]))

    node.create_timer(period_s, publish, clock=Clock(clock_type=ClockType.STEADY_TIME), **timer_options)
    return publish


def node_status(node_name: str, kind: str, level: bytes, message: str, values: Mapping[str, str]) -> DiagnosticStatus:
    """One node's status, named ``<node>: <kind>``, with its key/value table in ``values``' order."""
    return DiagnosticStatus(level=level, name=f"{node_name}: {kind}", message=message, hardware_id="wam_diff2",
                            values=[KeyValue(key=k, value=v) for k, v in values.items()])


def _mean_max(window: Sequence[float], fmt: str) -> tuple[str, str]:
    return (format(np.mean(window), fmt), format(max(window), fmt)) if window else ("none", "none")


@dataclass
class ControllerState:
    """What the controller node keeps between ticks and reports (its one thread writes it)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    last_tick_ns: int | None = None
    planner_state: int | None = None          # from the planner's latched status
    ready_sent: bool = False                  # the leaderboard status True, sent once
    last_reason: str = "no tick yet"          # "following plan", or why the last control braked
    last_command: str | None = None
    plan_ages_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))
    tick_wall_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))
    hold_wall_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))


def controller_diagnostic_status(node_name: str, state: ControllerState, values: Mapping[str, Any],
                                 config_errors: Sequence[str], consumer_error: str,
                                 route_progress_m: float | None) -> DiagnosticStatus:
    """ERROR with bad parameters or a control consumer it cannot publish for, WARN while braking, else OK."""
    if config_errors or consumer_error:
        level = DiagnosticStatus.ERROR
        summary = "; ".join(filter(None, [consumer_error, "bad parameters: " + "; ".join(config_errors)
                                          if config_errors else ""]))
    elif state.last_reason != "following plan":
        level, summary = DiagnosticStatus.WARN, f"braking: {state.last_reason}"
    else:
        level, summary = DiagnosticStatus.OK, "following plan"
    ages, walls, holds = (_mean_max(state.plan_ages_s, ".3f"), _mean_max(state.tick_wall_ms, ".2f"),
                          _mean_max(state.hold_wall_ms, ".1f"))
    return node_status(node_name, "controller", level, summary, {
        "tick_source": values["tick_source"],
        "control_consumer": values["control_consumer"],
        "planner_state": "none" if state.planner_state is None else STATE_NAMES.get(state.planner_state, "?"),
        "leaderboard_status_sent": str(state.ready_sent).lower(),
        "last_tick_s": "never" if state.last_tick_ns is None else f"{state.last_tick_ns / NS_PER_S:.3f}",
        "last_control": state.last_reason,
        "last_command": state.last_command or "none",
        "route_progress_m": "none" if route_progress_m is None else f"{route_progress_m:.1f}",
        "plan_age_at_arrival_mean_s": ages[0], "plan_age_at_arrival_max_s": ages[1],
        "tick_wall_ms_mean": walls[0], "tick_wall_ms_max": walls[1],
        "pacing": values["pacing"],
        "pacing_hold_wall_ms_mean": holds[0], "pacing_hold_wall_ms_max": holds[1],
        **{k: str(v) for k, v in sorted(state.counts.items())}})


@dataclass
class LocalizationState:
    """What the localization node keeps beside its filter and reports (its one thread writes it)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    used_s: dict[str, float] = field(default_factory=dict)   # sensor -> filter time of its newest measurement used
    restart_note: str = ""                    # why the filter restarted, until it is ready again
    route_start_distance_m: float | None = None      # the first fix after a route to the route's start
    route_start_error: str = ""               # that distance beyond route_start_max_distance_m

    def sensor_ages(self) -> dict[str, float | None]:
        """Seconds of stamp time between each sensor's newest measurement used and the newest of any (None: none
        used yet while another sensor was)."""
        newest = max(self.used_s.values(), default=None)
        return {kind: newest - self.used_s[kind] if kind in self.used_s else None for kind in LOCALIZATION_SENSORS}


def localization_diagnostic_status(node_name: str, state: LocalizationState, ekf: OdometryFilter,
                                   values: Mapping[str, Any], config_errors: Sequence[str],
                                   speedometer_error: str) -> DiagnosticStatus:
    """ERROR with bad parameters, a speedometer of another type, a first fix far from the route's start or a
    non-finite standard deviation (never OK with one); WARN until the filter is ready, with a stale sensor or
    GNSS fixes refused in a row by the gate; else OK."""
    p = ekf.covariance
    with np.errstate(invalid="ignore"):                           # a negative variance: nan, not an error
        stddev = {"position_stddev_m": float(np.sqrt(np.max([p[X, X], p[Y, Y]]))),     # np.max keeps a NaN
                  "heading_stddev_deg": float(np.degrees(np.sqrt(p[YAW, YAW]))),
                  "speed_stddev_mps": float(np.sqrt(p[V, V]))}
    ages, timeout = state.sensor_ages(), values["sensor_timeout_s"]
    stale = [f"{kind} ({'none used' if age is None else f'{age:.2f} s behind'})" for kind, age in ages.items()
             if (age is None and state.used_s) or (age is not None and age > timeout)]
    warnings = [f"stale (sensor_timeout_s {timeout:g}): {', '.join(stale)}" if stale else "",
                f"{ekf.gate_refused_in_row} GNSS fixes in a row refused by the gate"
                if ekf.gate_refused_in_row >= GATE_WARN_IN_ROW else ""]
    if config_errors:
        level, summary = DiagnosticStatus.ERROR, "bad parameters: " + "; ".join(config_errors)
    elif speedometer_error or state.route_start_error:
        level, summary = DiagnosticStatus.ERROR, "; ".join(e for e in (speedometer_error, state.route_start_error) if e)
    elif not ekf.ready:
        level, summary = DiagnosticStatus.WARN, "; ".join(filter(None, [
            state.restart_note, "waiting for a GNSS fix, an IMU orientation and a speed", *warnings]))
    elif not all(math.isfinite(v) for v in stddev.values()):
        level, summary = DiagnosticStatus.ERROR, f"non-finite standard deviation: {stddev}"
    elif any(warnings):
        level, summary = DiagnosticStatus.WARN, "localized; " + "; ".join(filter(None, warnings))
    else:
        level, summary = DiagnosticStatus.OK, "localized"
    distance = state.route_start_distance_m
    return node_status(node_name, "localization", level, summary, {
        "ready": str(ekf.ready).lower(),
        **{k: f"{v:.3f}" if ekf.ready else "none" for k, v in stddev.items()},
        **{f"{kind}_age_s": "none" if age is None else f"{age:.3f}" for kind, age in ages.items()},
        "filter_restarts": str(ekf.counts["restarts"]),
        "filter_restarts_non_finite": str(ekf.counts["restarts_non_finite"]),
        "gnss_reacquired": str(ekf.counts["gnss_reacquired"]),
        "gnss_refused_by_gate_in_row": str(ekf.gate_refused_in_row),
        "speedometer_type": values["speedometer_type"],
        "first_fix_to_route_start_m": "none" if distance is None else f"{distance:.1f}",
        **{k: str(v) for k, v in sorted(state.counts.items())}})
