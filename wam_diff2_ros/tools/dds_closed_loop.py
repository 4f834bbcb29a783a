"""``wam-diff2-ros closed-loop``: the demo world behind carla-ros-bridge topics (:mod:`.simulator_bridge`),
driven by the planner, controller (and, odometry estimated, localization) nodes over DDS, each with its
arguments from :mod:`.closed_loop_nodes` (docs/carla.md, 5. Closed loop without CARLA).

Like the leaderboard, the loop starts after the latched ``leaderboard_status`` True (and, unlike it, once
every topic is matched at both ends: a lost image would shift the lockstep planner's count), then waits up
to ``control_timeout_s`` of wall time for each tick's control (none: the empty control) and applies it.
Timing ``lockstep`` also waits for each planning tick's trajectory (results do not depend on how fast the
model runs); ``leaderboard`` ticks no faster than real time, so a slow planner's plans go stale.
"""
from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import rclpy
from rclpy.executors import MultiThreadedExecutor
from std_msgs.msg import Header

from wam_diff2_core.geometry import wrap_angle, yaw_from_quaternion
from wam_diff2_core.sim.route_planners import ExpertOracle
from wam_diff2_core.sim.route_runs import RouteResult, RouteRun
from wam_diff2_core.sim.sensors import error_summary, route_sensors
from wam_diff2_core.topics import CONTROLLER_NODE, LOCALIZATION_NODE, PLANNER_NODE

from ..controller_node import ControllerNode
from ..localization_node import LocalizationNode
from ..msg import PlannerStatus
from ..spinning import SpinThread, wait_until
from .closed_loop_nodes import RosLoopSettings, launched_nodes, node_arguments
from .simulator_bridge import SimulatorNode, plan_message

READY_REORDER_S = 0.05


def _count_plans(run: RouteRun, trajectories: list) -> None:
    run.plans += len(trajectories)
    run.plans_valid += sum(int(m.valid) for m in trajectories)
    run.plans_retried += sum(int(m.stats.retries > 0) for m in trajectories)


