"""A batch of demo-world routes driven by any closed loop, and its summary.

Every closed-loop command (``wam-diff2 closed-loop`` without ROS, ``wam-diff2-ros closed-loop`` over DDS)
builds one :class:`RouteBatch` from plain settings, drives it with its own loop through
:func:`drive_routes` (``drive_one(RouteRun) -> RouteResult``: the loop's single route) and writes the
same ``summary.json`` with :func:`write_summary`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import EngineSettings
from ..control import ControllerGains
from .route_runs import ClosedLoopSettings, RouteResult, RouteRun


@dataclass(frozen=True)
class RouteBatch:
    """Routes ``first_route`` .. ``first_route + routes - 1`` planned every ``lockstep_n``-th tick; ``planner``:
    ``"oracle"`` or the checkpoint path (recorded in the summary)."""
    settings: ClosedLoopSettings
    gains: ControllerGains
    engine: EngineSettings
    planner: str
    first_route: int
    routes: int
    lockstep_n: int
    plots: bool = True

    def __post_init__(self) -> None:
        for name, low in (("routes", 1), ("first_route", 0), ("lockstep_n", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: {getattr(self, name)} (give at least {low})")

    @property
    def indices(self) -> range:
        return range(self.first_route, self.first_route + self.routes)


def drive_routes(batch: RouteBatch, out: Path, drive_one: Callable[[RouteRun], RouteResult]) -> list[RouteResult]:
    """Each route of ``batch`` driven by ``drive_one``, in order; its bird's-eye plot into ``out``."""
    from tqdm import tqdm

    from .route_report import plot_route

    results = []
    progress = tqdm(batch.indices, desc="routes", unit="route")
    for i in progress:
        run = RouteRun(i, batch.settings)
        result = drive_one(run)
        results.append(result)
        progress.set_postfix(rc=f"{result.route_completion:.2f}", end=result.termination)
        if batch.plots:
            plot_route(run, Path(out) / f"route_{i:03d}.png")
    return results


def write_summary(batch: RouteBatch, out: Path, results: Sequence[RouteResult], loop: str,
                  settings: dict[str, Any] | None = None, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """``out/summary.json``: the batch's settings (``loop`` and the loop's own ``settings`` among them), one
    entry per route, the summary (returned) and the loop's extra ``record`` entries."""
    from .route_report import summarize

    summary = summarize(results)
    payload = {"settings": {**dataclasses.asdict(batch.settings), "loop": loop, **(settings or {}),
                            "lockstep_n": batch.lockstep_n, "planner": batch.planner,
                            "quantization": batch.engine.quantization, "gains": dataclasses.asdict(batch.gains),
                            "routes": list(batch.indices)},
               "summary": summary, "results": [dataclasses.asdict(r) for r in results], **(record or {})}
    (Path(out) / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
    return summary
