"""Open-loop planning metrics over evaluated frames, per command and overall: L2 at t (UniAD) and averaged
up to t (ST-P3 / VAD), ADE / FDE, the per-waypoint curve, the collision rates, PDM score means and the
speed profile's error, each beside the constant-velocity (or constant-speed) baseline on the same frames.
Definitions: "Metrics" in this folder's README.md.

    summary = summarize(frames)          # frames: list[FrameResult]
    summary["overall"]["model"]["l2_at_t"]["4s"]
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import numpy as np

from ..outputs.prompts import COMMANDS, NUM_WAYPOINTS, WAYPOINT_DT_S
from ..profiling import distribution, stage_summary
from ..speed_profile import ProfileLimits, speed_profile

HORIZONS_S = (1.0, 2.0, 3.0, 4.0)
WAYPOINT_TIMES_S = [round((k + 1) * WAYPOINT_DT_S, 3) for k in range(NUM_WAYPOINTS)]   # s, the plan's 8 waypoints
CONVENTIONS = {
    "l2_at_t": "UniAD convention: L2 error of the waypoint at time t, averaged over frames",
    "l2_avg_to_t": "ST-P3 / VAD convention: L2 error averaged over the waypoints up to time t (0.5 s steps), "
                   "then over frames",
}
COLLISION_CONVENTIONS = {
    "at_t": "UniAD convention: share of frames whose planned ego box at the waypoint at time t overlaps another "
            "agent's recorded box at that time",
    "avg_to_t": "VAD (ST-P3) convention: per frame, the share of waypoints up to time t (0.5 s steps) whose ego box "
                "overlaps an agent, averaged over frames",
}
SPEED_CONVENTION = ("Absolute difference at time t between the speed of the plan's speed profile (what the planner "
                    "node publishes on ~/output/autoware_trajectory: from the ego's measured speed, within the "
                    "node's trajectory.* limits) and the recorded odometry's forward speed, mean and median over "
                    "the frames with a valid plan; the constant-speed baseline holds the measured speed")
PDM_SUBSCORES = ("nc", "dac", "ttc", "ep", "c")


@dataclass
class FrameResult:
    """One evaluated camera frame (the policy ran on it)."""

    bag: str
    index: int                          # position of the image on its topic in the bag
    stamp_ns: int                       # image header stamp
    bag_time_ns: int                    # when the bag recorded the image
    command: str
    command_source: str                 # command | route | default
    velocity: tuple[float, float]       # ego frame input, m/s
    acceleration: tuple[float, float]   # ego frame input, m/s^2
    ground_truth: np.ndarray            # [8, 2] recorded future, ego frame
    baseline: np.ndarray                # [8, 2] constant-velocity prediction
    valid: bool
    invalid_reason: str = ""
    raw_text: str = ""
    predicted: np.ndarray | None = None  # [8, 2] when valid
    stats: dict[str, Any] = field(default_factory=dict)   # forwards, tokens, denoise_steps, ... per frame
    latency_ms: float = float("nan")
    # [8] per waypoint: the ego box overlaps another agent (None: no objects known then); None: no objects topic
    collisions: list[bool | None] | None = None            # the model's plan (counted: recorded ego clear)
    baseline_collisions: list[bool | None] | None = None   # the constant-velocity baseline (counted likewise)
    recorded_collisions: list[bool | None] | None = None   # the recorded drive itself
    stages: dict[str, Any] | None = None                   # profiling.StageTimes.as_dict(): frame -> trajectory
    # PDM score entries (pdm_entry) where the frame has a PDM scene (objects near its stamp); None: none
    pdm: dict[str, Any] | None = None                      # the model's plan ({"pdms": 0, "parsed": False}: invalid)
    baseline_pdm: dict[str, Any] | None = None             # the constant-velocity baseline
    recorded_pdm: dict[str, Any] | None = None             # the recorded drive (the reference planner)
    pdm_area: str | None = None                            # the drivable corridor's centre line: route | recorded_drive
    # [8] m/s at +0.5 ... +4.0 s (speed_errors); None: not known (frames.jsonl written before they were recorded)
    recorded_speeds: np.ndarray | None = None              # the recorded forward speed
    speed_errors: np.ndarray | None = None                 # |the plan's speed profile - recorded| (None: invalid plan)
    baseline_speed_errors: np.ndarray | None = None        # |the measured speed held - recorded|

    @property
    def errors(self) -> np.ndarray | None:
        return None if self.predicted is None else waypoint_errors(self.predicted, self.ground_truth)

    @property
    def baseline_errors(self) -> np.ndarray:
        return waypoint_errors(self.baseline, self.ground_truth)

    def as_record(self) -> dict[str, Any]:
        """The frame as a frames.jsonl record: the arrays as lists rounded to 1e-6, with the errors beside them."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        record.update(velocity=list(self.velocity), acceleration=list(self.acceleration), errors=self.errors,
                      baseline_errors=self.baseline_errors)
        return {k: np.asarray(v, dtype=float).round(6).tolist() if k in _ARRAYS and v is not None else v
                for k, v in record.items()}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> "FrameResult":
        """A frames.jsonl record back; the fields from ``collisions`` on may be absent (older records)."""
        names = [f.name for f in fields(cls)]
        values = {n: r.get(n) if names.index(n) >= names.index("collisions") else r[n] for n in names}
        values.update({k: np.asarray(values[k], dtype=np.float64) for k in _ARRAYS if values.get(k) is not None},
                      velocity=tuple(r["velocity"]), acceleration=tuple(r["acceleration"]))
        return cls(**values)


