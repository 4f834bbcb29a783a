"""The evaluation report: ``metrics.json``, ``frames.jsonl``, ``report.md`` and plots, written atomically.

A run folder appears complete or not at all: everything is written into a hidden sibling
folder that is renamed to ``--out`` at the end (an interrupted run leaves only a
``.NAME.partial-*`` folder, never a ``metrics.json``). ``metrics.json`` carries
``"complete": true`` as its last key.

    write_run_report("out/", run, model={"path": "ckpt"}, command="wam-diff2 eval-bag ...")
    compare_runs("out_ar/", "out_b32/", "out_compare/")
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..config import ConfigError
from ..outputs.prompts import COMMANDS, NUM_WAYPOINTS, WAYPOINT_DT_S
from ..profiling import stage_markdown
from ..utils.atomic import atomic_directory
from .bag_pdm import AREA_RECORDED_DRIVE, AREA_ROUTE
from .metrics import (COLLISION_CONVENTIONS, CONVENTIONS, HORIZONS_S, PDM_SUBSCORES, SPEED_CONVENTION, FrameResult,
                      collision_metrics, horizon_key, pdm_means, speed_error_metrics, summarize, trajectory_metrics)

FORMAT = "wam-diff2-eval-bag/1"
PLOTS = {"per_waypoint": "per_waypoint_error.png", "bev": "bev_samples.png", "histogram": "error_histogram.png",
         "collision": "collision_rate.png", "detection": "detection_ap.png"}
WAYPOINT_TIMES_S = [round((k + 1) * WAYPOINT_DT_S, 3) for k in range(NUM_WAYPOINTS)]


# ----------------------------------------------------------------------------- metrics.json
def build_metrics(run, *, model: dict[str, Any], command: str = "", label: str = "",
                  record: str | None = None) -> dict[str, Any]:
    summary = summarize(run.frames)
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
        "detection": getattr(run, "detection", None),
        **summary,
        "complete": True,
    }


def write_run_report(out_dir: str | Path, run, *, model: dict[str, Any], command: str = "", label: str = "",
                     record: str | None = None, overwrite: bool = False, bev_samples: int = 6) -> dict[str, Any]:
    """Write the whole run folder atomically; returns the metrics dict."""
    metrics = build_metrics(run, model=model, command=command, label=label, record=record)
    frames = run.frames
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        (tmp / "frames.jsonl").write_text("".join(json.dumps(f.as_record()) + "\n" for f in frames))
        plot_per_waypoint({label or "model": metrics}, tmp / PLOTS["per_waypoint"], baseline=True)
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


# ----------------------------------------------------------------------------- report.md
def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _l2_table(rows: Sequence[tuple[str, dict[str, Any]]], key: str) -> list[str]:
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"L2 {h}" for h in hs) + " | mean 1-3 s | ADE | FDE |",
             "|---|---:|" + "---:|" * len(hs) + "---:|---:|---:|"]
    for name, m in rows:
        lines.append(f"| {name} | {m['frames']} | " + " | ".join(_f(m[key][h]) for h in hs)
                     + f" | {_f(m[key + '_mean_1_3s'])} | {_f(m['ade'])} | {_f(m['fde'])} |")
    return lines


def _collision_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Collision rates (%) at 1-4 s in both conventions, one row per (name, collision_metrics)."""
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"UniAD {h}" for h in hs) + " | " + " | ".join(f"VAD {h}" for h in hs)
             + " | frames colliding |", "|---|---:|" + "---:|" * (2 * len(hs)) + "---:|"]
    for name, c in rows:
        lines.append(f"| {name} | {c['frames']} | " + " | ".join(_pct(c["at_t"][h]) for h in hs) + " | "
                     + " | ".join(_pct(c["avg_to_t"][h]) for h in hs) + f" | {c['frames_colliding']} |")
    return lines


