"""Hostile inputs for the localization node and the controller node, over real DDS: a fuzz.

Each run spins the real node in this process (a callback that raises is reported, not lost) and a probe
that plays the bridge, the simulator and the planner: phase after phase, good ticks of the demo world's
expert and hostile ones (:mod:`.hostile_messages`), bursts (a message sent 3 to 15 times without
waiting) and silence (an input left out for a whole phase), each message waited for until the node's
counters show it handled. Run it with ROS_PYTHON_CHECK_FIELDS=1 (scripts/hostile_inputs.py sets it), so
that building an output from a hostile value raises, as on Humble.

It checks (``FuzzReport.problems``) that no callback raised, every output was finite and in range
(``_odometry_problem``, ``_control_problem``), ``/diagnostics`` never said OK with a non-finite standard
deviation, and good inputs after the hostile phases bring right outputs back (each fuzz's ``recover``).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Odometry, Path
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Imu, NavSatFix

from wam_diff2_core.frame_inputs import stamp_ns
from wam_diff2_core.geometry import wrap_angle, yaw_from_quaternion
from wam_diff2_core.sim.sensors import DemoSensors
from wam_diff2_core.topics import controller_topics, localization_topics

from ..controller_node import ControllerNode
from ..localization_node import LocalizationNode
from ..msg import PlannerStatus, Trajectory, VehicleControl
from ..optional_msgs import carla_msgs
from ..qos import BRIDGE_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS
from ..spinning import SpinThread, wait_until
from .hostile_messages import (Phases, Spoiler, carla_route_msg, expert_plan, path_msg, route_ahead, route_points,
                               sensor_tick, spoil_odometry, spoil_plan, spoil_sensor)
from .simulator_bridge import odometry_message

WAIT_S = 2.0                       # longest wait for the node to handle one message (a loaded machine)
RECOVERY_TICKS = 60                # good ticks after the hostile phases (3 s at CARLA's 20 Hz) ...
RECOVERY_CHECKED_TICKS = 20        # ... of which the last ones must all be answered right
RECOVERY_POSITION_M = 2.0          # odometry this close to the truth counts as recovered


@dataclass
class FuzzReport:
    node: str
    seed: int
    messages: int = 0                           # hostile-phase messages published (bursts included)
    handled: int = 0                            # of them, handled by the node (the rest: lost in a burst)
    outputs: int = 0                            # odometry or controls received
    wall_s: float = 0.0
    crash: str = ""                             # the traceback of a callback that raised
    bad_outputs: int = 0                        # non-finite or out of range
    first_bad_output: str = ""
    bad_diagnostics: int = 0                    # OK with a non-finite standard deviation
    diagnostics: int = 0
    recovered: bool = False
    recovery_ticks: int | None = None           # good ticks until every later output was right
    recovery_detail: str = ""
    refused: dict[str, int] = field(default_factory=dict)    # the node's counters (refusals, fallbacks)

    def problems(self) -> list[str]:
        found = []
        if self.crash:
            found.append(f"a callback raised:\n{self.crash}")
        if self.bad_outputs:
            found.append(f"{self.bad_outputs} bad outputs, the first: {self.first_bad_output}")
        if self.bad_diagnostics:
            found.append(f"{self.bad_diagnostics} /diagnostics OK with a non-finite standard deviation")
        if not self.recovered:
            found.append(f"no recovery after good inputs resumed: {self.recovery_detail}")
        if self.handled < 0.5 * self.messages:
            found.append(f"only {self.handled} of {self.messages} messages reached the node")
        return found

    def summary(self) -> str:
        rate = self.messages / self.wall_s if self.wall_s else 0.0
        return (f"{self.node}: {self.messages} hostile messages (seed {self.seed}, {self.handled} handled) in "
                f"{self.wall_s:.1f} s ({rate:.0f}/s); {self.outputs} outputs, {self.bad_outputs} bad; "
                f"{self.diagnostics} diagnostics, {self.bad_diagnostics} OK with a non-finite stddev; crash: "
                f"{'yes' if self.crash else 'no'}; recovered: {self.recovered} (after {self.recovery_ticks} good "
                f"ticks)")


class _Probe(Node):
    """Publishers for the node's inputs; its outputs and /diagnostics checked as they arrive."""

    def __init__(self, context, name: str, report: FuzzReport, check_output: Callable[[Any], str],
                 status_name: str):
        super().__init__(name, context=context)
        self.report, self.check_output, self.status_name = report, check_output, status_name
        self.lock = threading.Lock()
        self.outputs: list[Any] = []
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def watch(self, msg_type, topic: str, qos) -> None:
        self.create_subscription(msg_type, topic, self._on_output, qos)

    def _on_output(self, msg) -> None:
        bad = self.check_output(msg)
        with self.lock:
            self.outputs.append(msg)
            self.report.outputs += 1
            if bad:
                self.report.bad_outputs += 1
                self.report.first_bad_output = self.report.first_bad_output or bad

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name != self.status_name:
                continue
            self.report.diagnostics += 1
            values = {kv.key: kv.value for kv in status.values}
            stddev = [values[k] for k in values if "stddev" in k]
            if status.level == DiagnosticStatus.OK and not all(math.isfinite(float(v)) for v in stddev):
                self.report.bad_diagnostics += 1

    def answer(self, seen: int, stamp: int, spinner: SpinThread, kind: type = object):
        """The first output after the ``seen`` first ones stamped ``stamp`` (a ``kind``), waited for up to 0.5 s."""
        def find():
            with self.lock:
                return next((m for m in self.outputs[seen:]
                             if isinstance(m, kind) and stamp_ns(m.header.stamp) == stamp), None)
        _wait(lambda: find() is not None, spinner, 0.5)
        return find()


