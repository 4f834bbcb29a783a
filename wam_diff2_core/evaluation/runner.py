"""A bag evaluation's pass 2 with a live policy: decode the planned frames' images and call
``policy.step`` - the same call the planner node makes - with the inputs
:class:`~wam_diff2_core.frame_inputs.FrameInputTracker` derived (the planner node's own input tracker),
then score each answer against the recording (bag_plan.py holds pass 1 and the records).

    run = evaluate_bags(["run.mcap"], policy, EvalSettings(topics=BagTopics.carla("ego_vehicle")))
    summarize(run.frames)["overall"]["model"]["l2_at_t"]
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..frame_inputs import image_msg_to_rgb
from ..images import ImageError
from ..outputs.prompts import NUM_WAYPOINTS
from .bag_plan import BagPlan, BagRun, DECODE_STATS_KEYS, EvalRun, EvalSettings, PlannedFrame, plan_bags, with_scores
from .bags import Bag
from .ground_truth import is_finite_waypoints
from .metrics import FrameResult

log = logging.getLogger(__name__)

POLICY_REJECTED = "policy_rejected"


def run_frame(policy, rgb: np.ndarray, planned: PlannedFrame, bag_name: str, conversion_ms: float = 0.0) -> FrameResult:
    """``policy.step`` on one frame, scored; the plan's waypoints must be [8, 2] and finite to count.
    ``conversion_ms``: the image message -> RGB time before it (the stage table's image conversion)."""
    out = policy.step(rgb, planned.inputs.ego, planned.inputs.command)
    stages = getattr(out, "stages", None)
    plan = out.plan
    if plan is None:
        raise ValueError("the policy was not asked to plan (tasks must include 'plan')")
    predicted = None
    valid, reason = bool(plan.valid), str(plan.invalid_reason or "")
    if valid and is_finite_waypoints(plan.waypoints):
        predicted = np.asarray(plan.waypoints, dtype=np.float64).reshape(NUM_WAYPOINTS, 2)
    elif valid:
        valid, reason = False, f"bad_waypoints: expected finite [{NUM_WAYPOINTS}, 2], got {np.shape(plan.waypoints)}"
    stats = {k: getattr(plan.stats, k) for k in (*DECODE_STATS_KEYS, "commit_forwards")
             if getattr(plan.stats, k, None) is not None}
    return planned.result(bag_name, valid=valid, invalid_reason=reason, raw_text=str(plan.raw_text or ""),
                          predicted=predicted, stats=stats, latency_ms=float(out.latency_ms),
                          stages=None if stages is None else stages.with_conversion(conversion_ms).as_dict())


def run_bag(bag: Bag, plan: BagPlan, policy, settings: EvalSettings,
            on_frame: Callable[[FrameResult | None], None] = lambda f: None) -> BagRun:
    """Pass 2: decode the planned images and run the policy on them, in bag order."""
    run = BagRun(plan)
    todo = {p.index: p for p in plan.planned}
    if not todo:
        return run
    last = max(todo)
    for i, (_, _, msgtype, data) in enumerate(bag.raw_messages([settings.topics.image])):
        planned = todo.get(i)
        if planned is not None:
            t_convert = time.perf_counter()
            try:
                rgb = image_msg_to_rgb(bag.deserialize(data, msgtype), settings.image_limits)
            except ImageError as exc:
                run.skipped_at_run[f"image_{exc.code}"] += 1
                on_frame(None)
                continue
            try:
                conversion_ms = (time.perf_counter() - t_convert) * 1e3
                result = with_scores(run_frame(policy, rgb, planned, plan.bag["path"], conversion_ms), planned,
                                     settings)
            except ValueError as exc:   # the policy refused the input (e.g. a non-finite ego state)
                log.warning("frame %d (stamp %d): %s", i, planned.stamp_ns, exc)
                run.skipped_at_run[POLICY_REJECTED] += 1
                on_frame(None)
                continue
            run.frames.append(result)
            on_frame(result)
        if i >= last:
            break
    return run


def evaluate_bags(paths: Sequence[str | Path], policy, settings: EvalSettings | None = None,
                  progress: bool = True, plans: Sequence[BagPlan] | None = None) -> EvalRun:
    """Evaluate ``policy`` on every bag (BagError for a bag that cannot be used: nothing is scored).

    ``plans``: the bags' :func:`plan_bag` results when already computed with the same settings.
    """
    from tqdm import tqdm

    settings = settings or EvalSettings()
    plans = plan_bags(paths, settings) if plans is None else plans
    runs = []
    with tqdm(total=sum(len(p.planned) for p in plans), desc="eval-bag", unit="frame", disable=not progress,
              dynamic_ncols=True) as bar:
        valid = [0, 0]

        def on_frame(result: FrameResult | None) -> None:
            valid[1] += 1
            valid[0] += bool(result is not None and result.valid)
            bar.set_postfix(valid=f"{valid[0]}/{valid[1]}", refresh=False)
            bar.update(1)

        for path, plan in zip(paths, plans):
            with Bag(path) as bag:
                runs.append(run_bag(bag, plan, policy, settings, on_frame))
    return EvalRun(settings=settings, bags=runs)