def _speed_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Mean and median speed error (m/s) at 1-4 s, one row per (name, speed_error_metrics)."""
    hs = [horizon_key(h) for h in HORIZONS_S]
    lines = ["| | frames | " + " | ".join(f"mean {h}" for h in hs) + " | " + " | ".join(f"p50 {h}" for h in hs) + " |",
             "|---|---:|" + "---:|" * (2 * len(hs))]
    for name, e in rows:
        lines.append(f"| {name} | {e['frames']} | " + " | ".join(_f(e["mean_at_t"][h]) for h in hs) + " | "
                     + " | ".join(_f(e["p50_at_t"][h]) for h in hs) + " |")
    return lines


def render_speed(speed: dict[str, Any] | None, who: str = "model") -> list[str]:
    if speed is None:
        return []
    return ["## Speed error of the speed profile", "", SPEED_CONVENTION + ". m/s.", "",
            *_speed_rows([(who, speed["model"]), ("constant speed (same frames)", speed["constant_speed"])]), ""]


def render_collision(c: dict[str, Any] | None, topic: str = "") -> list[str]:
    if c is None:
        return []
    return ["## Collision rate", "",
            f"The planned ego box along the plan against the other agents' recorded boxes{' (`' + topic + '`)' if topic else ''} "
            "at each waypoint time; a step where the recorded ego itself overlaps an agent is not counted. "
            + COLLISION_CONVENTIONS["at_t"] + ". " + COLLISION_CONVENTIONS["avg_to_t"] + ".", "",
            *_collision_rows([("model", c["model"]), ("constant velocity (same frames)", c["constant_velocity"]),
                              ("constant velocity (all evaluated)", c["constant_velocity_all_frames"]),
                              ("recorded drive", c["recorded"])]), "",
            f"![collision rate]({PLOTS['collision']})", ""]


PDM_TABLE_HEAD = "| | frames | parsed | PDMS | " + " | ".join(k.upper() for k in PDM_SUBSCORES) + " |"
PDM_TABLE_RULE = "|---|---:|---:|---:|" + "---:|" * len(PDM_SUBSCORES)
AREA_LABELS = {AREA_ROUTE: "the route", AREA_RECORDED_DRIVE: "the recorded drive (no usable route)"}


def render_detection(d: dict[str, Any] | None) -> list[str]:
    """The node's recorded boxes against the bag's objects (``bag_detection``); nothing without detections."""
    if d is None:
        return []
    c = d["counts"]
    lines = ["## Detection (the node's boxes, COCO AP)", "",
             f"Boxes published on {', '.join(f'`{t}`' for t in d['topics'])}: {c['messages']} messages, {c['matched']} "
             f"scored against what the camera saw of the bag's objects at their stamp ({d['truth_boxes']} boxes), "
             f"{c['no_objects']} without objects and {c['no_pose']} without odometry there, {c['unmatched_stamp']} "
             f"matching no camera frame, {c['duplicate']} duplicates, {c['undecodable']} undecodable.", ""]
    sc = d["scores"]
    if not sc:
        return lines
    lines += [f"pycocotools {sc['library']}; {sc['parse_failures']} answers did not parse (their objects count as "
              "missed); boxes without a score rank as 1.0 in stamp order.", "",
              "| AP@[.5:.95] | AP50 | AP75 | AR@1 | AR@10 | AR@100 | predicted boxes |",
              "|---:|---:|---:|---:|---:|---:|---:|",
              "| " + " | ".join(_f(sc[k]) for k in ("ap", "ap50", "ap75", "ar1", "ar10", "ar100"))
              + f" | {sc['predicted_boxes']} |", "",
              "| class | AP | AP50 | ground truth | predicted |", "|---|---:|---:|---:|---:|",
              *[f"| {label} | {_f(v['ap'])} | {_f(v['ap50'])} | {v['truth']} | {v['predicted']} |"
                for label, v in sc["per_class"].items()],
              *(["| vehicles (" + "/".join(sc["vehicles"]["classes"]) + f", one class) | {_f(sc['vehicles']['ap'])} | "
                 f"{_f(sc['vehicles']['ap50'])} | {sc['vehicles']['truth']} | {sc['vehicles']['predicted']} |"]
                if sc["vehicles"]["truth"] else []), "",
              f"![detection AP]({PLOTS['detection']})", ""]
    return lines


def pdm_area_label(pdm: dict[str, Any], lane_width_m: float) -> str:
    """What the PDM score's drivable area was: a corridor, not a map (the report's and the CLI's words)."""
    where = "; ".join(f"{AREA_LABELS[a]} on {n} frames" for a, n in pdm["areas"].items())
    return f"a {lane_width_m:g} m corridor (--lane-width-m) around {where}, not a map"


