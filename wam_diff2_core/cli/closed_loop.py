"""Drive routes of the demo world in closed loop and score them (route completion, infractions).

    wam-diff2 closed-loop --model CKPT --routes 10 --out runs/cl                  # policy + controller, no ROS
    wam-diff2 closed-loop --oracle --routes 3 --out /tmp/cl_oracle                 # test the loop, no model
    wam-diff2 closed-loop --model CKPT --traffic --routes 10 --candidates 4 --out runs/cl_n4
    wam-diff2 closed-loop --model CKPT --seed 5000 --routes 20 --expert-labels --out runs/dagger

The planner node's policy and the controller node's controller in one process, without ROS
(``sim/direct_loop.py``; over DDS: ``wam-diff2-ros closed-loop``, the same options plus the ROS ones).
``--oracle`` plans with the demo world's expert future (it tests the control + simulation loop).
``--candidates N`` drives the one of N plan candidates the online PDM score rates best, as the planner
node does (docs/carla.md). Writes OUT/summary.json (settings, per-route results, the summary; scoring:
``sim/route_runs.py``) and OUT/route_NNN.png (bird's-eye view per route).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..config import ConfigError, EngineSettings, add_threads_argument
from .common import (add_candidate_arguments, add_decoding_arguments, add_model_arguments, add_parse_retry_argument,
                     add_quantization_argument, candidate_settings, config_errors, driving_policy)

HELP = "drive demo-world routes in closed loop (policy + controller, no ROS) and report a driving score"


def add_route_arguments(p) -> None:
    """The options every closed loop takes (this one and ``wam-diff2-ros closed-loop``)."""
    add_model_arguments(p, required=False)
    p.add_argument("--oracle", action="store_true",
                   help="plan with the demo world's expert future instead of a model (an oracle: tests the loop)")
    p.add_argument("--out", required=True, help="output directory (summary.json, route_NNN.png)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--routes", type=int, default=10, help="number of routes (default 10)")
    p.add_argument("--first-route", type=int, default=0, help="index of the first route (default 0)")
    p.add_argument("--seed", type=int, default=None, help="route seed (default: the selection set's first, sim.protocol.DEFAULT_ROUTE_SEED)")
    p.add_argument("--route-length-m", type=float, default=None, help="route length (default 200 m)")
    p.add_argument("--traffic", action="store_true", help="traffic on the routes (default: none)")
    p.add_argument("--command-source", choices=("world", "route"), default="world",
                   help="world: the demo world's command rule (its training labels); route: tracked from the "
                        "route with RoadOptions (this loop) or a Path (over ROS) by wam_diff2_core.routes")
    p.add_argument("--lockstep-n", type=int, default=None, help="plan on every N-th tick (default 10: 2 Hz)")
    p.add_argument("--steer-gain-scale", type=float, default=None,
                   help="scale of the steering PID gains (default: CARLA's 70 deg / the demo car's 0.6 rad "
                        "max wheel angle, about 2.04; 1 = TransFuser's gains as in CARLA)")
    add_threads_argument(p)
    add_quantization_argument(p)
    p.add_argument("--no-plots", action="store_true", help="skip the bird's-eye PNGs")
    p.add_argument("--no-pdm", dest="pdm_score", action="store_false",
                   help="skip the PDM score of each plan (NAVSIM v1 against the world's traffic and expert from the "
                        "plan's tick; one world rollout per plan)")
    add_parse_retry_argument(p)
    add_decoding_arguments(p)


def add_arguments(p) -> None:
    add_route_arguments(p)
    add_candidate_arguments(p.add_argument_group(
        "candidate selection (--model; scored against the route corridor and the world's vehicles now, at constant "
        "velocity: what the planner node has)"))
    p.add_argument("--expert-labels", action="store_true",
                   help="also keep every planned frame labelled with the expert's drive from that state (DAgger "
                        "data) in OUT/expert_labels/ (train.json + images: mix them into training with "
                        "wam-diff2 train ... --data.mix '[OUT/expert_labels/train.json*4]'); needs a --seed outside the "
                        "selection and report sets' route seeds (sim/protocol.py)")


def route_batch(args):
    """The RouteBatch the route options (:func:`add_route_arguments`) describe, ConfigError naming a bad one;
    ``wam-diff2-ros closed-loop`` takes the same options and builds its batch here too."""
    from ..control import ControllerGains
    from ..sim.direct_loop import demo_world_gains
    from ..sim.protocol import LOCKSTEP_N
    from ..sim.route_batch import RouteBatch
    from ..sim.route_runs import ClosedLoopSettings

    if args.oracle == bool(args.model):
        raise ConfigError("give exactly one of --model CKPT or --oracle")
    engine = EngineSettings().replace(cpu_threads=args.cpu_threads, quantization=args.quantization)
    overrides = {k: v for k, v in (("seed", args.seed), ("route_length_m", args.route_length_m)) if v is not None}
    with config_errors():
        settings = ClosedLoopSettings(traffic=args.traffic, command_source=args.command_source,
                                      pdm_score=args.pdm_score, **overrides)
        return RouteBatch(settings, demo_world_gains(ControllerGains(), args.steer_gain_scale), engine,
                          planner="oracle" if args.oracle else args.model, first_route=args.first_route,
                          routes=args.routes, lockstep_n=LOCKSTEP_N if args.lockstep_n is None else args.lockstep_n,
                          plots=not args.no_plots)


def print_summary(out: str, batch, summary: dict[str, Any], notes: Sequence[str] = (), wrote: str = "") -> None:
    """The closed-loop commands' last lines: the summary of ``batch``'s routes, the loop's notes, what was
    written."""
    from ..sim.route_report import summary_line

    print(f"closed loop: {summary_line(summary)}")
    for line in notes:
        print(line)
    print(f"wrote {out}/summary.json" + (f" and {summary['routes']} bird's-eye plots" if batch.plots else "") + wrote)


def run(args) -> int:
    from ..candidate_selection import CandidateSettings
    from ..sim.direct_loop import drive_direct
    from ..sim.expert_labels import ExpertLabels
    from ..sim.protocol import check_training_route_seed
    from ..sim.route_batch import drive_routes, write_summary
    from ..sim.route_planners import ExpertOracle, PolicyPlanner
    from ..utils.atomic import atomic_directory

    batch = route_batch(args)
    candidates = candidate_settings(args)
    if candidates is not None and args.oracle:
        raise ConfigError(f"--candidates {candidates.count}: candidate selection needs --model (the oracle plans no "
                          "candidates)")
    if args.expert_labels:
        with config_errors("--expert-labels: "):
            check_training_route_seed(batch.settings.seed)
    wrote = ""
    with atomic_directory(args.out, overwrite=args.overwrite) as out:
        planner = ExpertOracle() if args.oracle else PolicyPlanner(driving_policy(args, batch.engine,
                                                                                    candidates=candidates))
        if args.expert_labels:
            planner = labels = ExpertLabels(planner, out / "expert_labels")
        results = drive_routes(batch, out, lambda r: drive_direct(r, planner, batch.gains, batch.lockstep_n))
        if args.expert_labels:
            labels.write()
            wrote = f"; {len(labels.samples)} expert-labelled frames in {args.out}/expert_labels/train.json"
        summary = write_summary(batch, out, results, "direct", {
            "candidates": dataclasses.asdict(candidates or CandidateSettings(count=1))})
    print_summary(args.out, batch, summary, wrote=wrote)
    return 0
