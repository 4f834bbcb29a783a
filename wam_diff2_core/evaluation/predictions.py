"""A bag evaluation's pass 2 from recorded outputs: what a planner node published, scored.

The ``wam_diff2_ros/msg/Trajectory`` messages of a recording (``wam-diff2-ros replay --record``) are
matched to the planned frames by stamp (the node stamps every output with its input image's stamp)
and become the same :class:`FrameResult` records as a live run (runner.py).

    run = evaluate_predictions(["run.mcap"], ["node_out"])      # node_out: the replay's recording
"""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..frame_inputs import stamp_ns
from ..outputs.prompts import NUM_WAYPOINTS
from .bag_plan import (DECODE_STATS_KEYS, PREDICTION_COUNTS, STAGE_FIELDS, BagPlan, BagRun, EvalRun, EvalSettings,
                       PlannedFrame, plan_bags, with_scores)
from .bags import Bag, BagError
from .ground_truth import WAYPOINT_OFFSETS_NS, is_finite_waypoints
from .metrics import FrameResult
from .record import TRAJECTORY_TYPE

log = logging.getLogger(__name__)

NOT_PUBLISHED = "not_published"     # the node published no trajectory for a planned frame
DEFAULT_TRAJECTORY_TOPIC = "/wam_diff2_planner/output/trajectory"   # the planner node's ~/output/trajectory


def frame_from_trajectory(msg, planned: PlannedFrame, bag_name: str) -> FrameResult:
    """The :class:`FrameResult` of one planned frame from the ``Trajectory`` a node published for it (what is
    read from where: "Scoring what the node published" in this folder's README.md)."""
    ins = planned.inputs
    valid, reason = bool(msg.valid), str(msg.invalid_reason or "")
    predicted = None
    if valid:
        points = list(msg.points)
        xy = np.array([[p.x, p.y] for p in points], dtype=np.float64).reshape(-1, 2)
        offsets = [stamp_ns(p.time_from_start) for p in points]              # a Duration: a Time's fields
        if len(points) != NUM_WAYPOINTS or not is_finite_waypoints(xy):
            valid, reason = False, f"bad_waypoints: expected finite [{NUM_WAYPOINTS}, 2], got [{len(points)}, 2]"
        elif any(abs(a - b) > 1_000_000 for a, b in zip(offsets, WAYPOINT_OFFSETS_NS)):
            valid, reason = False, (f"bad_waypoints: time_from_start {[o / 1e9 for o in offsets]} s, expected "
                                    f"{[o / 1e9 for o in WAYPOINT_OFFSETS_NS]} s")
        else:
            predicted = xy
    s = msg.stats
    # 0: a bag recorded before a field existed
    stats = {k: (float if k.endswith("_ms") else int)(getattr(s, k, 0)) for k in DECODE_STATS_KEYS}
    decoded = stats["forwards"] > 0 or stats["tokens"] > 0 or float(s.latency_ms) > 0
    published_stages = getattr(s, "stages", None)         # absent in bags recorded before StageTimes existed
    stages = None
    if decoded and published_stages is not None and float(published_stages.total_ms) > 0:
        stages = {f: (str if f == "memory_kind" else float)(getattr(published_stages, f)) for f in STAGE_FIELDS}
    command = str(msg.command) or ins.command
    return planned.result(bag_name, command=command,
                          command_source=ins.command_source if command == ins.command else "node", valid=valid,
                          invalid_reason=reason, raw_text=str(msg.raw_text or ""), predicted=predicted,
                          stats=stats if decoded else {}, latency_ms=float(s.latency_ms) if decoded else float("nan"),
                          stages=stages)