def pdm_rows(pdm: dict[str, Any], who: str = "model") -> list[tuple[str, dict[str, Any]]]:
    return [(who, pdm["model"]), ("constant velocity", pdm["constant_velocity"]), ("recorded drive", pdm["recorded"])]


def render_pdm(pdm: dict[str, Any] | None, lane_width_m: float, topic: str = "", who: str = "model") -> list[str]:
    if pdm is None:
        return []
    lines = ["## PDM score (NAVSIM v1)", "",
             "NAVSIM v1's PDM score (`wam_diff2_core/pdm/`), PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12, of "
             f"each plan on the {pdm['frames']} frames with the recorded objects near their stamp. From the bag, "
             f"not NAVSIM's inputs: the agents are the recorded objects{' (`' + topic + '`)' if topic else ''}, "
             "non-reactive, every 0.1 s for 5 s; **the drivable area is " + pdm_area_label(pdm, lane_width_m)
             + "** (no lanes, no intersections); **EP's reference planner is the recorded drive** (its progress x "
             "NC x DAC), not PDM-Closed. PDMS is the mean over the frames (a plan that does not parse scores 0), "
             "the sub-scores are means over the parsed plans.", "",
             PDM_TABLE_HEAD, PDM_TABLE_RULE]
    return lines + _pdm_table_rows(pdm_rows(pdm, who)) + [""]