def _wait(condition: Callable[[], bool], spinner: SpinThread, timeout_s: float = WAIT_S) -> bool:
    """``condition`` came true in time, the node still spinning."""
    return wait_until(lambda: spinner.error or condition(), timeout_s) and not spinner.error


class _Sender:
    """Publishes a group of messages (one, or a burst sent without waiting) and waits until the node has
    handled at least one, by its own counters; counts what the hostile phases sent and the node handled."""

    def __init__(self, report: FuzzReport, spinner: SpinThread, handled: Callable[[], int]):
        self.report, self.spinner, self.handled = report, spinner, handled

    def __call__(self, publisher, msgs: list, hostile: bool, counted: bool = True) -> bool:
        before = self.handled()
        for msg in msgs:
            publisher.publish(msg)
        arrived = not counted or _wait(lambda: self.handled() > before, self.spinner)
        if len(msgs) > 1:
            time.sleep(0.005)                                   # the rest of the burst, or what is left of it
        if hostile:
            self.report.messages += len(msgs)
            self.report.handled += len(msgs) if not counted else self.handled() - before
        return arrived


def _play(report: FuzzReport, node: Node, probe: _Probe, pubs: dict[str, Any], s: Spoiler, messages: int,
          silenceable: tuple[str, ...], play_tick: Callable, recover: Callable, handled: Callable[[], int]) -> None:
    """Spin ``node`` and ``probe``; once ``pubs`` are matched, good and hostile phases of ``play_tick(tick, hostile,
    silent, phases, send)`` until ``messages`` hostile messages went out (a hostile phase leaves each of
    ``silenceable`` out, at 15 %), then ``recover(phases, spinner, send)``; ``handled``: the node's count of
    the messages it handled."""
    spinners = [SpinThread(node), SpinThread(probe)]
    send = _Sender(report, spinners[0], handled)
    try:
        if not _wait(lambda: all(p.get_subscription_count() for k, p in pubs.items() if k != "status"), spinners[0],
                     10.0):
            raise RuntimeError(f"the probe and the node did not match: {report.crash or 'timeout'}")
        phases = Phases(s.rng)
        start = time.perf_counter()
        for ticks, hostile in phases.plan():
            silent = {k for k in silenceable if hostile and s.chance(0.15)}   # the whole phase
            for tick in range(ticks):
                if report.messages >= messages or spinners[0].error:
                    break
                play_tick(tick, hostile, silent, phases, send)
                phases.step()
            if report.messages >= messages or spinners[0].error:
                break
        recover(phases, spinners[0], send)
        report.wall_s = time.perf_counter() - start
        time.sleep(0.1)                                              # the last diagnostics
    finally:
        report.crash = spinners[0].error or spinners[1].error
        for spinner in spinners:
            spinner.stop()


