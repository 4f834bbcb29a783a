"""Copy a checkpoint with its weights cast to another dtype (how the demo models are shipped).

    wam-diff2 export runs/demo/curriculum/block32/final models/demo/block32 --dtype bfloat16

The tokenizer, processor and ``diffusion_config.json`` are copied unchanged; the copy is
written atomically. Loading casts back to the device's dtype (float32 on CPU).
"""
from __future__ import annotations

HELP = "copy a checkpoint with its weights in another dtype"


def add_arguments(p) -> None:
    p.add_argument("src", help="checkpoint directory")
    p.add_argument("dst", help="output directory (must not exist)")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))


def run(args) -> int:
    from ..model.checkpoint import export_checkpoint

    print(f"wrote {export_checkpoint(args.src, args.dst, dtype=args.dtype)}")
    return 0