def _pdm_table_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table row per (name, :func:`~.metrics.pdm_means`): frames, parsed, PDMS, sub-scores."""
    return [f"| {name} | {p['pdm_samples']} | {p['pdm_parsed']} | {_f(p['pdms'])} | "
            + " | ".join(_f(p[k]) for k in PDM_SUBSCORES) + " |" for name, p in rows]


def render_markdown(m: dict[str, Any]) -> str:
    o, counts = m["overall"], m["counts"]
    title = f"# Open-loop evaluation{': ' + m['label'] if m.get('label') else ''}"
    model = m["model"]
    decoding = model.get("decoding") or {}
    from_node = model.get("source") == "predictions"
    if from_node:      # --predictions: what a planner node published, no model run here
        source = [f"- predictions: what the planner node published, read from `{p['path']}` topic `{p['topic']}` "
                  f"(for `{p['bag']}`); no model was run by the evaluator" for p in model.get("predictions", [])]
        if model.get("block_sizes"):
            source.append("- block size in the published decode statistics: "
                          + ", ".join(f"{b} ({n} frames)" for b, n in model["block_sizes"].items()))
    else:
        source = [f"- model: `{model.get('path', '?')}`" + (f" (block size {decoding.get('block_size')}, "
                                                           f"threshold {decoding.get('confidence_threshold')}, "
                                                           f"max {decoding.get('max_new_tokens')} tokens)"
                                                           if decoding else "")]
    lines = [title, "", *source,
             *[f"- bag: `{b['bag']['path']}` ({b['bag']['storage']}, {b['bag']['duration_s']:.1f} s, "
               f"odometry frame `{b['odometry_frame'] or '?'}`)" for b in m["bags"]],
             f"- created {m['created']}" + (f" by `{m['command']}`" if m.get("command") else ""), "",
             "## Frames", "",
             "| camera frames | not selected (every N / max) | skipped | excluded: < 4 s recorded future | evaluated | valid plans |",
             "|---:|---:|---:|---:|---:|---:|",
             f"| {counts['images']} | {counts['not_selected']} | {sum(counts['skipped'].values())} | "
             f"{sum(counts['excluded_no_future'].values())} | {counts['evaluated']} | {counts['valid']} |", ""]
    if counts["skipped"]:
        lines += ["Skipped: " + ", ".join(f"{k} {v}" for k, v in counts["skipped"].items()) + ".", ""]
    if counts["excluded_no_future"]:
        lines += ["Excluded: " + ", ".join(f"{k} {v}" for k, v in counts["excluded_no_future"].items()) + ".", ""]
    if "predictions" in counts:
        pc = counts["predictions"]
        lines += [f"Published trajectories: {pc['messages']} messages; {pc['matched']} matched a scored frame by "
                  f"stamp, {pc['unscored_frame']} answered a frame that is not scored, {pc['unmatched_stamp']} "
                  f"matched no camera frame, {pc['duplicate']} duplicates, {pc['undecodable']} undecodable; "
                  f"{pc['command_differs']} matched frames with another command than the evaluator derives. Scored "
                  f"frames the node did not answer are skipped as `not_published`.", ""]
    lines += [f"Parse failures: {o['parse_failures']} of {o['frames']} ({_pct(o['parse_failure_rate'])})"
              + (": " + ", ".join(f"{k} {v}" for k, v in o["invalid_reasons"].items()) if o["invalid_reasons"] else "")
              + ". L2 is scored on the frames with a valid plan only; the constant-velocity baseline (the ego keeps "
              "its input velocity) on the same frames, and on all evaluated frames for reference.", ""]
    objects_topic = next((b["counts"].get("objects_topic", "") for b in m["bags"]), "")
    rows = [("model", o["model"]), ("constant velocity (same frames)", o["constant_velocity"]),
            ("constant velocity (all evaluated)", o["constant_velocity_all_frames"])]
    lines += ["## L2 at t (UniAD convention)", "", CONVENTIONS["l2_at_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_at_t"), "",
              *render_speed(o.get("speed_profile"), "node" if from_node else "model"),
              "## L2 averaged up to t (ST-P3 / VAD convention)", "", CONVENTIONS["l2_avg_to_t"] + ". Metres.", "",
              *_l2_table(rows, "l2_avg_to_t"), "",
              *render_collision(o.get("collision"), objects_topic),
              *render_pdm(o.get("pdm"), m["settings"]["lane_width_m"], objects_topic,
                          "node" if from_node else "model"),
              *render_detection(m.get("detection")),
              "## Per command (L2 at t, UniAD convention)", "",
              "| command | frames | valid | parse failures | model L2 1s | 2s | 3s | 4s | ADE | FDE | CV L2 4s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in COMMANDS:
        g = m["per_command"][c]
        at = g["model"]["l2_at_t"]
        lines.append(f"| {c} | {g['frames']} | {g['valid']} | {_pct(g['parse_failure_rate'])} | "
                     + " | ".join(_f(at[horizon_key(h)]) for h in HORIZONS_S)
                     + f" | {_f(g['model']['ade'])} | {_f(g['model']['fde'])} | "
                       f"{_f(g['constant_velocity']['l2_at_t'][horizon_key(HORIZONS_S[-1])])} |")
    pw, cv = o["model"]["per_waypoint"], o["constant_velocity"]["per_waypoint"]
    lines += ["", "## Per-waypoint mean error", "",
              "| t (s) | " + " | ".join(f"{t:g}" for t in WAYPOINT_TIMES_S) + " |",
              "|---|" + "---:|" * NUM_WAYPOINTS,
              "| model | " + " | ".join(_f(v) for v in pw) + " |",
              "| constant velocity | " + " | ".join(_f(v) for v in cv) + " |", "",
              f"![per-waypoint error]({PLOTS['per_waypoint']})", ""]
    d, lat = o["decode"], o["latency_ms"]
    lines += ["## Decoding and latency", "",
              "| forwards / frame (mean, median) | tokens / frame (mean, median) | tokens / forward | "
              "latency ms mean | p50 | p90 | p99 | max |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|",
              f"| {_f(d['forwards_per_frame']['mean'], 1)}, {_f(d['forwards_per_frame']['p50'], 1)} | "
              f"{_f(d['tokens_per_frame']['mean'], 1)}, {_f(d['tokens_per_frame']['p50'], 1)} | "
              f"{_f(d['tokens_per_forward'], 2)} | {_f(lat['mean'], 1)} | {_f(lat['p50'], 1)} | {_f(lat['p90'], 1)} | "
              f"{_f(lat['p99'], 1)} | {_f(lat['max'], 1)} |", "",
              ("Latency is the node's `DecodeStats.latency_ms`: its whole `policy.step` call (image "
               "preprocessing, decoding, parsing)." if from_node else
               "Latency is the whole `policy.step` call (image preprocessing, decoding, parsing) on "
               f"`{model.get('device', '?')}`."), "",
              *(["### Per stage (frame -> trajectory)", "", *stage_markdown(o["stages"]), ""] if o.get("stages") else []),
              f"![bird's-eye view of sample frames]({PLOTS['bev']})", "",
              f"![error histogram]({PLOTS['histogram']})", ""]
    if m.get("record"):
        lines += [f"Predictions recorded to `{m['record']}`.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots
def pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def plot_per_waypoint(runs: dict[str, dict[str, Any]], path: Path, baseline: bool = True) -> None:
    """Mean error per waypoint (the exposure-bias curve) for each run, with the CV baseline."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    t = WAYPOINT_TIMES_S
    for name, m in runs.items():
        curve = m["overall"]["model"]["per_waypoint"]
        if curve[0] is not None:
            ax.plot(t, curve, marker="o", label=f"{name} ({m['overall']['valid']} frames)")
    if baseline:
        for name, m in runs.items():
            curve = m["overall"]["constant_velocity"]["per_waypoint"]
            if curve[0] is not None:
                ax.plot(t, curve, linestyle="--", color="grey",
                        label="constant velocity" + (f" ({name} frames)" if len(runs) > 1 else ""))
                if len(runs) == 1:
                    break
    ax.set_xlabel("time ahead (s)")
    ax.set_ylabel("mean L2 error (m)")
    ax.set_title("Per-waypoint mean error")
    ax.set_xticks(t)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no valid plans to score", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_collision_rates(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Collision rate at 1-4 s per run (collision_metrics), both conventions."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4), dpi=100, sharey=True)
    hs = [horizon_key(h) for h in HORIZONS_S]
    for ax, (key, title) in zip(axes, (("at_t", "UniAD: at t"), ("avg_to_t", "VAD: averaged up to t"))):
        for name, c in runs.items():
            values = [100 * c[key][h] if c[key][h] is not None else np.nan for h in hs]
            ax.plot(HORIZONS_S, values, marker="o", label=f"{name} ({c['frames']} frames)",
                    **({"linestyle": "--", "color": "grey"} if name == "constant velocity" else {}))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("time ahead (s)")
        ax.set_xticks(HORIZONS_S)
        ax.grid(alpha=0.3)
    highest = max([100 * v for c in runs.values() for key in ("at_t", "avg_to_t") for v in c[key].values()
                   if v is not None] or [0.0])
    axes[0].set_ylim(0.0, max(1.0, 1.15 * highest))          # a rate: from 0, at least up to 1 %
    axes[0].set_ylabel("collision rate (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Planned ego box overlapping another agent", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_detection(scores: dict[str, Any], path: Path) -> None:
    """AP@[.5:.95], AP50 and AP75 overall and per class (bag_detection's COCO scores)."""
    plt = pyplot()
    groups = {"all": scores, **scores["per_class"], **({"vehicles": scores["vehicles"]} if scores["vehicles"]["truth"] else {})}
    keys = (("ap", "AP@[.5:.95]"), ("ap50", "AP50"), ("ap75", "AP75"))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups), 3.2), dpi=100)
    x = np.arange(len(groups))
    for i, (key, name) in enumerate(keys):
        values = [100 * g[key] if g.get(key) is not None else np.nan for g in groups.values()]
        ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=name)
    ax.set_xticks(x, list(groups))
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"The node's boxes against the bag's objects ({scores['images']} frames)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def sample_frames(frames: Sequence[FrameResult], n: int) -> list[FrameResult]:
    """Up to ``n`` frames spread evenly over the run (valid plans preferred)."""
    pool = [f for f in frames if f.valid] or list(frames)
    if len(pool) <= n:
        return list(pool)
    return [pool[i] for i in np.linspace(0, len(pool) - 1, n).round().astype(int)]