_ARRAYS = frozenset({"predicted", "ground_truth", "baseline", "errors", "baseline_errors", "recorded_speeds",
                     "speed_errors", "baseline_speed_errors"})


def waypoint_errors(predicted: np.ndarray, ground_truth: np.ndarray) -> np.ndarray:
    """[8] Euclidean error per waypoint, metres."""
    return np.hypot(*(np.asarray(predicted, np.float64) - np.asarray(ground_truth, np.float64)).reshape(-1, 2).T)


def profile_speed_errors(waypoints: np.ndarray, measured_speed_mps: float, recorded_speeds: np.ndarray,
                         limits: ProfileLimits = ProfileLimits()) -> np.ndarray:
    """[8] |speed of the plan's speed profile - recorded speed| (m/s) at the waypoint times (0.5 ... 4 s):
    the profile the planner node publishes for ``waypoints`` [8, 2] from ``measured_speed_mps``."""
    profile = speed_profile(waypoints, measured_speed_mps, limits)
    return np.abs(np.interp(WAYPOINT_TIMES_S, profile.t, profile.speed) - np.asarray(recorded_speeds, dtype=np.float64))


STEPS = {f"{h:g}s": int(round(h / WAYPOINT_DT_S)) for h in HORIZONS_S}   # horizon key ("1s") -> waypoints up to it


def trajectory_metrics(errors: np.ndarray | Sequence[Sequence[float]]) -> dict[str, Any]:
    """L2 in both conventions, ADE, FDE and the per-waypoint curve from [frames, 8] errors."""
    e = np.asarray(errors, dtype=np.float64).reshape(-1, NUM_WAYPOINTS)
    if len(e) == 0:
        none = dict.fromkeys(STEPS)
        return {"frames": 0, "l2_at_t": dict(none), "l2_avg_to_t": dict(none), "l2_at_t_mean_1_3s": None,
                "l2_avg_to_t_mean_1_3s": None, "ade": None, "fde": None, "per_waypoint": [None] * NUM_WAYPOINTS}
    at_t = {h: float(e[:, k - 1].mean()) for h, k in STEPS.items()}
    avg_to_t = {h: float(e[:, :k].mean(axis=1).mean()) for h, k in STEPS.items()}
    first3 = [k for k, h in zip(STEPS, HORIZONS_S) if h <= 3.0]
    return {"frames": int(len(e)), "l2_at_t": at_t, "l2_avg_to_t": avg_to_t,
            "l2_at_t_mean_1_3s": float(np.mean([at_t[k] for k in first3])),
            "l2_avg_to_t_mean_1_3s": float(np.mean([avg_to_t[k] for k in first3])),
            "ade": float(e.mean()), "fde": float(e[:, -1].mean()),
            "per_waypoint": [float(v) for v in e.mean(axis=0)]}


def speed_error_metrics(errors: np.ndarray | Sequence[Sequence[float]]) -> dict[str, Any]:
    """Mean and median absolute speed error (m/s) at 1-4 s from [frames, 8] per-waypoint speed errors."""
    e = np.asarray(errors, dtype=np.float64).reshape(-1, NUM_WAYPOINTS)
    columns = {h: e[:, k - 1] for h, k in STEPS.items()}
    return {"frames": int(len(e)),
            "mean_at_t": {k: float(v.mean()) if len(e) else None for k, v in columns.items()},
            "p50_at_t": {k: float(np.percentile(v, 50)) if len(e) else None for k, v in columns.items()}}


def collision_metrics(flags: Sequence[Sequence[bool | None]]) -> dict[str, Any]:
    """Collision rates from per-frame [8] flags (None: no objects known at that waypoint), in both
    conventions (:data:`COLLISION_CONVENTIONS`); each rate over the frames whose flags are known up to t."""
    rows = [list(f) for f in flags]
    at_t, avg_to_t, frames_at = {}, {}, {}
    for h, k in STEPS.items():
        known_at = [r[k - 1] for r in rows if r[k - 1] is not None]
        known_to = [r[:k] for r in rows if all(v is not None for v in r[:k])]
        at_t[h] = float(np.mean(known_at)) if known_at else None
        avg_to_t[h] = float(np.mean([np.mean(r) for r in known_to])) if known_to else None
        frames_at[h] = len(known_at)
    return {"frames": len(rows), "frames_known_at_t": frames_at, "at_t": at_t, "avg_to_t": avg_to_t,
            "frames_colliding": sum(1 for r in rows if any(v for v in r if v is not None))}


