"""The planner's configure step: the policy loaded from its parameter values, its fast path checked and
warmed up, timed. :class:`PolicyLoad` is filled in as the steps run, so a failed configure still reports how
far it came."""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from wam_diff2_core.camera_rig import read_camera_block
from wam_diff2_core.policy import DrivingPolicy, describe_engine

from .diagnostics import FAST_PATH_FELL_BACK
from .settings import policy_arguments


@dataclass
class PolicyLoad:
    camera_rig: Any = None                   # the loaded checkpoint's camera block, if any
    fast_path_check: str = "not run"         # the warm-up check of the fast path (check_fast_path)
    times_s: dict[str, float] = field(default_factory=dict)   # configure_s and its parts (seconds)

    def describe_times(self) -> str:
        """The parts of the configure time, e.g. ``load 3.2 s, warmup 0.8 s``."""
        return ", ".join(f"{name[:-2].replace('_', ' ')} {seconds:.1f} s" for name, seconds in self.times_s.items()
                         if name != "configure_s")


def load_policy(values: Mapping[str, Any], logger, load: PolicyLoad) -> DrivingPolicy:
    """The policy of the (validated) parameter ``values``; with ``warmup``, the fast path proves itself on this
    device (or the plain path decodes) and one decode warms it up. ``load.times_s["configure_s"]``: all of it."""
    t0 = t_start = time.monotonic()
    load.times_s = {}
    policy = DrivingPolicy.from_checkpoint(**policy_arguments(values))
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
    load.times_s["configure_s"] = time.monotonic() - t_start
    return policy


def describe_policy(policy: DrivingPolicy, model_path: str) -> str:
    """The READY status's message: the checkpoint, where it runs, its dtype, tasks and block size."""
    return (f"{model_path} on {policy.loaded.device} ({str(policy.loaded.dtype).replace('torch.', '')}), "
            f"tasks {'+'.join(policy.tasks)}, block size {policy.settings.block_size}")


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
