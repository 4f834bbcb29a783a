"""The evaluation's report folders, written atomically (``metrics.json`` last, ending ``"complete": true``):
a run's (``metrics.json``, ``frames.jsonl``, ``report.md``, plots) and a comparison of two runs
(``compare.json``, ``compare.md``, plots).

    write_run_report("out/", run, model={"path": "ckpt"}, command="wam-diff2 eval-bag ...")
    compare_runs("out_ar/", "out_b32/", "out_compare/")
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..outputs.prompts import COMMANDS
from ..utils.atomic import atomic_directory
from .metrics import (COLLISION_CONVENTIONS, CONVENTIONS, HORIZONS_S, SPEED_CONVENTION, WAYPOINT_TIMES_S, FrameResult,
                      collision_metrics, pdm_means, speed_error_metrics, summarize, trajectory_metrics)
from .report_markdown import render_compare, render_markdown
from .report_plots import (PLOTS, plot_bev_samples, plot_collision_rates, plot_detection, plot_error_histogram,
                           plot_per_waypoint)

FORMAT = "wam-diff2-eval-bag/1"


def build_metrics(run, *, model: dict[str, Any], command: str = "", label: str = "",
                  record: str | None = None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "label": label,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "model": model,
        "settings": run.settings.as_dict(),
        "conventions": CONVENTIONS,
        "collision_conventions": COLLISION_CONVENTIONS,
        "speed_convention": SPEED_CONVENTION,
        "horizons_s": list(HORIZONS_S),
        "waypoint_times_s": WAYPOINT_TIMES_S,
        "bags": [{"bag": b.plan.bag, "counts": b.counts(), "camera": b.plan.camera,
                  "odometry_frame": b.plan.odometry_frame} for b in run.bags],
        "counts": run.counts(),
        "record": record,
        "detection": run.detection,
        **summarize(run.frames),
        "complete": True,
    }


def write_run_report(out_dir: str | Path, run, *, model: dict[str, Any], command: str = "", label: str = "",
                     record: str | None = None, overwrite: bool = False, bev_samples: int = 6) -> dict[str, Any]:
    """Write the whole run folder atomically; returns the metrics dict."""
    metrics = build_metrics(run, model=model, command=command, label=label, record=record)
    frames = run.frames
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        (tmp / "frames.jsonl").write_text("".join(json.dumps(f.as_record()) + "\n" for f in frames))
        plot_per_waypoint({label or "model": metrics}, tmp / PLOTS["per_waypoint"])
        plot_bev_samples(frames, tmp / PLOTS["bev"], bev_samples)
        plot_error_histogram(frames, tmp / PLOTS["histogram"])
        if metrics["overall"]["collision"] is not None:
            plot_collision_rates({label or "model": metrics["overall"]["collision"]["model"],
                                  "constant velocity": metrics["overall"]["collision"]["constant_velocity"]},
                                 tmp / PLOTS["collision"])
        if (metrics["detection"] or {}).get("scores"):
            plot_detection(metrics["detection"]["scores"], tmp / PLOTS["detection"])
        (tmp / "report.md").write_text(render_markdown(metrics))
        # metrics.json last: its presence (with "complete": true) marks a finished run
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
    return metrics


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], list[FrameResult]]:
    """metrics.json and frames of a finished run; ConfigError when the folder is not one."""
    d = Path(run_dir)
    path = d / "metrics.json"
    try:
        metrics = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--compare: {d} is not a finished eval-bag run (no metrics.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--compare: {path} cannot be read ({exc})") from None
    if metrics.get("format") != FORMAT or not metrics.get("complete"):
        raise ConfigError(f"--compare: {path} is not a complete {FORMAT} report")
    try:
        frames = [FrameResult.from_record(json.loads(line))
                  for line in (d / "frames.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise ConfigError(f"--compare: {d / 'frames.jsonl'} cannot be read ({exc})") from None
    return metrics, frames


def _run_name(metrics: dict[str, Any], run_dir: Path) -> str:
    if metrics.get("label"):
        return metrics["label"]
    block = (metrics.get("model", {}).get("decoding") or {}).get("block_size")
    return f"{run_dir.name}" + (f" (B={block})" if block is not None else "")


def compare_runs(run_a: str | Path, run_b: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Side-by-side report of two runs, plus both scored on the frames where both have a valid plan."""
    (ma, fa), (mb, fb) = load_run(run_a), load_run(run_b)
    na, nb = _run_name(ma, Path(run_a)), _run_name(mb, Path(run_b))
    if na == nb:
        na, nb = f"A: {na}", f"B: {nb}"
    key = lambda f: (Path(f.bag).name, f.stamp_ns)            # noqa: E731 - same bag copied elsewhere still pairs
    valid_a, valid_b = ({key(f): f for f in frames if f.valid and f.predicted is not None} for frames in (fa, fb))
    common = sorted(set(valid_a) & set(valid_b))
    paired = {
        "frames": len(common),
        na: trajectory_metrics([valid_a[k].errors for k in common]),
        nb: trajectory_metrics([valid_b[k].errors for k in common]),
        "constant_velocity": trajectory_metrics([valid_a[k].baseline_errors for k in common]),
    }

    def on_common(key: str, attr: str, metric, baselines: dict[str, str]) -> dict[str, Any] | None:
        """Both runs' ``key`` metrics, and ``metric`` of each run's ``attr`` and of the ``baselines`` (name: the
        frame's attribute) on the common frames where both runs have ``attr``; None unless both runs have ``key``."""
        if not (ma["overall"].get(key) and mb["overall"].get(key)):
            return None
        both = [k for k in common if getattr(valid_a[k], attr) is not None and getattr(valid_b[k], attr) is not None]
        rows = {na: (valid_a, attr), nb: (valid_b, attr), **{name: (valid_a, a) for name, a in baselines.items()}}
        return {"runs": {na: ma["overall"][key]["model"], nb: mb["overall"][key]["model"]},
                "common_valid_frames": {name: metric([getattr(frames[k], a) for k in both])
                                        for name, (frames, a) in rows.items()}}

    collision = on_common("collision", "collisions", collision_metrics, {"constant_velocity": "baseline_collisions"})
    speed = on_common("speed_profile", "speed_errors", speed_error_metrics,
                      {"constant_speed": "baseline_speed_errors"})
    pdm = on_common("pdm", "pdm", pdm_means, {"constant_velocity": "baseline_pdm", "recorded drive": "recorded_pdm"})
    if pdm is not None:
        pdm = {"lane_width_m": {na: ma["settings"].get("lane_width_m"), nb: mb["settings"].get("lane_width_m")}, **pdm}
    result = {"format": FORMAT + "/compare", "runs": {na: str(run_a), nb: str(run_b)},
              "conventions": CONVENTIONS, "overall": {na: ma["overall"], nb: mb["overall"]},
              "per_command": {c: {na: ma["per_command"][c], nb: mb["per_command"][c]} for c in COMMANDS},
              "common_valid_frames": paired, "speed_profile": speed, "collision": collision, "pdm": pdm,
              "complete": True}
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        plot_per_waypoint({na: ma, nb: mb}, tmp / "per_waypoint_compare.png")
        if collision is not None:
            plot_collision_rates({**collision["runs"]}, tmp / "collision_compare.png")
        (tmp / "compare.md").write_text(render_compare(result, na, nb, ma, mb))
        (tmp / "compare.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result