def _since(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """The counters that changed since ``before``, by how much."""
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


@dataclass
class _Applied:
    """A control as the leaderboard applies it: bridge, CARLA's, with the controller's reason for it; none in
    time, the empty control (coast)."""
    throttle: float = 0.0
    steer: float = 0.0
    brake: float = 0.0
    reason: str = "no control in time"
    header: Header | None = None


class RosClosedLoop:
    """Nodes, DDS context and the handshake; :meth:`run_route` drives one route. A context manager."""

    def __init__(self, settings: RosLoopSettings):
        self.settings = settings
        self.context: rclpy.Context | None = None
        self._spinners: list[SpinThread] = []
        self._process: subprocess.Popen | None = None
        self.images_published = 0
        self.handshake: dict[str, Any] = {}
        self.planner_node = None          # the in-process planner: its counts go into each route's result
        self.localization = None          # odometry estimated: the localization node
        self.localization_errors: list[tuple[float, float]] = []   # (position m, heading rad) per tick, all routes
        self.launched: dict[str, Any] = {}  # bridge: the launch file's nodes by name (ResolvedNode)
        self._files: tempfile.TemporaryDirectory | None = None     # bridge: the nodes' parameter files

    def __enter__(self) -> "RosClosedLoop":
        st = self.settings
        domain = st.domain_id if st.domain_id is not None else int(os.environ.get("ROS_DOMAIN_ID", "0"))
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        try:
            self.sim = self._spin(SimulatorNode(st.role, st.odometry, st.bridge, context=self.context))
            if st.bridge:
                self._files = tempfile.TemporaryDirectory(prefix="wam_diff2_bridge_")
                self.launched = launched_nodes(st, self._files.name)
            if st.odometry == "estimated":
                self.localization = self._spin(LocalizationNode(context=self.context, **node_arguments(
                    LOCALIZATION_NODE, st, self.launched)))
            self.controller = self._spin(ControllerNode(context=self.context, **node_arguments(
                CONTROLLER_NODE, st, self.launched)))
            self._start_planner(domain)
            self._handshake()
            if st.planner_slowdown != 1.0:
                self._slow_down_planner(st.planner_slowdown)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _spin(self, node, executor=None):
        self._spinners.append(SpinThread(node, executor))
        return node

    def _start_planner(self, domain: int) -> None:
        st = self.settings
        if st.planner == "oracle":
            with self.sim._cond:
                self.sim.planner_ready_at = time.monotonic()     # the oracle is the planner: READY now
            self.sim.oracle_status_pub.publish(PlannerStatus(state=PlannerStatus.READY, model_path="oracle",
                                                             message="the demo world's expert (an oracle)"))
            return
        node = node_arguments(PLANNER_NODE, st, self.launched)
        if st.planner == "subprocess":
            args = [sys.executable, "-m", "wam_diff2_ros.planner.node", *node["cli_args"]]
            for p in node["parameter_overrides"]:
                args += ["-p", f"{p.name}:={str(p.value).lower() if isinstance(p.value, bool) else p.value}"]
            self._process = subprocess.Popen(args, env={**os.environ, "ROS_DOMAIN_ID": str(domain)})
            return
        from ..planner.node import PlannerNode      # torch and the model: only when planning in-process
        self.planner_node = self._spin(PlannerNode(PLANNER_NODE, context=self.context, **node),
                                       MultiThreadedExecutor(num_threads=3, context=self.context))

    def _slow_down_planner(self, factor: float) -> None:
        """The in-process planner's policy (configured: READY) sleeps (factor - 1) x each step's own time."""
        policy = self.planner_node._policy
        step = policy.step

        def slowed(*args, **kwargs):
            t = time.perf_counter()
            out = step(*args, **kwargs)
            time.sleep((factor - 1.0) * (time.perf_counter() - t))
            return out

        policy.step = slowed

    def _handshake(self) -> None:
        """Wait, like the leaderboard's agent, for the latched True on the ``leaderboard_status`` topic."""
        st, t0 = self.settings, time.monotonic()
        if not self.sim.wait(lambda: self.sim.ready_at is not None, st.ready_timeout_s):
            raise TimeoutError(f"no True on {self.sim.control_topics['leaderboard_status']} within "
                               f"{st.ready_timeout_s} s (planner: {st.planner})")
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"the planner process exited with {self._process.returncode}")
        # tick 0 only after every link is matched at both ends: a sample sent before its reader has
        # matched the writer is lost, and a lost image would shift the planner's lockstep count
        sim, planner = self.sim, st.planner != "oracle"
        odometry_readers = 2 if planner else 1                      # the controller (and the planner)
        if sim.estimated:                                           # the localization node between them
            odometry_readers += 1                                   # the simulator's own (estimate vs truth)
            writers = [(pub, 1) for pub in (sim.gnss_pub, sim.imu_pub, sim.speed_pub)]
            writers.append((self.localization._odometry_pub, odometry_readers))
        else:
            writers = [(sim.odometry_pub, odometry_readers)]       # (publisher, subscribers it must have matched)
        writers += [(sim.image_pub, 1), (sim.command_pub, 1)] if planner else []
        readers = [sim.control_sub] + ([sim.trajectory_sub] if planner else []) \
            + ([sim.estimate_sub] if sim.estimated else []) + ([sim.carla_control_sub] if sim.bridge else [])
        controller_inputs = {sim.sensors["odometry"]} | ({sim.control_topics["trajectory"]} if not planner else set())
        readers += [r for r in self.controller.subscriptions if r.topic_name in controller_inputs]

        def unmatched() -> list[str]:
            missing = [f"{w.topic_name} has {w.get_subscription_count()} of {n} subscribers matched"
                       for w, n in writers if w.get_subscription_count() < n]
            missing += [f"{r.topic_name}: no publisher matched" for r in readers if r.get_publisher_count() == 0]
            diagnostics = sim.planner_diagnostics
            if planner and not (diagnostics.get("lifecycle_state") == "active" and all(
                    int(diagnostics.get(f"{k}_publishers", 0)) > 0 for k in ("image", "odometry", "command"))):
                state = {k: diagnostics.get(k, "?") for k in ("lifecycle_state", "image_publishers",
                                                              "odometry_publishers", "command_publishers")}
                missing.append(f"the planner's /diagnostics: {state}")
            return missing

        if not wait_until(lambda: not unmatched(), 30.0, poll_s=0.05):
            raise TimeoutError(f"not matched within 30 s: {'; '.join(unmatched())} (planner: {st.planner})")
        # DDS orders messages per topic, not across topics: the planner's READY may reach us a little
        # after the controller's Bool that it caused; allow READY_REORDER_S
        sim.wait(lambda: sim.planner_ready_at is not None, 2.0)
        self.handshake = {"ready_wait_s": round(sim.ready_at - t0, 3),
                          "planner_ready_before_status": sim.planner_ready_at is not None
                          and sim.planner_ready_at <= sim.ready_at + READY_REORDER_S}

    def __exit__(self, *exc) -> None:
        for spinner in reversed(self._spinners):
            if spinner.node is self.planner_node:
                spinner.node.stop_worker()
            spinner.stop()
        self._spinners.clear()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(20.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
        if self.context is not None:
            rclpy.shutdown(context=self.context)
            # the nodes and the context sit in reference cycles, and until those are collected the context's DDS
            # participant lives on and the graph still lists the loop's nodes (a stale wam_diff2_planner whose
            # services never answer) to whatever runs next on this domain: collect them now
            self.context = self.sim = self.controller = self.localization = self.planner_node = None
            gc.collect()
        if self._files is not None:
            self._files.cleanup()
            self._files = None

    def run_route(self, run: RouteRun) -> RouteResult:
        st, sim = self.settings, self.sim
        oracle = ExpertOracle() if st.planner == "oracle" else None
        camera = st.planner != "oracle"
        routes_before = self.controller.counts["routes_received"]
        sim.publish_route(run)
        if st.command_source == "route" and not wait_until(
                lambda: self.controller.counts["routes_received"] > routes_before, 10.0):
            raise TimeoutError("the controller did not receive the route")
        counts_before = dict(self.controller.counts)
        planner_before = self.planner_counts()
        stats = {"control_timeouts": 0, "plan_timeouts": 0, "control_wait_ms": [], "plan_wait_ms": []}
        sensors = route_sensors(run.settings.seed, run.index) if sim.estimated else None
        errors: list[tuple[float, float]] = []          # estimated odometry: (position m, heading rad) per tick
        missing_estimates = 0
        wall0 = time.monotonic()
        frame = "base_link"
        while not run.done:
            stamp = run.stamp_ns
            planning = (self.images_published % st.lockstep_n == 0) if camera else run.tick % st.lockstep_n == 0
            sim.publish_tick(run, run.command() if st.command_source == "world" else None, camera, sensors)
            if camera:
                self.images_published += 1
            t = time.monotonic()
            msg = self._take_carla_control(stamp) if st.bridge else sim.take("control", stamp, st.control_timeout_s)
            stats["control_wait_ms"].append((time.monotonic() - t) * 1e3)
            if msg is None:
                stats["control_timeouts"] += 1
            else:
                frame = msg.header.frame_id or frame
            if sensors is not None:                       # the estimate the control was made on, against the truth
                estimate = sim.take("estimate", stamp, 1.0)
                if estimate is None:
                    missing_estimates += 1
                else:
                    p, o, ego = estimate.pose.pose.position, estimate.pose.pose.orientation, run.world.ego
                    errors.append((math.hypot(p.x - ego.x, p.y - ego.y),
                                   abs(wrap_angle(yaw_from_quaternion(o.x, o.y, o.z, o.w) - ego.yaw))))
            if oracle is not None and planning:          # the oracle plans on the tick's state, after the control
                plan = oracle(run)
                sim.oracle_plan_pub.publish(plan_message(stamp, plan.waypoints, frame, "oracle"))
                run.count_plan(plan)
            if planning and (st.timing == "lockstep" or oracle is not None):
                # the tick's plan must reach the controller before the next tick (lockstep)
                t = time.monotonic()
                trajectory = sim.take("trajectory", stamp, st.plan_timeout_s if oracle is None else 10.0)
                delivered = trajectory is not None and wait_until(
                    lambda: (self.controller.plan_stamp_ns or -1) >= stamp, 10.0)
                stats["plan_wait_ms"].append((time.monotonic() - t) * 1e3)
                if not delivered:
                    stats["plan_timeouts"] += 1
                if trajectory is not None and oracle is None:
                    _count_plans(run, [trajectory])
                    run.score_plan(np.array([(p.x, p.y) for p in trajectory.points]) if trajectory.valid else None)
            elif oracle is None:
                _count_plans(run, sim.take_until("trajectory", stamp))    # leaderboard timing: what arrived
            run.apply(msg if msg is not None else _Applied())
            if st.timing == "leaderboard":
                due = wall0 + run.tick * run.dt_ns / 1e9
                time.sleep(max(0.0, due - time.monotonic()))
        waits, plan_waits = stats.pop("control_wait_ms"), stats.pop("plan_wait_ms")
        extra = {"loop": "ros", "planner": st.planner, "timing": st.timing, "lockstep_n": st.lockstep_n,
                 "pacing": st.pacing, "planner_slowdown": st.planner_slowdown, **stats,
                 "control_wait_ms_mean": float(np.mean(waits)) if waits else None,
                 "control_wait_ms_max": float(np.max(waits)) if waits else None,
                 "plan_wait_ms_mean": float(np.mean(plan_waits)) if plan_waits else None,
                 "controller": _since(counts_before, self.controller.counts), **self.handshake,
                 "odometry": st.odometry}
        if sensors is not None:
            self.localization_errors += errors
            extra["localization"] = {**error_summary(*zip(*errors)), "ticks_without_estimate": missing_estimates} \
                if errors else {"ticks_without_estimate": missing_estimates}
        if self.planner_node is not None:
            extra["planner_counts"] = _since(planner_before, self.planner_counts())
        return run.result(extra)

    def _take_carla_control(self, stamp: int) -> "_Applied | None":
        """bridge: the tick's CarlaEgoVehicleControl as the leaderboard waits for it (``control_timeout_s``), with
        the reason of the controller's own message for the same tick (scoring only; "" if it is not there)."""
        carla = self.sim.take("carla_control", stamp, self.settings.control_timeout_s)
        if carla is None:
            return None
        own = self.sim.take("control", stamp, 0.5)
        return _Applied(carla.throttle, carla.steer, carla.brake, own.reason if own is not None else "", carla.header)

    def planner_counts(self) -> dict[str, int]:
        """The in-process planner's counters so far (images received, processed, ...); {} otherwise."""
        return {} if self.planner_node is None else self.planner_node.counts()


def planner_parameters(args, engine) -> dict[str, Any]:
    """The planner parameters the command's options set, by the planner table's names (model_path
    apart; options not given leave the node's own, so the checkpoint's decoding settings apply)."""
    from wam_diff2_core.params.planner import ENGINE_PREFIX, FLAG_PARAMETERS, cli_dest

    flags = {name: getattr(args, cli_dest(name), None) for name in FLAG_PARAMETERS if name != "model_path"}
    return {**{k: v for k, v in flags.items() if v is not None}, ENGINE_PREFIX + "cpu_threads": engine.cpu_threads}


def run(args) -> int:
    """``wam-diff2-ros closed-loop``: the routes of ``wam-diff2 closed-loop``, driven over DDS."""
    from wam_diff2_core.cli.closed_loop import print_summary, route_batch
    from wam_diff2_core.sim.route_batch import drive_routes, write_summary
    from wam_diff2_core.utils.atomic import atomic_directory

    batch = route_batch(args)
    odometry = "estimated" if args.bridge else args.odometry
    settings = RosLoopSettings(role=args.role, planner="oracle" if args.oracle else args.planner_process,
                               model_path=args.model or "", planner_parameters=planner_parameters(args, batch.engine),
                               lockstep_n=batch.lockstep_n, timing=args.timing,
                               command_source="route" if args.bridge else args.command_source,
                               gains=batch.gains, domain_id=args.domain_id, odometry=odometry, bridge=args.bridge,
                               pacing=args.pacing, planner_slowdown=args.planner_slowdown)
    record, notes = {}, []
    with atomic_directory(args.out, overwrite=args.overwrite) as out:
        with RosClosedLoop(settings) as loop:
            results = drive_routes(batch, out, loop.run_route)
        if loop.localization_errors:
            loc = record["localization"] = error_summary(*zip(*loop.localization_errors))
            notes.append(f"localization (estimate vs truth, {loc['ticks']} ticks): position median "
                         f"{loc['position_median_m']:.3f} m, p95 {loc['position_p95_m']:.3f} m; heading median "
                         f"{loc['heading_median_deg']:.3f} deg, p95 {loc['heading_p95_deg']:.3f} deg")
        summary = write_summary(batch, out, results, "ros",
                                {"timing": args.timing, "bridge": args.bridge, "odometry": odometry}, record)
    print_summary(args.out, batch, summary, notes)
    return 0
