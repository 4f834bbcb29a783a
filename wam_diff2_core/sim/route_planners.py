"""The planners of the direct closed loop (``sim.direct_loop.drive_direct``): each is called with the
:class:`~.route_runs.RouteRun` on a planning tick and answers a :class:`~wam_diff2_core.control.Plan`.

    result = drive_direct(run, ExpertOracle(), demo_world_gains())
    result = drive_direct(run, PolicyPlanner(DrivingPolicy.from_checkpoint(CKPT)), demo_world_gains())
"""
from __future__ import annotations

import numpy as np

from ..control import Plan
from ..geometry import EgoMotion
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .pdm_scenes import world_online_scene
from .route_runs import RouteRun


class ExpertOracle:
    """An ORACLE, not a planner: the demo world's expert future (the demo model's ground truth) from the
    simulator's state, to test the control + simulation loop and bound what a perfect planner would score
    with this controller; a real planner only ever sees the camera, the ego state and the command."""

    name = "oracle"

    def __call__(self, run: RouteRun) -> Plan:
        return Plan(run.stamp_s, run.world.expert_future(NUM_WAYPOINTS, WAYPOINT_DT_S), valid=True, ego_pose=run.pose)


class PolicyPlanner:
    """The driving policy as the planner node calls it; plan candidates are scored against the route's online
    scene (``pdm_scenes.world_online_scene``), the number that parsed counted in ``RouteRun.valid_candidates``."""

    name = "policy"

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, run: RouteRun) -> Plan:
        candidates = self.policy.candidates
        scene = world_online_scene(run, candidates.lane_width_m) if candidates.count > 1 else None
        out = self.policy.step(run.render(), EgoMotion(velocity=(run.speed, 0.0), acceleration=run.acceleration),
                               run.command(), scene=scene)
        plan = out.plan
        run.plans_retried += int(plan.stats.retries > 0)
        if candidates.count > 1:
            run.valid_candidates.append(sum(c.valid for c in out.plan_candidates))   # before any parse retry
        if plan.valid and plan.waypoints is not None:
            return Plan(run.stamp_s, np.asarray(plan.waypoints, dtype=np.float64), valid=True, ego_pose=run.pose)
        return Plan(run.stamp_s, np.zeros((0, 2)), valid=False, ego_pose=run.pose)
