"""Copy a checkpoint with its weights cast to another dtype (how the demo models are shipped).

    wam-diff2 export runs/demo/curriculum/block32/final models/demo/block32 --dtype bfloat16
    wam-diff2 export models/wam-diff2-demo-b32 /tmp/demo-int8 --dtype float32 --quantize int8

The tokenizer, processor and ``diffusion_config.json`` are copied unchanged; the copy is
written atomically. Loading casts back to the device's dtype (float32 on CPU). With ``--quantize`` the
language model's linear layers are stored quantized (safetensors, no pickles; the method in
``diffusion_config.json``) and load as stored, in ``--dtype`` (model/quantization.py).
"""
from __future__ import annotations

from ..config import FLOAT_DTYPES, QUANTIZATIONS

HELP = "copy a checkpoint with its weights in another dtype"


def add_arguments(p) -> None:
    p.add_argument("src", help="checkpoint directory")
    p.add_argument("dst", help="output directory (must not exist)")
    p.add_argument("--dtype", default="bfloat16", choices=FLOAT_DTYPES)
    p.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                   help="store the language model's linear layers quantized (needs torchao; default none)")


def run(args) -> int:
    from ..model.saving import export_checkpoint

    print(f"wrote {export_checkpoint(args.src, args.dst, dtype=args.dtype, quantize=args.quantize)}")
    return 0
