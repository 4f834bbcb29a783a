"""The planner's configure step: the policy loaded from its settings, its fast path checked and warmed up, timed.

    load = PolicyLoad()
    policy = load_policy(settings, node.get_logger(), load)     # raises on any load failure
    load.fast_path_check, load.times_s["load_s"], load.camera_rig

``load`` is filled in as the steps run, so a failed configure still reports how far it came.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

from wam_diff2_core.camera_rig import read_camera_block
from wam_diff2_core.params import planner as params
from wam_diff2_core.policy import DrivingPolicy, describe_engine

from .planner_diagnostics import FAST_PATH_FELL_BACK
from .planner_settings import PlannerSettings


@dataclass
class PolicyLoad:
    """What the last configure found: the checkpoint's camera block, the fast-path check, its times."""

    camera_rig: Any = None                   # the loaded checkpoint's camera block, if any
    fast_path_check: str = "not run"         # the warm-up check of the fast path (check_fast_path)
    times_s: dict[str, float] = field(default_factory=dict)   # configure_s and its parts (seconds)


def load_policy(settings: PlannerSettings, logger, load: PolicyLoad) -> DrivingPolicy:
    """The policy of ``settings`` (``model_path``, ``device``, ``decoding.*``, ``engine.*`` ...); with ``warmup``,
    the fast path proves itself on this device (or the plain path decodes) and one decode warms it up."""
    values = settings.values
    t0 = time.monotonic()
    load.times_s = {}
    policy = DrivingPolicy.from_checkpoint(
        values["model_path"], device=values["device"], dtype=values["dtype"],
        overrides=settings.decoding_overrides, tasks=params.TASKS[values["tasks"]],
        detection_classes=tuple(values["detection_classes"]),
        min_pixels=values["image.min_pixels"] or None, max_pixels=values["image.max_pixels"] or None,
        max_waypoint_abs_m=values["max_waypoint_abs_m"], parse_retry=values["parse_retry"],
        engine=params.engine_settings(values), candidates=params.candidate_settings(values))
    logger.info(f"decoding settings: {policy.loaded.config.describe()}")
    load.camera_rig = read_camera_block(values["model_path"])     # None: the checkpoint names no camera
    load.fast_path_check = "not run"
    load.times_s["load_s"] = time.monotonic() - t0
    if values["warmup"]:
        # both start-up decodes stop after STARTUP_BLOCKS blocks (policy.startup_settings)
        t0 = time.monotonic()
        fallback = policy.check_fast_path()
        if fallback:
            logger.warn(fallback)
        load.times_s["fast_path_check_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        policy.warmup()
        load.times_s["warmup_s"] = time.monotonic() - t0
        load.fast_path_check = (FAST_PATH_FELL_BACK + fallback if fallback else
                                "plain decoder chosen" if policy.engine.implementation == "plain" else "passed")
    logger.info(f"decoder: {describe_engine(policy.engine)}")
    return policy


def free_policy(policy: DrivingPolicy | None) -> None:
    """Let go of ``policy``'s model now (its memory back; on CUDA the cache emptied too)."""
    if policy is None:
        return
    device = policy.loaded.device
    del policy
    gc.collect()
    if device.type == "cuda":
        import torch
        torch.cuda.empty_cache()
