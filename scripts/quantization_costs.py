"""docs/decoding.md's "Quantized weights" measurements (CPU, float32 activations), each method side by side.

    python scripts/quantization_costs.py forward [--threads 2]   # one static forward, bench's `small` shape
    python scripts/quantization_costs.py vision [--threads 2]    # the real 2B vision tower on a 512 x 288 frame
    python scripts/quantization_costs.py modules MODEL           # int8 decoder linears, + LM head, + vision tower,
                                                                 # + LM head and token embedding (engine int8)

``forward``: random weights of bench's `small` shape (hidden 512, 6 layers, vocab 8192), one forward after a
256-token prompt (AR: 1 query, Block-32: 32), the methods timed round-robin (the shared machine's load reaches
each alike), median and fastest of 15. ``vision``: random weights, medians of 3. ``modules``: token agreement
with float and ms per answer on 6 planning prompts of random frames (int8 weight-only).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import torch

METHODS = ("none", "int8", "int8-dynamic", "int4")


def forward() -> None:
    from wam_diff2_core.benchmark.timing import ForwardBench, forward_steps, interleaved_times, weight_bytes
    from wam_diff2_core.benchmark.variants import make_variant
    from wam_diff2_core.model.random_model import build_random_model
    from wam_diff2_core.model.quantization import quantize_language_model

    dev, bench = torch.device("cpu"), ForwardBench(block_size=32, batch=1, seed=0)
    fns, sizes = {}, {}
    for q in METHODS:
        model, config = build_random_model("small", dev, torch.float32, 0, 24.0)
        quantize_language_model(model, q)
        sizes[q] = weight_bytes(model)
        decoder = make_variant("static-sdpa", model, config)
        for row, fn in forward_steps("static-sdpa", decoder, config, bench, dev, 256)[:2]:
            fns[(q, row["step"])] = fn
    times = interleaved_times(fns, dev, repeats=15, warmup=2)
    print(f"shape small, {torch.get_num_threads()} threads, float32 activations, prompt 256; ms median / fastest")
    print("| quantization | weights read per forward | AR forward | Block-32 forward |\n|---|---|---|---|")
    for q in METHODS:
        ar, block = times[(q, "AR")], times[(q, "Block-32")]
        print(f"| {q} | {sizes[q] / 1e6:.1f} MB | {ar[0]:.0f} / {ar[1]:.0f} | {block[0]:.0f} / {block[1]:.0f} |")


def vision() -> None:
    from torchao.quantization import quantize_
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from wam_diff2_core.model.quantization import torchao_config
    from wam_diff2_core.model.shapes import qwen3_vl_config

    cfg = Qwen3VLConfig(**qwen3_vl_config("2b")).vision_config
    grid = torch.tensor([[1, 18, 32]])                      # 288 x 512 pixels in 16-pixel patches
    patches = torch.randn(int(grid.prod()), 3 * 2 * 16 * 16)
    for q in ("none", "int8", "int8-dynamic"):
        torch.manual_seed(0)
        model = Qwen3VLVisionModel._from_config(cfg).eval()
        if q != "none":
            quantize_(model, torchao_config(q))
        times = []
        with torch.no_grad():
            model(patches, grid_thw=grid)
            for _ in range(3):
                t = time.perf_counter()
                model(patches, grid_thw=grid)
                times.append((time.perf_counter() - t) * 1e3)
        print(f"2B vision tower, {int(grid.prod())} patches, {q}: {statistics.median(times):.0f} ms "
              f"({torch.get_num_threads()} threads)", flush=True)


def modules(model_dir: str) -> None:
    import numpy as np
    from PIL import Image
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from wam_diff2_core.decoding import make_decoder
    from wam_diff2_core.model.checkpoint import load_checkpoint
    from wam_diff2_core.model.prompt_encoding import encode_prompts
    from wam_diff2_core.model.quantization import LAYERS_PREFIX, quantize_language_model
    from wam_diff2_core.outputs.prompts import format_planning_prompt
    from wam_diff2_core.policy import token_agreement

    rng = np.random.default_rng(0)
    prompts = []
    for i in range(6):
        text = format_planning_prompt(("left", "straight", "right")[i % 3], (3.0 + i, 0.1 * i), (0.2, -0.1))
        before, after = text.split("<image>", 1)
        prompts.append(([{"role": "user", "content": [{"type": "text", "text": before}, {"type": "image"},
                                                      {"type": "text", "text": after}]}],
                        [Image.fromarray((rng.random((180, 320, 3)) * 255).astype(np.uint8))]))

    def run(loaded):
        decoder, sequences, ms = make_decoder(loaded.model, loaded.config), [], []
        for conversation, images in prompts:
            inputs = encode_prompts(loaded.processor, [conversation], [images])
            t = time.perf_counter()
            with torch.no_grad():
                sequences += decoder.generate(inputs).sequences
            ms.append((time.perf_counter() - t) * 1e3)
        return sequences, statistics.median(ms)

    reference, ms = run(load_checkpoint(model_dir, device="cpu", dtype="float32"))
    print(f"float: ms/answer {ms:.0f}")
    linear = torch.nn.Linear
    choices = {"decoder linears": lambda m, fqn: isinstance(m, linear) and fqn.startswith(LAYERS_PREFIX),
               "+ LM head": lambda m, fqn: isinstance(m, linear) and (fqn.startswith(LAYERS_PREFIX) or fqn == "lm_head"),
               "+ vision tower": lambda m, fqn: isinstance(m, linear) and fqn.startswith((LAYERS_PREFIX, "model.visual"))}
    choices["+ LM head and token embedding (int8 as shipped)"] = None
    for name, chosen in choices.items():
        loaded = load_checkpoint(model_dir, device="cpu", dtype="float32")
        if chosen is None:
            quantize_language_model(loaded.model, "int8")
        else:
            quantize_(loaded.model, Int8WeightOnlyConfig(), filter_fn=chosen)
        sequences, ms = run(loaded)
        same, total, _ = token_agreement(sequences, reference)
        print(f"int8 {name}: token agreement {same}/{total} = {same / total:.3f}, ms/answer {ms:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("forward", "vision", "modules"))
    parser.add_argument("model", nargs="?", default="models/wam-diff2-demo-b32", help="modules: the checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    {"forward": forward, "vision": vision, "modules": lambda: modules(args.model)}[args.what]()


if __name__ == "__main__":
    main()