def _odometry_problem(msg: Odometry) -> str:
    p, o = msg.pose.pose.position, msg.pose.pose.orientation
    v, w = msg.twist.twist.linear, msg.twist.twist.angular
    values = [p.x, p.y, p.z, o.x, o.y, o.z, o.w, v.x, v.y, v.z, w.x, w.y, w.z, *msg.pose.covariance,
              *msg.twist.covariance]
    if not np.isfinite(values).all():
        return f"odometry stamped {stamp_ns(msg.header.stamp)} has non-finite values: {values[:13]}"
    if abs(math.hypot(o.x, o.y, o.z, o.w) - 1.0) > 1e-6 or v.x < 0.0:
        return f"odometry stamped {stamp_ns(msg.header.stamp)}: orientation not unit or speed negative"
    return ""


def fuzz_localization(context, messages: int, seed: int, role: str = "fuzz_loc") -> FuzzReport:
    """``messages`` hostile sensor messages into a LocalizationNode, then RECOVERY_TICKS good ticks."""
    report = FuzzReport("localization", seed)
    rng = np.random.default_rng(seed)
    s = Spoiler(rng)
    node = LocalizationNode(f"localization_{role}", context=context, parameter_overrides=[
        Parameter("role_name", value=role), Parameter("diagnostics_period_s", value=0.05)])
    topics = localization_topics(role)
    probe = _Probe(context, f"fuzz_bridge_{role}", report, _odometry_problem, f"{node.get_name()}: localization")
    probe.watch(Odometry, topics["odometry"], qos_profile_sensor_data)
    pubs = {"gnss": probe.create_publisher(NavSatFix, topics["gnss"], BRIDGE_QOS),
            "imu": probe.create_publisher(Imu, topics["imu"], BRIDGE_QOS),
            "speed": probe.create_publisher(carla_msgs.CarlaSpeedometer, topics["speedometer"], BRIDGE_QOS),
            "route": probe.create_publisher(Path, topics["route"], LATCHED_QOS),
            "carla_route": probe.create_publisher(carla_msgs.CarlaRoute, topics["carla_route"], LATCHED_QOS)}
    sensors = DemoSensors(rng=np.random.default_rng([seed, 1]))

    def play_tick(tick: int, hostile: bool, silent: set[str], phases: Phases, send: _Sender) -> None:
        good = sensor_tick(phases, sensors, topics)
        for kind in rng.permutation(["gnss", "speed", "imu"]) if hostile else ("gnss", "speed", "imu"):
            if kind in silent:
                continue
            if not hostile:
                send(pubs[kind], [good[kind]], False)
                continue
            copies = int(rng.integers(3, 16)) if s.chance(0.05) else 1              # a burst
            send(pubs[kind], [spoil_sensor(s, kind, good[kind], *phases.stamps) for _ in range(copies)], True)
        if hostile and s.chance(0.02):
            ego = phases.run.world.ego
            points = route_points(s, (ego.x, ego.y), ego.yaw)
            kind = "carla_route" if s.chance(0.5) else "route"
            send(pubs[kind], [carla_route_msg(s, points) if kind == "carla_route" else path_msg(points)], True)

    def recover(phases: Phases, spinner: SpinThread, send: _Sender) -> None:
        """Good ticks again (after a good route from the ego); the last RECOVERY_CHECKED_TICKS must each give finite
        odometry stamped with the tick within RECOVERY_POSITION_M of the truth, and /diagnostics OK at the end."""
        send(pubs["route"], [route_ahead(phases.run)], False)
        errors: list[float] = []
        for _ in range(RECOVERY_TICKS):
            if spinner.error:
                break
            good, ego, stamp = sensor_tick(phases, sensors, topics), phases.run.world.ego, phases.tick_ns
            seen = len(probe.outputs)
            for kind in ("gnss", "speed", "imu"):
                send(pubs[kind], [good[kind]], False)
            odometry = probe.answer(seen, stamp, spinner)
            if odometry is None:
                errors.append(math.inf)
            else:
                p, o = odometry.pose.pose.position, odometry.pose.pose.orientation
                error = math.hypot(p.x - ego.x, p.y - ego.y)
                right = not _odometry_problem(odometry) and error < RECOVERY_POSITION_M \
                    and abs(wrap_angle(yaw_from_quaternion(o.x, o.y, o.z, o.w) - ego.yaw)) < 0.1
                errors.append(0.0 if right else error)
            phases.step()
        status = node.diagnostic_status()
        _recovery_verdict(report, [e == 0.0 for e in errors], status.level == DiagnosticStatus.OK,
                          f"position errors (m, inf: no odometry) of the good ticks: {np.round(errors, 2).tolist()}; "
                          f"/diagnostics at the end: {status.message}")

    _play(report, node, probe, pubs, s, messages, ("gnss", "imu", "speed"), play_tick, recover,
          handled=lambda: sum(v for k, v in node.counts.items()
                              if k.endswith(("_used", "_refused")) or k.startswith("routes_")))
    report.refused = {k: v for k, v in sorted(node.counts.items()) if "refused" in k}
    report.refused.update({f"filter_{k}": v for k, v in node.ekf.counts.items()
                           if k.startswith(("restarts", "gnss_reacquired"))})
    return report


