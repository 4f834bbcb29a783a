"""Closed-loop results over routes: the summary (means, rates, totals, the pooled PDM score), its
one-line form and a bird's-eye plot of one route.

    summary = summarize(results)                               # [RouteResult] -> dict (summary.json)
    print(summary_line(summary))
    plot_route(run, "route_000.png")
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..evaluation.metrics import PDM_SUBSCORES
from ..evaluation.report_plots import pyplot, save
from .route_runs import RouteResult, RouteRun


def summarize(results: Sequence[RouteResult]) -> dict[str, Any]:
    """Means over routes (driving score, route completion, infraction penalty), success rate and totals."""
    n = len(results)
    if n == 0:
        return {"routes": 0}

    def mean(key: str) -> float:
        return float(np.mean([getattr(r, key) for r in results]))

    return {
        "routes": n,
        "driving_score": mean("driving_score"),
        "route_completion": mean("route_completion"),
        "infraction_penalty": mean("infraction_penalty"),
        "success_rate": mean("success"),
        "completed": sum(r.completed for r in results),
        "collisions": sum(len(r.collisions) for r in results),
        "lane_departures": sum(r.lane_departures for r in results),
        "off_lane_m": float(sum(r.off_lane_m for r in results)),
        "terminations": dict(Counter(r.termination for r in results)),
        "plans": sum(r.plans for r in results),
        "plan_valid_rate": (sum(r.plans_valid for r in results) / max(1, sum(r.plans for r in results))),
        "plans_retried": sum(r.plans_retried for r in results),
        "fallback_tick_rate": sum(r.controls_fallback for r in results) / max(1, sum(r.ticks for r in results)),
        "max_throttle_on_fallback": max(r.max_throttle_on_fallback for r in results),
        "mean_speed_mps": mean("mean_speed_mps"),
        "sim_time_s": float(sum(r.sim_time_s for r in results)),
        "wall_s": float(sum(r.wall_s for r in results)),
        "pdm": _pooled_pdm([r.extra.get("pdm") for r in results]),
    }


def _pooled_pdm(routes: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The routes' PDM means (``pdm_means``) pooled over all their plans; None when no plan was scored."""
    routes = [r for r in routes if r and r["pdm_samples"]]
    if not routes:
        return None
    samples, parsed = sum(r["pdm_samples"] for r in routes), sum(r["pdm_parsed"] for r in routes)
    out = {"pdm_samples": samples, "pdm_parsed": parsed,
           "pdms": sum(r["pdms"] * r["pdm_samples"] for r in routes) / samples}
    for key in PDM_SUBSCORES:
        out[key] = sum(r[key] * r["pdm_parsed"] for r in routes if r["pdm_parsed"]) / parsed if parsed else None
    return out


def summary_line(summary: dict[str, Any]) -> str:
    if not summary.get("routes"):
        return "no routes"
    return (f"{summary['routes']} routes: driving score {100 * summary['driving_score']:.1f}, route completion "
            f"{100 * summary['route_completion']:.1f} %, infraction penalty {summary['infraction_penalty']:.2f}, "
            f"success {100 * summary['success_rate']:.0f} %, {summary['collisions']} collisions, "
            f"{summary['lane_departures']} lane departures, valid plans {100 * summary['plan_valid_rate']:.0f} %"
            + (f" ({summary['plans_retried']} decoded again)" if summary.get("plans_retried") else "")
            + (f", PDMS {100 * summary['pdm']['pdms']:.1f} over {summary['pdm']['pdm_samples']} plans"
               if summary.get("pdm") else ""))


def plot_route(run: RouteRun, path: str | Path) -> None:
    """Bird's-eye view: road, route, the ego's track by speed, fallback ticks, lane departures, collisions."""
    plt = pyplot()
    road, result = run.world.road, run.result()
    w = road.settings.lane_width_m
    fig, ax = plt.subplots(figsize=(7, 7), dpi=110)
    for offset, style in ((w, "-"), (-w, "-"), (0.0, "--")):
        ax.plot(*road.centreline.offset(offset).points.T, style, color="0.55", lw=0.8)
    for stub in road.stubs:
        for offset in (w, -w):
            ax.plot(*stub.offset(offset).points.T, "-", color="0.75", lw=0.6)
    route = road.lane.interpolate(np.linspace(run.start_s, run.end_s, 200))[0]
    ax.plot(*route.T, color="tab:blue", lw=6, alpha=0.15, label="route")
    if run.trace:
        trace = np.array([(x, y, v) for x, y, v, _ in run.trace])
        sc = ax.scatter(trace[:, 0], trace[:, 1], c=trace[:, 2], s=2, cmap="viridis", label="ego (speed)")
        fig.colorbar(sc, ax=ax, shrink=0.6, label="speed (m/s)")
        fallback = np.array([(x, y) for x, y, _, f in run.trace if f])
        if len(fallback):
            ax.scatter(fallback[:, 0], fallback[:, 1], s=6, color="tab:red", marker="x", label="fallback brake")
    markers = {"lane departure": ("tab:orange", "o"), "collision": ("black", "X"), "left the road": ("tab:red", "*")}
    for kind, (colour, marker) in markers.items():
        pts = np.array([(x, y) for k, x, y in run.events if k == kind])
        if len(pts):
            ax.scatter(pts[:, 0], pts[:, 1], s=60, color=colour, marker=marker, label=kind, zorder=5)
    ax.plot(*route[0], "g^", ms=9, label="start")
    ax.plot(*route[-1], "rs", ms=8, label="route end")
    lo, hi = route.min(0) - 25.0, route.max(0) + 25.0
    ax.set(xlim=(lo[0], hi[0]), ylim=(lo[1], hi[1]), aspect="equal", xlabel="x (m)", ylabel="y (m)")
    ax.set_title(f"route {run.index} (seed {run.settings.seed}): {result.termination}, RC "
                 f"{100 * result.route_completion:.0f} %, DS {100 * result.driving_score:.0f}", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    save(fig, path)
