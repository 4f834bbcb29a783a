"""Generate demo-world driving data: a training/evaluation set and carla-ros-bridge-like rosbag2 bags.

    wam-diff2 synth data/synth --episodes 40 --frames 100 --frame-stride 5 --formats json
    wam-diff2 synth data/demo_bag --episodes 1 --frames 400 --seed 1000 --formats mcap,sqlite3

The output folder holds manifest.json, train.json / val.json (planning, detection and question
samples in the authors' format), frames.jsonl (per-frame ground truth), images/ and
bags/{mcap,sqlite3}/eNNNN/. It is written atomically: an interrupted run leaves nothing at
the output path. See wam_diff2_core/sim/README.md for the world, the camera and the formats.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..topics import DEFAULT_ROLE
from ..outputs.prompts import COMMANDS
from ..vehicle_projection import MIN_VISIBLE_PIXELS

HELP = "generate synthetic driving scenes (JSON samples and rosbag2 bags)"


def _formats(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_arguments(p) -> None:
    p.add_argument("output", help="output folder (must not exist unless --overwrite)")
    p.add_argument("--episodes", type=int, default=8, help="episodes (independent worlds)")
    p.add_argument("--frames", type=int, default=200, help="camera frames per episode")
    p.add_argument("--frame-stride", type=int, default=1,
                   help="ticks (1/20 s) between camera frames; odometry is always 20 Hz")
    p.add_argument("--seed", type=int, default=0, help="episode i draws from numpy default_rng([seed, i])")
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--height", type=int, default=180)
    p.add_argument("--fov-deg", type=float, default=90.0, help="horizontal field of view")
    traffic = p.add_mutually_exclusive_group()
    traffic.add_argument("--traffic", dest="traffic", action="store_true", default=True, help="other vehicles (default)")
    traffic.add_argument("--no-traffic", dest="traffic", action="store_false", help="an empty road")
    p.add_argument("--formats", type=_formats, default=("json", "mcap", "sqlite3"),
                   help="comma-separated subset of json,mcap,sqlite3,b2d (default: json,mcap,sqlite3; b2d: each "
                        "episode as a Bench2Drive clip, 10 Hz: --frame-stride 2)")
    p.add_argument("--val-fraction", type=float, default=0.25, help="share of episodes held out as val.json")
    p.add_argument("--role", default=DEFAULT_ROLE, help="CARLA role name in the bag topics and frames")
    p.add_argument("--command-topic", default=None,
                   help="std_msgs/String command topic in the bags (default: the planner node's input, "
                        "/wam_diff2_planner/input/command)")
    p.add_argument("--image-format", default="jpg", choices=("jpg", "png"))
    p.add_argument("--vqa-per-frame", type=int, default=1, help="question samples per frame (0-4)")
    p.add_argument("--no-detection", dest="detection", action="store_false", help="no detection samples")
    p.add_argument("--min-visible-pixels", type=int, default=MIN_VISIBLE_PIXELS,
                   help="a vehicle gets a ground-truth box (detection answers, frames.jsonl) with at least this many "
                        "visible pixels (default %(default)s, the threshold of eval-bag's truth from a bag's objects)")
    p.add_argument("--prompt-acceleration", default="estimated", choices=("estimated", "true"),
                   help="acceleration in the planning prompt: the planner node's estimate from odometry "
                        "(default) or the simulator's true value")
    p.add_argument("--recovery-fraction", type=float, default=0.0,
                   help="share of training frames that also get a copy seen from a displaced ego (sideways "
                        "offset, heading error) answered with the expert's drive back to the lane")
    p.add_argument("--recovery-offset-m", dest="recovery_max_offset_m", type=float, default=argparse.SUPPRESS,
                   help="largest sideways displacement of a recovery copy")
    p.add_argument("--recovery-yaw-deg", dest="recovery_max_yaw_deg", type=float, default=argparse.SUPPRESS,
                   help="largest heading error of a recovery copy")
    p.add_argument("--recovery-standstill", dest="recovery_standstill_probability", type=float,
                   default=argparse.SUPPRESS, help="share of recovery copies started from a standstill")
    p.add_argument("--recovery-slow", dest="recovery_slow_probability", type=float, default=argparse.SUPPRESS,
                   help="share of recovery copies slowed to a uniform share of their speed")
    p.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=COMMANDS,
                   help="JSON samples only of the frames under these route commands (bags keep every frame)")
    p.add_argument("--mirror-turns", action="store_true",
                   help="turn the other way (left <-> right) at every crossing: with the same --seed, the "
                        "twin of the export without it (the same approaches to the first crossing, the "
                        "opposite command and path)")
    p.add_argument("--workers", type=int, default=1, help="episodes generated in parallel processes")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def settings_from_args(args):
    from ..config import ConfigError
    from ..sim.camera import CameraSettings
    from ..sim.episode import EpisodeSettings, RecoverySettings
    from ..sim.dataset_export import ExportSettings
    from ..sim.road import RouteSettings
    from ..sim.world import WorldSettings
    from .common import config_errors

    for name in ("width", "height"):
        if getattr(args, name) < 16:
            raise ConfigError(f"--{name} must be >= 16, got {getattr(args, name)}")
    if args.min_visible_pixels < 1:
        raise ConfigError(f"--min-visible-pixels must be >= 1, got {args.min_visible_pixels}")
    if not 10.0 <= args.fov_deg <= 150.0:
        raise ConfigError(f"--fov-deg must be in [10, 150], got {args.fov_deg}")
    with config_errors():       # the settings' own checks name the field
        camera = CameraSettings(width=args.width, height=args.height, horizontal_fov_deg=args.fov_deg,
                                min_visible_pixels=args.min_visible_pixels)
        limits = {k: getattr(args, f"recovery_{k}") for k in ("max_offset_m", "max_yaw_deg", "standstill_probability",
                                                               "slow_probability") if hasattr(args, f"recovery_{k}")}
        recovery = RecoverySettings(fraction=args.recovery_fraction, **limits)
        world = WorldSettings(route=RouteSettings(mirror_turns=args.mirror_turns))
        episode = EpisodeSettings(frames=args.frames, frame_stride=args.frame_stride, traffic=args.traffic,
                                  world=world, camera=camera, recovery=recovery)
        given = {k: getattr(args, k) for k in ("episodes", "seed", "formats", "val_fraction", "role", "image_format",
                                               "vqa_per_frame", "detection", "workers", "prompt_acceleration",
                                               "command_topic") if getattr(args, k) is not None}
        return ExportSettings(episode=episode, commands=tuple(args.commands), **given)


def run(args) -> int:
    from ..config import ConfigError
    from ..sim.dataset_export import export

    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    manifest = export(args.output, settings_from_args(args), overwrite=args.overwrite, progress=args.progress,
                      command_line=[os.path.basename(sys.argv[0]), *sys.argv[1:]])
    counts = manifest["counts"]
    parts = [f"{counts['episodes']} episodes", f"{counts['frames']} frames"]
    if "train_samples" in counts:
        parts.append(f"{counts['train_samples']} train / {counts['val_samples']} val samples")
    if manifest["bags"]:
        parts.append(f"{sum(len(b) for b in manifest['bags'].values())} bags")
    print(f"wam-diff2 synth: {', '.join(parts)} in {manifest['wall_time_s']:.1f} s -> {args.output}")
    return 0
