"""What the planner node counts and remembers for its diagnostics: counters, rates, throttled warnings,
the last plan and the recent stage times. Thread-safe: its own lock, held only over its own fields.
Every skipped input is counted, warned (at most once per ``warn_throttle_s`` and cause) or not.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any

from wam_diff2_core.frame_inputs import OFF_ROUTE, InputSkip
from wam_diff2_core.profiling import stage_summary

from .diagnostics import SKIP_CAUSES, EventRate, LastPlan, PlannerSnapshot

STAGE_WINDOW = 100           # frames in the diagnostics' per-stage p50 / p95


class PlannerMonitor:
    def __init__(self, logger, warn_throttle_s: float):
        self.warn_throttle_s = warn_throttle_s
        self._logger = logger
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._received_rate, self._processed_rate = EventRate(), EventRate()
        self._last_warn: dict[str, float] = {}
        self._last_image_ns: int | None = None
        self._last_plan: LastPlan | None = None
        self._last_stats: dict[str, Any] = {}
        self._recent_stages: collections.deque = collections.deque(maxlen=STAGE_WINDOW)   # StageTimes, newest last

    def count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def warn(self, cause: str, message: str) -> None:
        """Log a warning at most once per ``warn_throttle_s`` per cause."""
        now = time.monotonic()
        with self._lock:
            last = self._last_warn.get(cause)
            due = last is None or now - last >= self.warn_throttle_s
            if due:
                self._last_warn[cause] = now
        if due:
            self._logger.warning(message)

    def skip(self, cause: str, message: str) -> None:
        """Count a skipped input as ``skipped_<cause>`` and warn (throttled)."""
        self.count("skipped_" + cause)
        self.warn(cause, f"skipped input ({cause}): {message}")

    def skip_input(self, skip: InputSkip) -> None:
        """A core :class:`InputSkip`, counted under the cause name the diagnostics have always used."""
        self.skip(SKIP_CAUSES.get(skip.code, skip.code), skip.message)

    def command_defaulted(self, code: str, why: str) -> None:
        """The route gave no command for a frame (``FrameInputs.default_because``): off the route is counted,
        an input problem is a skip."""
        if code == OFF_ROUTE:
            self.count("route_off_route")
        elif code in SKIP_CAUSES:
            self.skip(SKIP_CAUSES[code], f"{why}; using default_command")

    def image_received(self, stamp_ns: int, now: float) -> None:
        """An image message arrived (``now``: monotonic seconds), whatever becomes of it."""
        with self._lock:
            self._counts["images_received"] += 1
            self._received_rate.add(now)
            self._last_image_ns = stamp_ns

    def frame_published(self, out, command: str, processing_ms: float, extra_stats: dict[str, Any],
                        now: float) -> None:
        """A decoded frame's outputs went out: ``out`` is its ``PolicyOutput``, ``command`` the command it was
        decoded for, ``extra_stats`` more ``last_*`` values (candidate selection's)."""
        plan, detections = out.plan, out.detections
        with self._lock:
            self._counts["images_processed"] += 1
            self._processed_rate.add(now)
            if plan is not None:
                self._counts["plans_valid" if plan.valid else "plan_parse_failures"] += 1
                self._last_plan = LastPlan(plan.valid, plan.invalid_reason, command)
            if detections is not None:
                self._counts["detections_valid" if detections.valid else "detection_parse_failures"] += 1
            self._counts["answers_retried"] += sum(r.stats.retries > 0 for r in (plan, detections) if r is not None)
            stats = (plan or detections).stats
            self._last_stats = {**{k: getattr(stats, k) for k in ("forwards", "denoise_steps", "tokens", "block_size")},
                                "policy_ms": round(out.latency_ms, 1), "processing_ms": round(processing_ms, 1),
                                **extra_stats}
            if out.stages is not None:
                self._recent_stages.append(out.stages)

    def snapshot(self, now: float, **node_state: Any) -> PlannerSnapshot:
        """A :class:`PlannerSnapshot` of what this monitor holds at ``now`` (monotonic seconds) and
        ``node_state``, the snapshot's other fields."""
        with self._lock:
            return PlannerSnapshot(
                image_ns=self._last_image_ns, received_hz=self._received_rate.hz(now),
                processed_hz=self._processed_rate.hz(now), last_plan=self._last_plan,
                last_stats=dict(self._last_stats), stages=stage_summary(list(self._recent_stages)),
                counts=dict(self._counts), **node_state)

