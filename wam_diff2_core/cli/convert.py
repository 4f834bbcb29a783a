"""Make an autoregressive Qwen3-VL checkpoint diffusion-ready.

Adds the ``<|mask|>`` token to the tokenizer when it is missing, grows the embedding and LM
head when the new id has no row (the new row starts at the mean embedding), writes
``diffusion_config.json`` and relabels a WAM-Diff2 ``model_type`` to ``qwen3_vl``.

    wam-diff2 convert Qwen3-VL-2B-Instruct/ qwen3vl-2b-diffusion/ --block-size 4
"""
from __future__ import annotations

HELP = "convert an AR Qwen3-VL checkpoint into a diffusion-ready one"


def add_arguments(p) -> None:
    p.add_argument("src", help="AR checkpoint directory")
    p.add_argument("dst", help="output directory (must not exist)")
    p.add_argument("--block-size", type=int, default=4,
                   help="block size to start training with (Stage I starts at 4)")


def run(args) -> int:
    from ..model.ar_to_diffusion import convert_to_diffusion

    print(f"wrote {convert_to_diffusion(args.src, args.dst, block_size=args.block_size)}")
    return 0
