"""Open-loop evaluation of the planner on rosbag2 recordings (sqlite3 or mcap), without ROS.

    wam-diff2 eval-bag run.mcap --model CKPT --out eval_run/ [--every 2] [--record preds_bag]
    wam-diff2 eval-bag bag_a/ bag_b/ --model CKPT --out eval_run/ --role ego_vehicle --block-size 8
    wam-diff2 eval-bag run.mcap --params-file config/planner.yaml --out eval_node/   # the node's settings
    wam-diff2 eval-bag --compare eval_ar/ eval_b32/ --out eval_compare/
    wam-diff2 eval-bag run.mcap --predictions node_out --out eval_node/     # score what a node published

Each camera frame's inputs come from the recorded messages exactly as the planner node derives them;
``DrivingPolicy.step`` plans (or, with --predictions NODE_BAG, the Trajectory a node published for the
frame during ``wam-diff2-ros replay BAG --record NODE_BAG`` is matched by stamp), and the plan is scored
against the recorded drive at +0.5 ... +4.0 s beside the constant-velocity baseline: L2, its speed
profile's speed error and, with an objects topic, the collision rate and NAVSIM v1's PDM score. OUT
gets metrics.json, frames.jsonl, report.md and plots, written atomically. Topics default to
carla-ros-bridge's names for --role. Details: wam_diff2_core/evaluation/README.md.
"""
from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
from pathlib import Path

from ..config import ConfigError, EngineSettings, add_threads_argument
from ..evaluation.bag_plan import EvalSettings, plan_bags
from ..evaluation.bags import BagError, BagTopics
from ..evaluation.collision import EgoFootprint
from ..params import planner as node_params
from ..params.parameter_file import read_node_params
from ..topics import DEFAULT_CAMERA, DEFAULT_COMMAND_TOPIC, DEFAULT_ROLE, PLANNER_NODE, carla_namespace, carla_topics
from .common import (add_decoding_arguments, add_image_limit_arguments, add_model_arguments, add_parse_retry_argument,
                     add_quantization_argument, config_errors, decoding_overrides, driving_policy, image_limits)

HELP = "score the planner open-loop on rosbag2 bags (L2 / ADE / FDE, parse failures, latency) or --compare runs"
log = logging.getLogger(__name__)
NO_DEFAULT_COMMAND = "none"      # --default-command none: skip frames with no command
TOPICS = ("image", "odometry", "route", "command", "camera_info", "objects")   # --ROLE-topic flags; from route on optional


