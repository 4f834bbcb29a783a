"""Write a deterministic tiny random Qwen3-VL block-diffusion checkpoint (for tests and smoke runs).

    wam-diff2 tiny-checkpoint /tmp/tiny --seed 0
"""
from __future__ import annotations

HELP = "write a tiny random checkpoint built from code"


def add_arguments(p) -> None:
    p.add_argument("out_dir", help="directory to write (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=32, help="block size stored in diffusion_config.json")
    p.add_argument("--ar", action="store_true",
                   help="a stock autoregressive Qwen3-VL checkpoint (no <|mask|>, no diffusion settings)")


def run(args) -> int:
    from ..model.tiny import build_tiny_checkpoint
    from ..utils.atomic import atomic_directory

    with atomic_directory(args.out_dir) as tmp:
        build_tiny_checkpoint(tmp, seed=args.seed, block_size=args.block_size, diffusion=not args.ar)
    print(f"wrote {args.out_dir}")
    return 0
