"""docs/checkpoints.md's "Memory and time to expect" figures: weight memory of the real Qwen3-VL 2B / 8B shapes
(counted on the meta device, nothing allocated), image tokens per frame size and pixel budget, and
with --rss DTYPE the peak RSS and a 300-token text prefill of random 2B-shaped weights on this CPU.

    python scripts/model_memory.py                  # tables (seconds)
    python scripts/model_memory.py --rss float32    # + 2B RSS / prefill (minutes; ~11 GB)
"""
from __future__ import annotations

import argparse
import resource
import time

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from wam_diff2_core.model.checkpoint import count_parameters
from wam_diff2_core.model.prompt_encoding import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
from wam_diff2_core.model.shapes import qwen3_vl_config

SHAPES = {"2B": qwen3_vl_config("2b"), "8B": qwen3_vl_config("8b")}
PIXELS_PER_TOKEN = 32          # 16-pixel patches, merged 2 x 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rss", choices=("float32", "bfloat16"), default=None)
    args = parser.parse_args()
    print("| shape | parameters | bf16 | float32 |")
    for name, kw in SHAPES.items():
        n = count_parameters(Qwen3VLConfig(**kw))
        print(f"| {name} | {n / 1e9:.2f} B | {n * 2 / 1e9:.1f} GB | {n * 4 / 1e9:.1f} GB |")
    for w, h in ((1920, 1080), (1600, 900)):
        for budget in (DEFAULT_MAX_PIXELS, 1003520, 401408):
            rh, rw = smart_resize(h, w, factor=PIXELS_PER_TOKEN, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=budget)
            print(f"{w}x{h} max_pixels={budget}: resized {rw}x{rh}, "
                  f"{(rh // PIXELS_PER_TOKEN) * (rw // PIXELS_PER_TOKEN)} image tokens")
    if args.rss:
        torch.set_default_dtype(getattr(torch, args.rss))
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**SHAPES["2B"])).eval()
        ids = torch.randint(0, 150000, (1, 300))
        start = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids)
        print(f"2B {args.rss}: 300-token text prefill {time.perf_counter() - start:.1f} s, peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
