"""Drive routes of the demo world in closed loop and score them (route completion, infractions).

    wam-diff2 closed-loop --model CKPT --routes 10 --out runs/closed_loop          # planner + controller over DDS
    wam-diff2 closed-loop --model CKPT --routes 10 --out runs/cl --loop direct      # same policy + controller, no ROS
    wam-diff2 closed-loop --oracle --routes 3 --out /tmp/cl_oracle                 # test the loop, no model
    wam-diff2 closed-loop --model CKPT --timing leaderboard --planner-process subprocess --out runs/cl_lb
    wam-diff2 closed-loop --model CKPT --loop direct --seed 5000 --routes 20 --expert-labels --out runs/dagger

Loops (``--loop``): ``ros`` (default) runs the simulator on carla-ros-bridge topics, the planner
node (in this process or ``--planner-process subprocess``) in lockstep mode every
``--lockstep-n`` ticks and the controller node every tick, with the leaderboard's handshake
and 1.0 s control deadline (``wam_diff2_ros.closed_loop``); ``direct`` calls the same policy
and controller in one process, without ROS (``wam_diff2_core.sim.route_runs``). ``--oracle``
replaces the planner by the demo world's expert future (an oracle that reads the simulator:
it tests the control + simulation loop and bounds what this controller can do).

Writes OUT/summary.json (settings, per-route results, the summary) and OUT/route_NNN.png (bird's-eye
view per route). Scoring (route completion, infraction penalty, driving score) is documented
in ``wam_diff2_core/sim/route_runs.py``.
"""
from __future__ import annotations

import dataclasses
import json
import sys

from .common import add_decoding_arguments, add_model_arguments, add_parse_retry_argument, decoding_overrides

HELP = "drive demo-world routes in closed loop (planner + controller) and report a driving score"


def add_arguments(p) -> None:
    add_model_arguments(p, required=False)
    p.add_argument("--oracle", action="store_true",
                   help="plan with the demo world's expert future instead of a model (an oracle: tests the loop)")
    p.add_argument("--out", required=True, help="output directory (summary.json, route_NNN.png)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--routes", type=int, default=10, help="number of routes (default 10)")
    p.add_argument("--first-route", type=int, default=0, help="index of the first route (default 0)")
    p.add_argument("--seed", type=int, default=None, help="route seed (default: ClosedLoopSettings.seed, 2000)")
    p.add_argument("--route-length-m", type=float, default=None, help="route length (default 200 m)")
    p.add_argument("--traffic", action="store_true", help="traffic on the routes (default: none)")
    p.add_argument("--command-source", choices=("world", "route"), default="world",
                   help="world: the demo world's command rule (its training labels); route: tracked from the "
                        "route with RoadOptions (direct) or a Path (ros) by wam_diff2_core.routes")
    p.add_argument("--loop", choices=("ros", "direct"), default="ros")
    p.add_argument("--lockstep-n", type=int, default=10, help="plan on every N-th tick (default 10: 2 Hz)")
    p.add_argument("--timing", choices=("lockstep", "leaderboard"), default="lockstep",
                   help="ros loop: lockstep waits for each planning tick's trajectory; leaderboard waits only "
                        "for the control (1.0 s) and ticks at most at real time")
    p.add_argument("--planner-process", choices=("inprocess", "subprocess"), default="inprocess",
                   help="ros loop: the planner node in this process or in its own")
    p.add_argument("--odometry", choices=("true", "estimated"), default="true",
                   help="ros loop: true: the simulator publishes its odometry; estimated: it publishes GNSS, IMU and "
                        "a speedometer with noise (as the leaderboard's SENSORS track) and the localization node's "
                        "estimate drives the planner and the controller")
    p.add_argument("--role", default="hero", help="CARLA role name of the topics (default hero)")
    p.add_argument("--domain-id", type=int, default=None, help="ROS domain (default: ROS_DOMAIN_ID or 0)")
    p.add_argument("--steer-gain-scale", type=float, default=None,
                   help="scale of the steering PID gains (default: CARLA's 70 deg / the demo car's 0.6 rad "
                        "max wheel angle, about 2.04; 1 = TransFuser's gains as in CARLA)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for the model (the planner's engine.cpu_threads; default 0: torch's, one "
                        "per core, which the ros loop's simulator and executors then compete with)")
    p.add_argument("--expert-labels", action="store_true",
                   help="direct loop: also keep every planned frame labelled with the expert's drive from "
                        "that state (DAgger data) in OUT/expert_labels/ (train.json + images: mix them into "
                        "training with wam-diff2 train ... --data.mix '[OUT/expert_labels/train.json*4]')")
    p.add_argument("--no-plots", action="store_true", help="skip the bird's-eye PNGs")
    add_parse_retry_argument(p)
    add_decoding_arguments(p)