def pdm_entry(result) -> dict[str, Any]:
    """A plan's PDM score as a per-frame / per-sample record: ``result`` a
    :class:`~wam_diff2_core.pdm.score.PdmResult`, or None for a plan that did not parse (PDMS 0)."""
    if result is None:
        return {"pdms": 0.0, "parsed": False}
    return {"parsed": True, **result.as_dict()}


def pdm_means(scores: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Mean PDMS over the scored entries (:func:`pdm_entry`; None: not scored) and mean sub-scores over
    the parsed ones (None: nothing scored)."""
    scored = [s for s in scores if s is not None]
    parsed = [s for s in scored if s["parsed"]]
    return {"pdm_samples": len(scored), "pdm_parsed": len(parsed),
            "pdms": sum(s["pdms"] for s in scored) / len(scored) if scored else None,
            **{k: sum(s[k] for s in parsed) / len(parsed) if parsed else None for k in PDM_SUBSCORES}}


def group_summary(frames: Sequence[FrameResult]) -> dict[str, Any]:
    valid = [f for f in frames if f.valid and f.predicted is not None]
    n, n_valid = len(frames), len(valid)
    forwards, tokens, steps = ([f.stats[k] for f in frames if f.stats.get(k) is not None]
                               for k in ("forwards", "tokens", "denoise_steps"))
    return {
        "frames": n,
        "valid": n_valid,
        "parse_failures": n - n_valid,
        "parse_failure_rate": (n - n_valid) / n if n else None,
        "invalid_reasons": dict(Counter(f.invalid_reason.split(":", 1)[0] or "unknown"
                                        for f in frames if not f.valid).most_common()),
        "model": trajectory_metrics([f.errors for f in valid]),
        "constant_velocity": trajectory_metrics([f.baseline_errors for f in valid]),
        "constant_velocity_all_frames": trajectory_metrics([f.baseline_errors for f in frames]),
        "decode": {
            "forwards_per_frame": distribution(forwards, (50,)),
            "tokens_per_frame": distribution(tokens, (50,)),
            "denoise_steps_per_frame": distribution(steps, (50,)),
            "tokens_per_forward": (float(sum(tokens)) / sum(forwards)) if forwards and sum(forwards) else None,
            "retried_frames": sum(1 for f in frames if f.stats.get("retries")),
        },
        "latency_ms": distribution(f.latency_ms for f in frames),
        "collision": _collision_summary(frames, valid),
        "stages": stage_summary([f.stages for f in frames if f.stages]),
        "pdm": _pdm_summary(frames),
        "speed_profile": _speed_summary(frames, valid),
    }


def _speed_summary(frames: Sequence[FrameResult], valid: Sequence[FrameResult]) -> dict[str, Any] | None:
    """Speed errors of the model's speed profile and of the constant-speed baseline on the model's valid
    frames with a recorded speed (as L2); None when no frame has one (a run recorded before speeds were)."""
    if not any(f.recorded_speeds is not None for f in frames):
        return None
    scored = [f for f in valid if f.speed_errors is not None]
    return {"frames": len(scored), "model": speed_error_metrics([f.speed_errors for f in scored]),
            "constant_speed": speed_error_metrics([f.baseline_speed_errors for f in scored])}


def _pdm_summary(frames: Sequence[FrameResult]) -> dict[str, Any] | None:
    """PDM score means (:func:`pdm_means`) of the model, the constant-velocity baseline and the recorded
    drive over the frames with a PDM scene, and how many of those had their corridor from the route /
    the recorded drive; None when no frame has one."""
    scored = [f for f in frames if f.recorded_pdm is not None]
    if not scored:
        return None
    return {"frames": len(scored), "areas": dict(Counter(f.pdm_area for f in scored).most_common()),
            "model": pdm_means([f.pdm for f in scored]),
            "constant_velocity": pdm_means([f.baseline_pdm for f in scored]),
            "recorded": pdm_means([f.recorded_pdm for f in scored])}


def _collision_summary(frames: Sequence[FrameResult], valid: Sequence[FrameResult]) -> dict[str, Any] | None:
    """Model and constant velocity on the model's valid frames (as L2), the baseline on every frame,
    and the recorded drive; None when no frame has objects."""
    if not any(f.recorded_collisions is not None for f in frames):
        return None
    scored = [f for f in valid if f.collisions is not None]
    with_objects = [f for f in frames if f.baseline_collisions is not None]
    return {"model": collision_metrics([f.collisions for f in scored]),
            "constant_velocity": collision_metrics([f.baseline_collisions for f in scored]),
            "constant_velocity_all_frames": collision_metrics([f.baseline_collisions for f in with_objects]),
            "recorded": collision_metrics([f.recorded_collisions for f in with_objects])}


def summarize(frames: Sequence[FrameResult]) -> dict[str, Any]:
    """``{"overall": ..., "per_command": {left, straight, right}}`` of :func:`group_summary`."""
    return {"overall": group_summary(frames),
            "per_command": {c: group_summary([f for f in frames if f.command == c]) for c in COMMANDS}}
