"""Write a deterministic tiny random Qwen3-VL block-diffusion checkpoint (for tests and smoke runs).

    wam-diff2 tiny-checkpoint /tmp/tiny --seed 0
"""
from __future__ import annotations

import argparse

HELP = "write a tiny random checkpoint built from code"


def add_arguments(p) -> None:
    p.add_argument("out_dir", help="directory to write (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=32, help="block size stored in diffusion_config.json")
    # unset sizes keep build_tiny_checkpoint's defaults (the tests' tiny model)
    p.add_argument("--hidden-size", type=int, default=argparse.SUPPRESS,
                   help="language model width (a multiple of 32)")
    p.add_argument("--layers", type=int, default=argparse.SUPPRESS, help="language model decoder layers")
    p.add_argument("--vision-depth", type=int, default=argparse.SUPPRESS, help="vision tower blocks")
    p.add_argument("--vision-hidden-size", type=int, default=argparse.SUPPRESS,
                   help="vision tower width (a multiple of 32)")
    p.add_argument("--logit-scale", type=float, default=argparse.SUPPRESS,
                   help="LM head scale: the default spreads a random model's confidences over (0, 1); 1 is a "
                        "plain initialisation for training from scratch")
    p.add_argument("--ar", action="store_true",
                   help="a stock autoregressive Qwen3-VL checkpoint (no <|mask|>, no diffusion settings)")


def run(args) -> int:
    from ..model.tiny import build_tiny_checkpoint
    from ..utils.atomic import atomic_directory
    from .common import config_errors

    sizes = {k: v for k, v in vars(args).items() if k in ("hidden_size", "layers", "logit_scale", "vision_depth",
                                                            "vision_hidden_size")}
    with config_errors(), atomic_directory(args.out_dir) as tmp:
        build_tiny_checkpoint(tmp, seed=args.seed, block_size=args.block_size, diffusion=not args.ar, **sizes)
    print(f"wrote {args.out_dir}")
    return 0