def _recovery_verdict(report: FuzzReport, right: list[bool], final_ok: bool, detail: str) -> None:
    report.recovery_ticks = first = next((i for i in range(len(right)) if all(right[i:])), None)
    report.recovered = (len(right) == RECOVERY_TICKS and first is not None
                        and first <= RECOVERY_TICKS - RECOVERY_CHECKED_TICKS and final_ok)
    report.recovery_detail = detail


def _control_problem(msg) -> str:
    values = (msg.throttle, msg.steer, msg.brake)
    if not (np.isfinite(values).all() and 0.0 <= msg.throttle <= 1.0 and -1.0 <= msg.steer <= 1.0
            and 0.0 <= msg.brake <= 1.0):
        return f"{type(msg).__name__} stamped {stamp_ns(msg.header.stamp)}: {values} out of range"
    if isinstance(msg, VehicleControl) and msg.source == VehicleControl.SOURCE_FALLBACK and msg.throttle > 0.0:
        return f"throttle {msg.throttle} on a fallback ({msg.reason})"
    return ""


def fuzz_controller(context, messages: int, seed: int, role: str = "fuzz_ctl") -> FuzzReport:
    """``messages`` hostile odometry / plan / planner-status / route messages into a ControllerNode (ticking on
    odometry, CARLA's control out), then RECOVERY_TICKS good ticks with fresh plans."""
    report = FuzzReport("controller", seed)
    rng = np.random.default_rng(seed)
    s = Spoiler(rng)
    name = f"wam_diff2_controller_{role}"
    node = ControllerNode(name, context=context, parameter_overrides=[
        Parameter("role_name", value=role), Parameter("diagnostics_period_s", value=0.05),
        Parameter("control_consumer", value="carla" if carla_msgs is not None else "vehicle_control")])
    topics = controller_topics(role)
    probe = _Probe(context, f"fuzz_sim_{role}", report, _control_problem, f"{name}: controller")
    probe.watch(VehicleControl, f"/{name}/output/control", LATEST_RELIABLE_QOS)
    if carla_msgs is not None:
        probe.watch(carla_msgs.CarlaEgoVehicleControl, topics["carla_control"], LATEST_RELIABLE_QOS)
    pubs = {"odometry": probe.create_publisher(Odometry, topics["odometry"], qos_profile_sensor_data),
            "trajectory": probe.create_publisher(Trajectory, topics["trajectory"], LATEST_RELIABLE_QOS),
            "status": probe.create_publisher(PlannerStatus, topics["planner_status"], LATCHED_QOS),
            "route": probe.create_publisher(Path, topics["route"], LATCHED_QOS)}
    if carla_msgs is not None:
        pubs["carla_route"] = probe.create_publisher(carla_msgs.CarlaRoute, topics["carla_route"], LATCHED_QOS)
    handled_keys = ("ticks", "ticks_repeated", "odometry_bad_stamp", "plans_received", "routes_received",
                    "routes_refused")

    def play_tick(tick: int, hostile: bool, silent: set[str], phases: Phases, send: _Sender) -> None:
        run = phases.run
        inputs = []
        if tick % 5 == 0 or hostile and s.chance(0.3):
            inputs.append(("trajectory", expert_plan(run, phases.tick_ns)))
        inputs.append(("odometry", odometry_message(run, phases.tick_ns, role)))
        if hostile and s.chance(0.05):
            inputs.append(("status", PlannerStatus(state=s.integer(PlannerStatus.READY, 0, 255))))
        if hostile and s.chance(0.02):
            points = route_points(s, (run.world.ego.x, run.world.ego.y), run.world.ego.yaw)
            kind = "carla_route" if "carla_route" in pubs and s.chance(0.5) else "route"
            inputs.append((kind, carla_route_msg(s, points) if kind == "carla_route" else path_msg(points)))
        for kind, good in inputs:
            if kind in silent:
                continue
            spoil = {"odometry": spoil_odometry, "trajectory": spoil_plan}.get(kind)
            if not hostile or spoil is None:
                send(pubs[kind], [good], hostile, counted=kind != "status")
                continue
            copies = int(rng.integers(3, 16)) if s.chance(0.05) else 1              # a burst
            send(pubs[kind], [spoil(s, good, *phases.stamps) for _ in range(copies)], True)

    def recover(phases: Phases, spinner: SpinThread, send: _Sender) -> None:
        """Good inputs again: a good route from the ego, the planner READY, a fresh plan every 5 ticks; the last
        RECOVERY_CHECKED_TICKS ticks must each be answered by a control that follows the plan."""
        send(pubs["route"], [route_ahead(phases.run)], False)
        send(pubs["status"], [PlannerStatus(state=PlannerStatus.READY)], False, counted=False)
        right, reasons = [], []
        for tick in range(RECOVERY_TICKS):
            if spinner.error:
                break
            run, stamp = phases.run, phases.tick_ns
            if tick % 5 == 0:
                send(pubs["trajectory"], [expert_plan(run, stamp)], False)
            seen = len(probe.outputs)
            send(pubs["odometry"], [odometry_message(run, stamp, role)], False)
            control = probe.answer(seen, stamp, spinner, VehicleControl)
            reasons.append("no control" if control is None else control.reason or "plan")
            right.append(control is not None and control.source == VehicleControl.SOURCE_PLAN
                         and not _control_problem(control))
            phases.step()
        _recovery_verdict(report, right, True, f"controls of the good ticks: {reasons}")

    _play(report, node, probe, pubs, s, messages, ("odometry", "trajectory"), play_tick, recover,
          handled=lambda: sum(node.counts[k] for k in handled_keys))
    report.refused = {k: v for k, v in sorted(node.counts.items())
                      if k.startswith(("fallback_", "plans_", "routes_", "ticks_", "time_resets", "odometry_"))}
    return report
