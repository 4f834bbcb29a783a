"""The evaluation report's plots (matplotlib, Agg): per-waypoint error, bird's-eye samples, the error
histogram, collision rates and detection AP; ``PLOTS`` names their files in a run folder.

    plot_per_waypoint({"model": metrics}, out / PLOTS["per_waypoint"])
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .metrics import HORIZONS_S, STEPS, WAYPOINT_TIMES_S, FrameResult

PLOTS = {"per_waypoint": "per_waypoint_error.png", "bev": "bev_samples.png", "histogram": "error_histogram.png",
         "collision": "collision_rate.png", "detection": "detection_ap.png"}


def pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path)
    pyplot().close(fig)


def no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def plot_per_waypoint(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Mean error per waypoint (the exposure-bias curve) for each run, with the CV baseline."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    t = WAYPOINT_TIMES_S
    for name, m in runs.items():
        curve = m["overall"]["model"]["per_waypoint"]
        if curve[0] is not None:
            ax.plot(t, curve, marker="o", label=f"{name} ({m['overall']['valid']} frames)")
    for name, m in runs.items():
        curve = m["overall"]["constant_velocity"]["per_waypoint"]
        if curve[0] is not None:
            ax.plot(t, curve, linestyle="--", color="grey",
                    label="constant velocity" + (f" ({name} frames)" if len(runs) > 1 else ""))
    per_waypoint_axes(ax, "Per-waypoint mean error", bool(ax.get_legend_handles_labels()[0]), "no valid plans to score")
    save(fig, path)


def per_waypoint_axes(ax, title: str, drawn: bool, empty: str) -> None:
    """Labels, ticks and grid of a per-waypoint error plot; its legend, or ``empty`` when nothing was ``drawn``."""
    ax.set(xlabel="time ahead (s)", ylabel="mean L2 error (m)", title=title, xticks=WAYPOINT_TIMES_S)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8) if drawn else no_data(ax, empty)


def plot_collision_rates(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Collision rate at 1-4 s per run (collision_metrics), both conventions."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4), dpi=100, sharey=True)
    for ax, (key, title) in zip(axes, (("at_t", "UniAD: at t"), ("avg_to_t", "VAD: averaged up to t"))):
        for name, c in runs.items():
            values = [100 * c[key][h] if c[key][h] is not None else np.nan for h in STEPS]
            ax.plot(HORIZONS_S, values, marker="o", label=f"{name} ({c['frames']} frames)",
                    **({"linestyle": "--", "color": "grey"} if name == "constant velocity" else {}))
        ax.set_title(title, fontsize=9)
        ax.set(xlabel="time ahead (s)", xticks=HORIZONS_S)
        ax.grid(alpha=0.3)
    highest = max([100 * v for c in runs.values() for key in ("at_t", "avg_to_t") for v in c[key].values()
                   if v is not None] or [0.0])
    axes[0].set(ylim=(0.0, max(1.0, 1.15 * highest)), ylabel="collision rate (%)")   # a rate: from 0, at least 1 %
    axes[0].legend(fontsize=8)
    fig.suptitle("Planned ego box overlapping another agent", fontsize=9)
    save(fig, path)


def plot_detection(scores: dict[str, Any], path: Path) -> None:
    """AP@[.5:.95], AP50 and AP75 overall and per class (bag_detection's COCO scores)."""
    plt = pyplot()
    groups = {"all": scores, **scores["per_class"], **({"vehicles": scores["vehicles"]} if scores["vehicles"]["truth"] else {})}
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups), 3.2), dpi=100)
    x = np.arange(len(groups))
    for i, (key, name) in enumerate((("ap", "AP@[.5:.95]"), ("ap50", "AP50"), ("ap75", "AP75"))):
        values = [100 * g[key] if g.get(key) is not None else np.nan for g in groups.values()]
        ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=name)
    ax.set(xticks=x, xticklabels=list(groups), ylim=(0, 100), ylabel="%")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"The node's boxes against the bag's objects ({scores['images']} frames)", fontsize=9)
    save(fig, path)


def plot_bev_samples(frames: Sequence[FrameResult], path: Path, n: int) -> None:
    """Bird's-eye view (ego frame: forward up, left to the left) of predicted vs recorded futures."""
    plt = pyplot()
    pool = [f for f in frames if f.valid] or list(frames)      # up to n frames spread evenly, valid plans first
    n = max(1, n)
    chosen = pool if len(pool) <= n else [pool[i] for i in np.linspace(0, len(pool) - 1, n).round().astype(int)]
    first_ns = {}
    for f in frames:
        first_ns[f.bag] = min(first_ns.get(f.bag, f.stamp_ns), f.stamp_ns)
    cols = min(3, max(1, len(chosen)))
    rows = max(1, -(-len(chosen) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.6 * rows), dpi=100, squeeze=False)
    for ax in axes.flat[len(chosen):]:
        ax.set_axis_off()
    for ax, f in zip(axes.flat, chosen):
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
    save(fig, path)


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
            no_data(ax, "no valid plans to score")
        ax.set(xlabel=name, ylabel="frames")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Per-frame errors over {len(valid)} frames with a valid plan", fontsize=9)
    save(fig, path)
