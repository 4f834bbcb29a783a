"""A stand-in for the driving policy whose answers are known in advance, for the bag evaluator's tests."""
from __future__ import annotations

from typing import Any

import numpy as np

from wam_diff2_core.decoding.common import DecodeStats
from wam_diff2_core.evaluation.ground_truth import constant_velocity_waypoints
from wam_diff2_core.policy import PolicyOutput, TaskResult


class ScriptedPolicy:
    """Stands in for :class:`~wam_diff2_core.policy.DrivingPolicy` with answers known in advance.

    ``answer(call_index, ego, command)`` returns [8, 2] waypoints, or a string: the reason the
    answer "does not parse" (an invalid plan). Decode statistics and latency are scripted per
    call (``forwards(i)``, ``tokens(i)``, ``latency_ms(i)``), so every metric is predictable.
    The default answer is the constant-velocity one.

        ScriptedPolicy(lambda i, ego, cmd: constant_velocity_waypoints(ego.velocity) + offset)
    """

    def __init__(self, answer=None, forwards=lambda i: 1, tokens=lambda i: 1, latency_ms=lambda i: 1.0,
                 keep_frames: bool = False):
        self.answer = answer or (lambda i, ego, command: constant_velocity_waypoints(ego.velocity))
        self.forwards, self.tokens, self.latency_ms = forwards, tokens, latency_ms
        self.calls: list[tuple[Any, str, tuple[int, ...]]] = []     # (ego, command, frame shape)
        self.frames: list[np.ndarray] | None = [] if keep_frames else None

    def step(self, frame_rgb: np.ndarray, ego, command: str, generator=None):
        i = len(self.calls)
        self.calls.append((ego, command, tuple(frame_rgb.shape)))
        if self.frames is not None:
            self.frames.append(frame_rgb.copy())
        result = self.answer(i, ego, command)
        stats = DecodeStats(block_size=32, forwards=self.forwards(i), denoise_steps=self.forwards(i), blocks=1,
                            tokens=self.tokens(i))
        if isinstance(result, str):
            plan = TaskResult(valid=False, invalid_reason=result, raw_text=f"answer {i}", stats=stats)
        else:
            points = np.asarray(result, dtype=np.float64)
            text = ",".join(f"{v:.2f}" for v in points.reshape(-1))
            plan = TaskResult(valid=True, invalid_reason="", raw_text=text, stats=stats, waypoints=points)
        return PolicyOutput(command=command, plan=plan, detections=None, latency_ms=float(self.latency_ms(i)))
