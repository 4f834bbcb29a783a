"""The planner's /diagnostics status as a pure function of a :class:`PlannerSnapshot` of its state (copied under
its locks), so that it can be checked without a node or DDS."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus

from wam_diff2_core.frame_inputs import (BAD_COMMAND, BAD_ODOMETRY, BAD_ROUTE, NO_ODOMETRY, NS_PER_S,
                                         ODOMETRY_OUT_OF_ORDER, ROUTE_FRAME_MISMATCH, STALE_ODOMETRY)

from ..diagnostics import STATE_NAMES, node_status
from ..msg import PlannerStatus
from .settings import PlannerSettings

FAST_PATH_FELL_BACK = "fell back: "      # fast_path_check's prefix when the warm-up check chose plain
RATE_WINDOW_S = 5.0
# The node's diagnostics count input problems as skipped_<cause> (README.md). Those cause names
# predate the core's InputSkip codes and dashboards read them, so the codes are mapped here.
SKIP_CAUSES = {BAD_ODOMETRY: "odometry_non_finite", ODOMETRY_OUT_OF_ORDER: "odometry_out_of_order",
               NO_ODOMETRY: "odometry_missing", STALE_ODOMETRY: "odometry_stale", BAD_ROUTE: "route_non_finite",
               BAD_COMMAND: "command_invalid", ROUTE_FRAME_MISMATCH: "route_frame_mismatch"}


@dataclass(frozen=True)
class LastPlan:
    valid: bool
    invalid_reason: str
    command: str                             # the command it was decoded for


class EventRate:
    """Events per second over the last ``window_s`` (monotonic seconds). Not thread-safe."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._times: collections.deque[float] = collections.deque()

    def add(self, now: float) -> None:
        self._times.append(now)

    def hz(self, now: float) -> float:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        return len(self._times) / self.window_s


@dataclass(frozen=True)
class PlannerSnapshot:
    now_ns: int                              # the node's clock (sim time under use_sim_time)
    lifecycle: str                           # unconfigured | inactive | active | finalized
    active: bool
    model_state: int                         # a PlannerStatus state
    model_message: str
    image_ns: int | None                     # the newest image's stamp
    odometry_ns: int | None                  # the newest odometry's stamp
    received_hz: float
    processed_hz: float
    command_text: str
    route_points: int
    has_camera_info: bool
    last_plan: LastPlan | None
    decoder: str                             # describe_engine(...), or "none" without a model
    fast_path_check: str
    last_stats: dict[str, Any] = field(default_factory=dict)
    configure_times: dict[str, float] = field(default_factory=dict)   # seconds
    publisher_counts: dict[str, int] = field(default_factory=dict)    # input name -> matched publishers
    stages: dict[str, Any] | None = None     # profiling.stage_summary of the recent frames
    counts: dict[str, int] = field(default_factory=dict)


def diagnostic_values(snapshot: PlannerSnapshot, settings: PlannerSettings) -> dict[str, str]:
    """The status's key/value table (wam_diff2_ros/README.md lists the keys)."""
    def age(ns):
        return "never" if ns is None else f"{(snapshot.now_ns - ns) / NS_PER_S:.3f}"

    last_plan, mode = snapshot.last_plan, settings["mode"]
    kv = {
        "lifecycle_state": snapshot.lifecycle,
        "model_state": STATE_NAMES[snapshot.model_state],
        "model_message": snapshot.model_message,
        "model_path": settings["model_path"],
        "mode": f"lockstep (every {settings['lockstep_every_n_images']})" if mode == "lockstep" else mode,
        "image_age_s": age(snapshot.image_ns),
        "odometry_age_s": age(snapshot.odometry_ns),
        "image_rate_hz": f"{snapshot.received_hz:.2f}",
        "processed_rate_hz": f"{snapshot.processed_hz:.2f}",
        "command_input": snapshot.command_text,
        "route_points": str(snapshot.route_points),
        "camera_model": "camera_info" if snapshot.has_camera_info and settings["camera.use_camera_info"] else "fov",
        "last_plan": "none" if last_plan is None else ("valid" if last_plan.valid
                                                       else "invalid: " + last_plan.invalid_reason),
        "last_command": "none" if last_plan is None else last_plan.command,
        "decoder": snapshot.decoder,
        "fast_path_check": snapshot.fast_path_check,
        **{k: f"{v:.2f}" for k, v in snapshot.configure_times.items()},
    }
    kv.update({f"{name}_publishers": str(n) for name, n in snapshot.publisher_counts.items()})
    kv.update({f"last_{k}": str(v) for k, v in snapshot.last_stats.items()})
    stages = snapshot.stages
    if stages is not None:     # where the time goes, over the recent frames
        for name, row in stages["ms"].items():
            kv.update({f"stage_{name}_p50_ms": f"{row['p50']:.1f}", f"stage_{name}_p95_ms": f"{row['p95']:.1f}"})
        kv.update(peak_memory_mb=f"{stages['peak_memory_mb'] or 0:.0f}", memory_kind=stages["memory_kind"],
                  stage_frames=str(stages["frames"]))
    kv.update({k: str(v) for k, v in sorted(snapshot.counts.items())})
    return kv


def planner_diagnostic_status(node_name: str, snapshot: PlannerSnapshot, settings: PlannerSettings) -> DiagnosticStatus:
    """ERROR after a failed configure, WARN while not active or with a problem (no fresh input, an
    invalid last plan, a fast path that fell back), else OK."""
    problems = [f"no fresh {what}" for what, ns in (("image", snapshot.image_ns), ("odometry", snapshot.odometry_ns))
                if ns is None or (snapshot.now_ns - ns) / NS_PER_S > settings["image_timeout_s"]]
    last_plan = snapshot.last_plan
    if last_plan is not None and not last_plan.valid:
        problems.append(f"last plan invalid ({last_plan.invalid_reason[:80]})")
    if snapshot.fast_path_check.startswith(FAST_PATH_FELL_BACK):
        problems.append("fast path fell back to the plain decoder")
    if snapshot.model_state == PlannerStatus.ERROR:
        level, summary = DiagnosticStatus.ERROR, f"model error: {snapshot.model_message}"
    elif not snapshot.active:
        level, summary = DiagnosticStatus.WARN, f"not active ({snapshot.lifecycle}): {snapshot.model_message}"
    else:
        level, summary = (DiagnosticStatus.WARN, "; ".join(problems)) if problems else (DiagnosticStatus.OK, "planning")
    return node_status(node_name, "planner", level, summary, diagnostic_values(snapshot, settings))