def plot_bev_samples(frames: Sequence[FrameResult], path: Path, n: int = 6) -> None:
    """Bird's-eye view (ego frame: forward up, left to the left) of predicted vs recorded futures."""
    plt = pyplot()
    chosen = sample_frames(frames, max(1, n))
    first_ns = {}
    for f in frames:
        first_ns[f.bag] = min(first_ns.get(f.bag, f.stamp_ns), f.stamp_ns)
    cols = min(3, max(1, len(chosen)))
    rows = max(1, -(-len(chosen) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.6 * rows), dpi=100, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, f in zip(axes.flat, chosen):
        ax.set_axis_on()
        # plot (-y, x): forward is up, the ego's left is on the left
        for pts, style, name in ((f.ground_truth, dict(color="black", marker="o"), "recorded"),
                                 (f.baseline, dict(color="grey", linestyle="--", marker="."), "constant velocity"),
                                 (f.predicted, dict(color="tab:green", marker="x"), "predicted")):
            if pts is not None:
                p = np.vstack([[0.0, 0.0], np.asarray(pts)])
                ax.plot(-p[:, 1], p[:, 0], label=name, **style)
        ax.plot([0], [0], marker="^", color="tab:red", markersize=9)
        err = f.errors
        state = f"L2@4s {err[-1]:.2f} m" if err is not None else "parse failure"
        ax.set_title(f"+{(f.stamp_ns - first_ns[f.bag]) / 1e9:.2f} s ({f.stamp_ns / 1e9:.2f}), {f.command}\n{state}",
                     fontsize=8)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    if chosen:
        axes.flat[0].legend(fontsize=7, loc="best")
    else:
        axes.flat[0].set_axis_on()
        axes.flat[0].text(0.5, 0.5, "no evaluated frames", ha="center", va="center")
    fig.suptitle("Predicted vs recorded future (ego frame, metres; forward is up)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_error_histogram(frames: Sequence[FrameResult], path: Path) -> None:
    """Distribution of per-frame ADE and L2 at 4 s, model vs constant velocity on the same frames."""
    plt = pyplot()
    valid = [f for f in frames if f.valid and f.predicted is not None]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), dpi=100)
    for ax, (name, pick) in zip(axes, (("ADE (m)", lambda e: e.mean()), ("L2 at 4 s (m)", lambda e: e[-1]))):
        model = [pick(f.errors) for f in valid]
        cv = [pick(f.baseline_errors) for f in valid]
        if model:
            hi = max(max(model), max(cv), 1e-6)
            bins = np.linspace(0.0, hi * 1.05, 21)
            ax.hist(cv, bins=bins, alpha=0.5, color="grey", label="constant velocity")
            ax.hist(model, bins=bins, alpha=0.6, color="tab:green", label="model")
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no valid plans to score", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(name)
        ax.set_ylabel("frames")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Per-frame errors over {len(valid)} frames with a valid plan", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- --compare
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
    valid_a = {key(f): f for f in fa if f.valid and f.predicted is not None}
    valid_b = {key(f): f for f in fb if f.valid and f.predicted is not None}
    common = sorted(set(valid_a) & set(valid_b))
    paired = {
        "frames": len(common),
        na: trajectory_metrics([valid_a[k].errors for k in common]),
        nb: trajectory_metrics([valid_b[k].errors for k in common]),
        "constant_velocity": trajectory_metrics([valid_a[k].baseline_errors for k in common]),
    }
    collision = None
    if ma["overall"].get("collision") and mb["overall"].get("collision"):
        both = [k for k in common if valid_a[k].collisions is not None and valid_b[k].collisions is not None]
        collision = {"runs": {na: ma["overall"]["collision"]["model"], nb: mb["overall"]["collision"]["model"]},
                     "common_valid_frames": {
                         na: collision_metrics([valid_a[k].collisions for k in both]),
                         nb: collision_metrics([valid_b[k].collisions for k in both]),
                         "constant_velocity": collision_metrics([valid_a[k].baseline_collisions for k in both])}}
    speed = None
    if ma["overall"].get("speed_profile") and mb["overall"].get("speed_profile"):
        both = [k for k in common if valid_a[k].speed_errors is not None and valid_b[k].speed_errors is not None]
        speed = {"runs": {na: ma["overall"]["speed_profile"]["model"], nb: mb["overall"]["speed_profile"]["model"]},
                 "common_valid_frames": {
                     na: speed_error_metrics([valid_a[k].speed_errors for k in both]),
                     nb: speed_error_metrics([valid_b[k].speed_errors for k in both]),
                     "constant_speed": speed_error_metrics([valid_a[k].baseline_speed_errors for k in both])}}
    pdm = None
    if ma["overall"].get("pdm") and mb["overall"].get("pdm"):
        both = [k for k in common if valid_a[k].pdm is not None and valid_b[k].pdm is not None]
        pdm = {"lane_width_m": {na: ma["settings"].get("lane_width_m"), nb: mb["settings"].get("lane_width_m")},
               "runs": {na: ma["overall"]["pdm"]["model"], nb: mb["overall"]["pdm"]["model"]},
               "common_valid_frames": {na: pdm_means([valid_a[k].pdm for k in both]),
                                       nb: pdm_means([valid_b[k].pdm for k in both]),
                                       "constant_velocity": pdm_means([valid_a[k].baseline_pdm for k in both]),
                                       "recorded drive": pdm_means([valid_a[k].recorded_pdm for k in both])}}
    result = {"format": FORMAT + "/compare", "runs": {na: str(run_a), nb: str(run_b)},
              "conventions": CONVENTIONS, "overall": {na: ma["overall"], nb: mb["overall"]},
              "per_command": {c: {na: ma["per_command"][c], nb: mb["per_command"][c]} for c in COMMANDS},
              "common_valid_frames": paired, "speed_profile": speed, "collision": collision, "pdm": pdm,
              "complete": True}
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        plot_per_waypoint({na: ma, nb: mb}, tmp / "per_waypoint_compare.png", baseline=True)
        if collision is not None:
            plot_collision_rates({**collision["runs"]}, tmp / "collision_compare.png")
        (tmp / "compare.md").write_text(render_compare(result, na, nb, ma, mb))
        (tmp / "compare.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def render_compare(r: dict[str, Any], na: str, nb: str, ma: dict[str, Any], mb: dict[str, Any]) -> str:
    hs = [horizon_key(h) for h in HORIZONS_S]

    def row(label, fn):
        return f"| {label} | {fn(ma)} | {fn(mb)} |"

    o = lambda m: m["overall"]   # noqa: E731
    lines = [f"# Comparison: {na} vs {nb}", "", f"- {na}: `{r['runs'][na]}`", f"- {nb}: `{r['runs'][nb]}`", "",
             "## Side by side (each on its own valid frames)", "", f"| | {na} | {nb} |", "|---|---:|---:|",
             row("frames evaluated", lambda m: o(m)["frames"]),
             row("valid plans", lambda m: o(m)["valid"]),
             row("parse failure rate", lambda m: _pct(o(m)["parse_failure_rate"]))]
    for h in hs:
        lines.append(row(f"L2 at {h} (UniAD)", lambda m, h=h: _f(o(m)["model"]["l2_at_t"][h])))
    for h in hs:
        lines.append(row(f"L2 avg to {h} (ST-P3/VAD)", lambda m, h=h: _f(o(m)["model"]["l2_avg_to_t"][h])))
    lines += [row("ADE", lambda m: _f(o(m)["model"]["ade"])), row("FDE", lambda m: _f(o(m)["model"]["fde"])),
              row("CV baseline L2 at 4s (same frames)",
                  lambda m: _f(o(m)["constant_velocity"]["l2_at_t"][hs[-1]])),
              row("forwards / frame", lambda m: _f(o(m)["decode"]["forwards_per_frame"]["mean"], 1)),
              row("tokens / frame", lambda m: _f(o(m)["decode"]["tokens_per_frame"]["mean"], 1)),
              row("tokens / forward", lambda m: _f(o(m)["decode"]["tokens_per_forward"], 2)),
              row("latency p50 (ms)", lambda m: _f(o(m)["latency_ms"]["p50"], 1)),
              row("latency p90 (ms)", lambda m: _f(o(m)["latency_ms"]["p90"], 1))]
    for c in COMMANDS:
        lines.append(row(f"{c}: L2 at 4s (frames)", lambda m, c=c: f"{_f(m['per_command'][c]['model']['l2_at_t'][hs[-1]])} "
                                                                   f"({m['per_command'][c]['valid']})"))
    p = r["common_valid_frames"]
    lines += ["", f"## On the {p['frames']} frames where both have a valid plan", "",
              f"| | {na} | {nb} | constant velocity |", "|---|---:|---:|---:|"]
    for conv, label in (("l2_at_t", "L2 at"), ("l2_avg_to_t", "L2 avg to")):
        for h in hs:
            lines.append(f"| {label} {h} | {_f(p[na][conv][h])} | {_f(p[nb][conv][h])} | "
                         f"{_f(p['constant_velocity'][conv][h])} |")
    lines += [f"| ADE | {_f(p[na]['ade'])} | {_f(p[nb]['ade'])} | {_f(p['constant_velocity']['ade'])} |", ""]
    if r.get("speed_profile"):
        v = r["speed_profile"]
        lines += ["## Speed error of the speed profile", "", SPEED_CONVENTION + ". m/s.", "",
                  "Each on its own valid frames:", "", *_speed_rows(list(v["runs"].items())), "",
                  "On the frames where both have a valid plan:", "",
                  *_speed_rows([(na, v["common_valid_frames"][na]), (nb, v["common_valid_frames"][nb]),
                                ("constant speed", v["common_valid_frames"]["constant_speed"])]), ""]
    if r.get("collision"):
        c = r["collision"]
        lines += ["## Collision rate", "", COLLISION_CONVENTIONS["at_t"] + ". "
                  + COLLISION_CONVENTIONS["avg_to_t"] + ".", "", "Each on its own valid frames:", "",
                  *_collision_rows([(na, c["runs"][na]), (nb, c["runs"][nb])]), "",
                  "On the frames where both have a valid plan:", "",
                  *_collision_rows([(na, c["common_valid_frames"][na]), (nb, c["common_valid_frames"][nb]),
                                    ("constant velocity", c["common_valid_frames"]["constant_velocity"])]), ""]
    if r.get("pdm"):
        p = r["pdm"]
        widths = " / ".join(f"{n}: {w:g} m" for n, w in p["lane_width_m"].items() if w is not None)
        lines += ["## PDM score (NAVSIM v1)", "", "Drivable area: a corridor around the route or the recorded drive "
                  f"(--lane-width-m {widths}), not a map; EP's reference: the recorded drive (each run's report "
                  "says more). Each on its own frames (an unparsed plan scores 0):", "",
                  PDM_TABLE_HEAD, PDM_TABLE_RULE, *_pdm_table_rows(list(p["runs"].items())), "",
                  "On the frames where both have a valid plan:", "", PDM_TABLE_HEAD, PDM_TABLE_RULE,
                  *_pdm_table_rows(list(p["common_valid_frames"].items())), ""]
    lines += ["L2 at t: " + CONVENTIONS["l2_at_t"] + ". L2 avg to t: " + CONVENTIONS["l2_avg_to_t"] + ".", "",
              "![per-waypoint error](per_waypoint_compare.png)", ""]
    return "\n".join(lines)
