"""DAgger's data from the closed loop: the frames a planner's own driving leads to, labelled with the
demo world's expert drive from there, written as planning samples in the authors' format.

    labels = ExpertLabels(PolicyPlanner(policy), "runs/dagger")
    drive_direct(run, labels, demo_world_gains())
    labels.write()                                             # runs/dagger/train.json
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..control import Plan
from ..data.samples import dump_json_list, planning_sample
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .dataset_export import DATASOURCE, ExportSettings, encode_image
from .route_runs import RouteRun


class ExpertLabels:
    """Wraps a planner and keeps every frame it is asked about with the expert's drive from there, under ``root``
    (images/rNNNN/TTTTTT.jpg; train.json on :meth:`write`); collect on routes other than the evaluation ones."""

    def __init__(self, planner: Callable[[RouteRun], Plan], root: str | Path):
        self.planner, self.root = planner, Path(root)
        self.name = getattr(planner, "name", type(planner).__name__)
        self.image = ExportSettings()       # the synthetic datasets' image format
        self.samples: list[dict[str, Any]] = []

    def __call__(self, run: RouteRun) -> Plan:
        image_path = f"images/r{run.index:04d}/{run.tick:06d}.{self.image.image_format}"
        (self.root / image_path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / image_path).write_bytes(encode_image(run.render(), self.image))
        expert = run.world.expert_future(NUM_WAYPOINTS, WAYPOINT_DT_S)
        self.samples.append(planning_sample(f"closed-loop-s{run.settings.seed}-r{run.index:04d}-t{run.tick:06d}",
                                            DATASOURCE, image_path, run.command(), (run.speed, 0.0),
                                            run.acceleration, expert))
        return self.planner(run)

    def write(self) -> Path:
        """``root``/train.json with the samples so far (the synthetic datasets' layout)."""
        self.root.mkdir(parents=True, exist_ok=True)
        dump_json_list(self.root / "train.json", self.samples)
        return self.root / "train.json"