def trajectory_topic(bag: Bag, topic: str | None = None) -> str:
    """The Trajectory topic of a predictions bag: ``topic`` when given (it must be there, typed
    ``Trajectory``), else the planner's ``/wam_diff2_planner/output/trajectory``, else the bag's only
    Trajectory topic; BagError naming what is there otherwise."""
    if topic is None:
        topic = bag.topic_of_type(TRAJECTORY_TYPE, DEFAULT_TRAJECTORY_TOPIC)
        if topic is None:
            candidates = sorted(t for t, m in bag.topic_types.items() if m == TRAJECTORY_TYPE)
            present = ", ".join(f"{t} [{m}]" for t, m in sorted(bag.topic_types.items())) or "none"
            raise BagError(f"{bag.path}: " + ("no wam_diff2_ros/msg/Trajectory topic in the predictions bag"
                                                  if not candidates else
                                                  f"several Trajectory topics ({', '.join(candidates)}) and none is "
                                                  f"{DEFAULT_TRAJECTORY_TOPIC}")
                               + f" (topics: {present}); name one with --trajectory-topic")
    bag.require_topic(topic, (TRAJECTORY_TYPE,), "trajectory")
    return topic


def predictions_run_bag(plan: BagPlan, settings: EvalSettings, predictions_path: str | Path,
                        topic: str | None = None) -> BagRun:
    """Score the trajectories recorded in ``predictions_path`` on ``plan``'s frames; a planned frame without one
    is skipped as ``not_published``, and every message is counted (:data:`PREDICTION_COUNTS`, README.md)."""
    counts = Counter({k: 0 for k in PREDICTION_COUNTS})
    with Bag(predictions_path) as pb:
        topic = trajectory_topic(pb, topic)
        info = {"path": str(pb.path), "storage": pb.storage, "topic": topic}
        by_stamp = pb.by_stamp(topic, counts)
    run = BagRun(plan)
    for planned in plan.planned:
        msg = by_stamp.get(planned.stamp_ns)
        if msg is None:
            run.skipped_at_run[NOT_PUBLISHED] += 1
            continue
        frame = with_scores(frame_from_trajectory(msg, planned, plan.bag["path"]), planned, settings)
        counts["matched"] += 1
        counts["command_differs"] += frame.command != planned.inputs.command
        run.frames.append(frame)
    planned_stamps = {p.stamp_ns for p in plan.planned}
    for t_ns in by_stamp:
        if t_ns not in planned_stamps:
            counts["unscored_frame" if t_ns in plan.image_stamps else "unmatched_stamp"] += 1
    if by_stamp and counts["unmatched_stamp"] == len(by_stamp):
        raise BagError(f"{info['path']}: none of its {len(by_stamp)} trajectories on {topic!r} is stamped with a "
                       f"camera frame of {plan.bag['path']}: is it a recording of this bag's replay?")
    run.predictions = {**info, "counts": {k: counts[k] for k in PREDICTION_COUNTS}}
    return run


def evaluate_predictions(paths: Sequence[str | Path], prediction_paths: Sequence[str | Path],
                         settings: EvalSettings | None = None, topic: str | None = None,
                         plans: Sequence[BagPlan] | None = None) -> EvalRun:
    """Score recorded node outputs: ``prediction_paths[i]`` holds the trajectories published while
    ``paths[i]`` was replayed (one predictions bag per source bag, in order)."""
    settings = settings or EvalSettings()
    if len(prediction_paths) != len(paths):
        raise BagError(f"--predictions: {len(prediction_paths)} predictions bag(s) for {len(paths)} bag(s); give "
                       "one per BAG, in the same order")
    plans = plan_bags(paths, settings) if plans is None else plans
    from .bag_detection import score_recorded_detections

    return EvalRun(settings=settings, bags=[predictions_run_bag(plan, settings, pred, topic)
                                            for plan, pred in zip(plans, prediction_paths)],
                   detection=score_recorded_detections(paths, plans, prediction_paths))


def predictions_source(run: EvalRun, params_file: str | None) -> dict[str, Any]:
    """The report's ``model`` entry of a run that scored a node's predictions: each predictions bag with its
    topic and input bag, the node's parameter file, and the block sizes its answers were decoded with
    (``decoding.block_size`` when there was one)."""
    block_sizes = Counter(f.stats["block_size"] for f in run.frames if "block_size" in f.stats)
    model = {"source": "predictions", "path": None,
             "predictions": [{"path": b.predictions["path"], "topic": b.predictions["topic"],
                              "bag": b.plan.bag["path"]} for b in run.bags],
             "params_file": params_file, "block_sizes": {str(k): v for k, v in block_sizes.most_common()}}
    if len(block_sizes) == 1:
        model["decoding"] = {"block_size": next(iter(block_sizes))}
    return model