def add_arguments(p) -> None:
    p.add_argument("bags", nargs="*", metavar="BAG", help="rosbag2 folder, .mcap or .db3 file (several: pooled)")
    p.add_argument("--out", required=True, help="report folder (written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (and --record)")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="instead of evaluating: put two finished runs side by side in --out")
    p.add_argument("--label", default="", help="name of this run in reports and --compare (default: folder name)")
    p.add_argument("--every", type=int, default=1, help="evaluate every N-th camera frame (default 1: all)")
    p.add_argument("--max-frames", type=int, default=None, help="evaluate at most this many frames per bag")
    p.add_argument("--record", metavar="OUT_BAG", default=None,
                   help="also write the predictions (wam_diff2_ros/Trajectory + nav_msgs/Path) into this new bag")
    p.add_argument("--record-storage", default="mcap", choices=("mcap", "sqlite3"))
    p.add_argument("--ego-frame", default="base_link", help="frame_id of ego-frame outputs in --record")
    p.add_argument("--bev-samples", type=int, default=6, help="frames in the bird's-eye-view plot")
    p.add_argument("--predictions", nargs="+", metavar="NODE_BAG", default=None,
                   help="instead of running a model: score the Trajectory messages recorded in NODE_BAG (e.g. by "
                        "`wam-diff2-ros replay BAG --record NODE_BAG`), one NODE_BAG per BAG in the same order; no "
                        "--model or decoding flags")
    p.add_argument("--trajectory-topic", default=None, metavar="TOPIC",
                   help=f"the Trajectory topic in NODE_BAG (default /{PLANNER_NODE}/output/trajectory, else the "
                        "bag's only Trajectory topic)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    bridge = carla_topics("ROLE", "CAMERA")                # the defaults, with the flags' names in their place
    t = p.add_argument_group(f"topics (default: carla-ros-bridge names under {carla_namespace('ROLE')})")
    t.add_argument("--role", default=DEFAULT_ROLE, help=f"carla-ros-bridge role name (default {DEFAULT_ROLE})")
    t.add_argument("--camera", default=DEFAULT_CAMERA, help=f"camera sensor id (default {DEFAULT_CAMERA})")
    for role, what, default, note in (
            ("image", "sensor_msgs/Image or CompressedImage", bridge["image"], ""),
            ("odometry", "nav_msgs/Odometry", bridge["odometry"], ""),
            ("route", "nav_msgs/Path route", bridge["route"], "; used when the bag has it"),
            ("command", "std_msgs/String command, overrides the route", DEFAULT_COMMAND_TOPIC + ", the node's input",
             "; used when the bag has it"),
            ("objects", "derived_object_msgs/ObjectArray of the other agents, for the collision rate and the PDM score",
             bridge["objects"], "; used when present"),
            ("camera_info", "sensor_msgs/CameraInfo", bridge["camera_info"], "; informational")):
        t.add_argument(f"--{role.replace('_', '-')}-topic", default=None, help=f"{what} (default {default}{note})")

    i = p.add_argument_group("inputs, as the planner node derives them (default: --params-file, then the node's "
                             "defaults)")
    i.add_argument("--params-file", default=None,
                   help="the planner node's parameter YAML (e.g. config/planner.yaml): its input, route, decoding, "
                        "device, dtype, engine.quantization, pixel budget, image size limits and model_path values "
                        "apply unless a flag here says otherwise; its trajectory.* limits shape the speed profile "
                        "scored against the recorded speed")
    for name in node_params.INPUT_PARAMETERS:      # the node's input parameters, one flag each
        spec, dest = node_params.SPECS_BY_NAME[name], node_params.cli_dest(name)
        choices = None if spec.choices is None else (*spec.choices, NO_DEFAULT_COMMAND)
        extra = f"; {NO_DEFAULT_COMMAND}: skip such frames" if choices else ""
        i.add_argument("--" + dest.replace("_", "-"), dest=dest, type=spec.kind, default=None, choices=choices,
                       help=f"{spec.description} (node default {spec.default}{extra})")
    add_image_limit_arguments(i)
    e = p.add_argument_group("ego box for the collision rate and the PDM score (default: the demo world's ego, "
                             "odometry at the rear axle)")
    for f in dataclasses.fields(EgoFootprint):
        e.add_argument("--ego-" + f.name.replace("_", "-"), dest="ego_" + f.name, type=float, default=f.default,
                       help=f"default {f.default} (a CARLA bag: --ego-centre-ahead-m 0, and the ego's size)")
    p.add_argument("--lane-width-m", type=float, default=EvalSettings.lane_width_m,
                   help="the PDM score's drivable area: a corridor this wide around the route, or the recorded drive "
                        f"without one (the bag has no map; default {EvalSettings.lane_width_m:g})")
    p.add_argument("--max-gap-s", type=float, default=EvalSettings.max_gap_s,
                   help="longest odometry gap the recorded future is interpolated over "
                        f"(default {EvalSettings.max_gap_s:g})")

    add_model_arguments(p, required=False)  # --compare needs no model; run() checks it for evaluation
    add_threads_argument(p)
    add_quantization_argument(p)
    spec = node_params.SPECS_BY_NAME["max_waypoint_abs_m"]
    p.add_argument("--max-waypoint-abs-m", type=float, default=None,
                   help=f"{spec.description} (node default {spec.default:g})")
    add_parse_retry_argument(p)
    add_decoding_arguments(p)


def _apply_params_file(args) -> dict:
    """Fill the flags the user did not give (left at None, or at the node's own default such as
    ``--device auto``) from --params-file: every parameter of ``node_params.FLAG_PARAMETERS``
    (a YAML integer for a float parameter as a float; "" or 0 where that means "none", e.g.
    image.min_pixels, stays unset; a value of the wrong type is refused later, naming it)."""
    with config_errors("--params-file "):
        node = read_node_params(args.params_file) if args.params_file else {}
    for name in node_params.FLAG_PARAMETERS:
        spec, dest = node_params.SPECS_BY_NAME[name], node_params.cli_dest(name)
        current, value = getattr(args, dest), node.get(name)
        if value is None or not (current is None or current == spec.default):
            continue
        if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        setattr(args, dest, None if spec.default in ("", 0) and not value else value)
    return node


def _settings(args, node: dict) -> EvalSettings:
    """The evaluation settings the flags (and --params-file's ``node`` values) give; ConfigError for a bad one."""
    given = {name: getattr(args, node_params.cli_dest(name)) for name in node_params.INPUT_PARAMETERS}
    values = {**node_params.DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    if values["default_command"] == NO_DEFAULT_COMMAND:
        values["default_command"] = None
    with config_errors():
        return EvalSettings(
            topics=BagTopics.carla(args.role, args.camera, **{role: getattr(args, role + "_topic") for role in TOPICS}),
            required=frozenset(role.replace("_", " ") for role in TOPICS[2:] if getattr(args, role + "_topic")),
            footprint=EgoFootprint(**{f.name: getattr(args, "ego_" + f.name)
                                      for f in dataclasses.fields(EgoFootprint)}),
            inputs=node_params.input_settings(values),
            profile_limits=node_params.given_profile_limits(node, f"--params-file {args.params_file}"),
            image_limits=image_limits(args), every=args.every, max_frames=args.max_frames, max_gap_s=args.max_gap_s,
            lane_width_m=args.lane_width_m)


def _model_info(policy, args) -> dict:
    info = {"path": str(Path(args.model).resolve()), "min_pixels": args.min_pixels, "max_pixels": args.max_pixels,
            "params_file": _params_path(args), "max_waypoint_abs_m": getattr(policy, "max_waypoint_abs_m", None),
            "parse_retry": getattr(policy, "parse_retry", None)}
    loaded = getattr(policy, "loaded", None)
    if loaded is not None:
        info.update(device=str(loaded.device), dtype=str(loaded.dtype).replace("torch.", ""),
                    quantization=getattr(loaded, "quantization", "none"), decoding=dataclasses.asdict(loaded.config.settings))
    return info


def _params_path(args) -> str | None:
    return str(Path(args.params_file).resolve()) if args.params_file else None


def run(args) -> int:
    try:
        if args.compare:
            return _compare(args)
        if not args.bags:
            raise ConfigError("give at least one BAG (or --compare RUN_A RUN_B)")
        return _evaluate(args)
    except BagError as exc:
        raise ConfigError(str(exc)) from None


def _evaluate(args) -> int:
    """Score the bags: a model's plans, or with --predictions what a planner node published (no model)."""
    from ..evaluation.report import write_run_report

    from_node = args.predictions is not None
    if from_node:
        if given := _model_flags_given(args):
            raise ConfigError(f"--predictions scores what the node published, so no model runs here: drop "
                              f"{', '.join(given)} (the node's own settings made the predictions)")
        if len(args.predictions) != len(args.bags):
            raise ConfigError(f"--predictions: {len(args.predictions)} NODE_BAG(s) for {len(args.bags)} BAG(s); "
                              "give one per BAG, in the same order")
        _check_outputs(args)
        node = _apply_params_file(args)      # the input settings (odometry timeout, route, default command)
        if node.get("model_path"):
            log.info("--predictions: model_path in --params-file is not used (the node's predictions are scored)")
    else:
        if args.trajectory_topic is not None:
            raise ConfigError("--trajectory-topic goes with --predictions")
        node = _apply_params_file(args)
        if not args.model:
            raise ConfigError("--model is required to evaluate bags (or model_path in --params-file; or score what "
                              "a node published with --predictions NODE_BAG)")
        _check_outputs(args)
    settings = _settings(args, node)
    plans = plan_bags(args.bags, settings)          # every bag checked before the (slow) model load
    if from_node:
        from ..evaluation.predictions import evaluate_predictions, predictions_source

        run = evaluate_predictions(args.bags, args.predictions, settings, topic=args.trajectory_topic, plans=plans)
        model = predictions_source(run, _params_path(args))
    else:
        from ..evaluation.runner import evaluate_bags

        extra = {} if args.max_waypoint_abs_m is None else {"max_waypoint_abs_m": args.max_waypoint_abs_m}
        policy = driving_policy(args, EngineSettings(cpu_threads=args.cpu_threads, quantization=args.quantization)
                                .validated(), tasks=("plan",), **extra)
        run = evaluate_bags(args.bags, policy, settings, progress=not args.no_progress, plans=plans)
        model = _model_info(policy, args)
    record = _record(args, run)
    metrics = write_run_report(args.out, run, model=model, command=_command_line(), label=args.label, record=record,
                               overwrite=args.overwrite, bev_samples=args.bev_samples)
    _print_summary(args, metrics, record, "node" if from_node else "model")
    if from_node and metrics["counts"]["predictions"]["messages"] == 0:
        print("eval-bag: note: the predictions bag holds no trajectories: did the planner run (and was it READY) "
              "while the bag was replayed?", file=sys.stderr)
    return 0


def _record(args, run) -> str | None:
    """--record: the run's predictions written into a new bag (its path), else None."""
    if not args.record:
        return None
    from ..evaluation.record import record_predictions

    b = run.bags[0]
    return str(record_predictions(args.record, b.frames, b.plan.trajectory, odometry_frame=b.plan.odometry_frame,
                                  storage=args.record_storage, ego_frame=args.ego_frame, overwrite=args.overwrite))


def _check_outputs(args) -> None:
    """ConfigError when --out / --record cannot be written (one input bag with --record; no overwriting unasked)."""
    if args.record and len(args.bags) != 1:
        raise ConfigError("--record writes one bag: evaluate one input bag at a time with it")
    for flag, path in (("--out", args.out), ("--record", args.record)):
        if path and Path(path).exists() and not args.overwrite:
            raise ConfigError(f"{flag} {path} already exists (use --overwrite to replace it)")


def _model_flags_given(args) -> list[str]:
    """The model / decoding flags given on the command line (they mean nothing with --predictions)."""
    dests = [node_params.cli_dest(name) for name in node_params.MODEL_PARAMETERS
             if getattr(args, node_params.cli_dest(name)) not in (None, node_params.DEFAULTS[name])]
    return [f"--{dest.replace('_', '-')}" for dest in dests + list(decoding_overrides(args))]


def _command_line() -> str:
    """The command line, when this process is `wam-diff2 eval-bag ...` (not a caller of main([...]))."""
    argv = sys.argv[sys.argv.index("eval-bag") + 1:] if "eval-bag" in sys.argv else None
    return "wam-diff2 eval-bag " + " ".join(shlex.quote(a) for a in argv) if argv else ""


def _opt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_summary(args, metrics: dict, record: str | None, who: str = "model") -> None:
    """Counts, L2 at 1-4 s beside the constant-velocity baseline, the speed profile's error beside the
    constant-speed baseline, decoding and latency, the report."""
    c, o = metrics["counts"], metrics["overall"]
    published = ""
    if "predictions" in c:
        pc = c["predictions"]
        published = (f"; node trajectories: {pc['messages']} ({pc['matched']} matched, "
                     f"{c['skipped'].get('not_published', 0)} frames not published, {pc['unscored_frame']} for "
                     f"unscored frames, {pc['unmatched_stamp']} unmatched stamps)")
    print(f"eval-bag: {c['evaluated']} frames evaluated of {c['images']} camera frames "
          f"({c['not_selected']} not selected, {sum(c['skipped'].values())} skipped, "
          f"{sum(c['excluded_no_future'].values())} without 4 s of future); {o['valid']} valid plans, "
          f"parse failures {o['parse_failures']}{published}")
    horizons = {h: "@" + h for h in o["model"]["l2_at_t"]}
    three = lambda v: f"{v:8.3f}"        # noqa: E731

    def beside_baseline(block: dict, baseline: str, values: str) -> list:
        return [(name, block[key][values], block[key]["frames"])
                for name, key in ((who, "model"), (baseline.replace("_", " "), baseline))]
    _table("L2 (m, UniAD)", horizons, beside_baseline(o, "constant_velocity", "l2_at_t"), three)
    if o.get("speed_profile"):
        _table("speed error (m/s)", horizons, beside_baseline(o["speed_profile"], "constant_speed", "mean_at_t"), three)
    for convention, label in (("at_t", "UniAD"), ("avg_to_t", "VAD")) if o.get("collision") else ():
        _table(f"collision (%, {label})", horizons, beside_baseline(o["collision"], "constant_velocity", convention),
               lambda v: f"{100 * v:8.1f}")
    pdm = o.get("pdm")
    if pdm:
        from ..evaluation.metrics import PDM_SUBSCORES
        from ..evaluation.report_markdown import pdm_area_label, pdm_rows

        print(f"  PDM score (NAVSIM v1) on {pdm['frames']} frames; drivable area: "
              f"{pdm_area_label(pdm, metrics['settings']['lane_width_m'])}; EP reference: the recorded drive")
        _table("", {k: k.upper() for k in ("pdms", *PDM_SUBSCORES)},
               [(name, row, row["pdm_samples"]) for name, row in pdm_rows(pdm, who)], three)
    detection = metrics.get("detection")
    if detection:
        sc, dc = detection["scores"], detection["counts"]
        print(f"  the node's boxes: {dc['matched']} frames scored of {dc['messages']} messages"
              + (f"; COCO AP {_opt(sc['ap'])}, AP50 {_opt(sc['ap50'])}, AR@100 {_opt(sc['ar100'])} against "
                 f"{sc['truth_boxes']} boxes the camera saw of the bag's objects, {sc['parse_failures']} unparsed"
                 if sc else ""))
    d, lat = o.get("decode") or {}, o.get("latency_ms") or {}
    if d.get("tokens_per_frame", {}).get("count"):
        retried = d.get("retried_frames")
        print(f"  decoding: median {d['tokens_per_frame']['p50']:.0f} tokens in {d['forwards_per_frame']['p50']:.0f} "
              f"forwards per answer ({d['tokens_per_forward']:.2f} tokens/forward)"
              + (f"; {retried} decoded again after a parse failure" if retried else ""))
    if lat.get("count"):
        print(f"  latency per plan: median {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, max {lat['max']:.1f} ms")
    if o.get("stages"):
        from ..profiling import stage_table
        print("\n".join(stage_table(o["stages"])))
    print(f"  report: {Path(args.out) / 'report.md'} (plots beside it)" + (f"; predictions: {record}" if record else ""))


def _table(title: str, columns: dict[str, str], rows, cell) -> None:
    """``title`` over the column labels, then a line per (name, values by column, frames) row ("-": None)."""
    print(f"  {title:<21}" + "".join(f"{label:>8}" for label in columns.values()) + "   frames")
    for name, values, frames in rows:
        print(f"  {name:<20} " + "".join("       -" if values[c] is None else cell(values[c]) for c in columns)
              + f"   {frames:>6}")


def _compare(args) -> int:
    from ..evaluation.report import compare_runs

    if args.predictions is not None:
        raise ConfigError("--compare takes two finished run folders; --predictions goes with BAG")
    if args.bags:
        raise ConfigError("--compare takes two run folders, not bags")
    if Path(args.out).exists() and not args.overwrite:
        raise ConfigError(f"--out {args.out} already exists (use --overwrite to replace it)")
    result = compare_runs(args.compare[0], args.compare[1], args.out, overwrite=args.overwrite)
    a, b = list(result["runs"])
    print(f"compare: {a} vs {b} on {result['common_valid_frames']['frames']} common valid frames; "
          f"report: {Path(args.out) / 'compare.md'}")
    return 0
