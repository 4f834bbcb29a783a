"""The closed loop without ROS: a planner called in-process on every N-th tick and the controller node's
``WaypointController`` turning its newest plan into control every tick; fast, for tests and sweeps
(``wam-diff2 closed-loop``). The ROS tools drive the same :class:`~.route_runs.RouteRun` over DDS.

    run = RouteRun(index=0, settings=ClosedLoopSettings(route_length_m=200.0))
    result = drive_direct(run, ExpertOracle(), demo_world_gains(), lockstep_n=10)
    result.driving_score, result.route_completion, result.termination
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from ..control import ControllerGains, Plan, WaypointController
from .protocol import LOCKSTEP_N
from .route_runs import RouteResult, RouteRun
from .vehicles import BicycleParams

CARLA_MAX_STEER_RAD = math.radians(70.0)   # CARLA wheel physics: default max_steer_angle of the front wheels


def drive_direct(run: RouteRun, planner: Callable[[RouteRun], Plan], gains: ControllerGains | None = None,
                 lockstep_n: int = LOCKSTEP_N, on_tick: Callable[[RouteRun], None] | None = None) -> RouteResult:
    """Ordered as the ROS loop in lockstep timing: each tick the controller answers with the newest plan so far;
    every ``lockstep_n``-th tick the planner then plans on that tick's frame, followed from the next tick on."""
    if lockstep_n < 1:
        raise ValueError(f"lockstep_n: must be >= 1, got {lockstep_n}")
    controller = WaypointController(gains)
    plan = None
    while not run.done:
        control = controller.step(plan, run.pose, run.speed, run.stamp_s)
        if run.tick % lockstep_n == 0:
            plan = planner(run)
            run.count_plan(plan)
        run.apply(control)
        if on_tick is not None:
            on_tick(run)
    return run.result({"loop": "direct", "planner": getattr(planner, "name", type(planner).__name__),
                       "lockstep_n": lockstep_n})


def demo_world_gains(gains: ControllerGains | None = None, steer_gain_scale: float | None = None) -> ControllerGains:
    """TransFuser's gains with the steering PID scaled by CARLA's maximum wheel angle over the demo car's (70 deg
    / 0.6 rad, about 2.04): the wheel-angle response it was tuned for (docs/carla.md, "Steering gains in the
    demo world"); unscaled, it under-steers through the crossings' 9.25 m left turns."""
    gains = gains or ControllerGains()
    scale = steer_gain_scale if steer_gain_scale is not None else CARLA_MAX_STEER_RAD / BicycleParams().max_steer_rad
    return replace(gains, turn_kp=gains.turn_kp * scale, turn_ki=gains.turn_ki * scale, turn_kd=gains.turn_kd * scale)