def run(args) -> int:
    from tqdm import tqdm

    from ..config import EngineSettings
    from ..control import ControllerGains
    from ..sim.route_runs import (ClosedLoopSettings, ExpertLabels, ExpertOracle, PolicyPlanner, RouteRun,
                                   demo_world_gains, drive_direct, plot_route, summarize, summary_line)
    from ..utils.atomic import atomic_directory

    if args.oracle == bool(args.model):
        print("wam-diff2 closed-loop: error: give exactly one of --model CKPT or --oracle", file=sys.stderr)
        return 2
    if args.odometry != "true" and args.loop != "ros":
        print("wam-diff2 closed-loop: error: --odometry estimated needs --loop ros", file=sys.stderr)
        return 2
    if args.expert_labels and args.loop != "direct":
        print("wam-diff2 closed-loop: error: --expert-labels needs --loop direct", file=sys.stderr)
        return 2
    engine = EngineSettings().replace(cpu_threads=args.threads)      # validated here, for both loops
    overrides = {k: v for k, v in (("seed", args.seed), ("route_length_m", args.route_length_m)) if v is not None}
    settings = ClosedLoopSettings(traffic=args.traffic, command_source=args.command_source, **overrides)
    gains = demo_world_gains(ControllerGains(), args.steer_gain_scale)
    indices = range(args.first_route, args.first_route + args.routes)
    results = []
    localization = None
    record = {"settings": {**dataclasses.asdict(settings), "loop": args.loop, "timing": args.timing,
                           "odometry": args.odometry,
                           "lockstep_n": args.lockstep_n, "planner": "oracle" if args.oracle else args.model,
                           "gains": dataclasses.asdict(gains), "routes": list(indices)}}
    with atomic_directory(args.out, overwrite=args.overwrite) as out:
        progress = tqdm(indices, desc="routes", unit="route")

        def drive(each):
            for i in progress:
                run_ = RouteRun(i, settings)
                result = each(run_)
                results.append(result)
                progress.set_postfix(rc=f"{result.route_completion:.2f}", end=result.termination)
                if not args.no_plots:
                    plot_route(run_, out / f"route_{i:03d}.png")

        if args.loop == "direct":
            if args.oracle:
                planner = ExpertOracle()
            else:
                from ..policy import DrivingPolicy
                planner = PolicyPlanner(DrivingPolicy.from_checkpoint(
                    args.model, device=args.device, dtype=args.dtype, overrides=decoding_overrides(args),
                    min_pixels=args.min_pixels, max_pixels=args.max_pixels,
                    **({} if args.parse_retry is None else {"parse_retry": args.parse_retry}), engine=engine))
            if args.expert_labels:
                planner = labels = ExpertLabels(planner, out / "expert_labels")
            drive(lambda r: drive_direct(r, planner, gains, args.lockstep_n))
            if args.expert_labels:
                labels.write()
        else:
            try:
                from wam_diff2_ros.closed_loop import RosClosedLoop, RosLoopSettings
            except ImportError as exc:
                print(f"wam-diff2 closed-loop: error: --loop ros needs rclpy and the package's messages ({exc}); "
                      "run `make setup`, or use --loop direct", file=sys.stderr)
                return 2
            planner_params = {"device": args.device, "dtype": args.dtype, "engine.cpu_threads": engine.cpu_threads,
                              **{"decoding." + k: v for k, v in decoding_overrides(args).items()}}
            if args.min_pixels:
                planner_params["image.min_pixels"] = args.min_pixels
            if args.max_pixels:
                planner_params["image.max_pixels"] = args.max_pixels
            if args.parse_retry is not None:
                planner_params["parse_retry"] = args.parse_retry
            ros = RosLoopSettings(role=args.role, planner="oracle" if args.oracle else args.planner_process,
                                  model_path=args.model or "", planner_parameters=planner_params,
                                  lockstep_n=args.lockstep_n, timing=args.timing, command_source=args.command_source,
                                  gains=gains, domain_id=args.domain_id, odometry=args.odometry)
            with RosClosedLoop(ros) as loop:
                drive(loop.run_route)
            if loop.localization_errors:
                from ..sim.sensors import error_summary
                localization = error_summary(*zip(*loop.localization_errors))
        summary = summarize(results)
        record.update(summary=summary, results=[r.to_json() for r in results])
        if localization is not None:
            record["localization"] = localization
        (out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"closed loop: {summary_line(summary)}")
    if localization is not None:
        print(f"localization (estimate vs truth, {localization['ticks']} ticks): position median "
              f"{localization['position_median_m']:.3f} m, p95 {localization['position_p95_m']:.3f} m; heading median "
              f"{localization['heading_median_deg']:.3f} deg, p95 {localization['heading_p95_deg']:.3f} deg")
    print(f"wrote {args.out}/summary.json" + ("" if args.no_plots else f" and {len(results)} bird's-eye plots")
          + (f"; {len(labels.samples)} expert-labelled frames in {args.out}/expert_labels/train.json"
             if args.expert_labels else ""))
    return 0

