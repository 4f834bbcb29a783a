"""Decoding speed: ms per forward beside its memory-bandwidth floor, ms per token, end-to-end decodes.

    wam-diff2 bench --shape small --device cpu                         # CPU: plain vs static (+ fused commit)
    wam-diff2 bench --shape 2b --device cuda --dtype bfloat16 --json bench.json   # GPU, 2B-shaped, random bf16
    wam-diff2 bench --model B32_CKPT --ar-model AR_CKPT --data eval.json --out bench_models/   # models on samples

With ``--data`` the command compares trained models on planning samples instead (AR at B = 1 vs
block diffusion at each block size and threshold: speed, L2 at 4 s, parse failures; see
``bench_models.py``). Without it:

Random weights in a Qwen3-VL shape (``2b``: the text dimensions of Qwen3-VL-2B; ``small`` and ``tiny``
for CPUs) or ``--model CKPT``; prompts are random text tokens. Three tables, medians of
``--repeats`` timed runs after a warm-up:

1. forward: ms of one forward after a prompt of each ``--prompt-lengths`` (AR: 1 query; Block-B:
   B queries; fused commit + step: 2B queries) for each variant (plain = transformers + DynamicCache;
   static eager / CUDA graph; SDPA / FlashInfer), beside the memory-bandwidth floor of that forward
   (bytes of weights + K/V read / the device's measured copy bandwidth) and the kernels it launches
   (benchmark/kernel_count.py: counted on any device; "-" for a compiled forward, whose kernels Inductor makes);
2. per token at ``--tokens-per-forward`` (measure it on a trained model: answer tokens / denoise steps):
   a block costs S_b = B / tpf forwards, plus one commit forward on the plain path; AR costs one
   forward per token;
3. decode: whole generate() calls, plain vs static, same prompts (EOS is banned so every run
   produces exactly ``--new-tokens`` tokens), split into prefill and decoding time.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from ..benchmark.kernel_count import add_kernel_counts
from ..benchmark.timing import ForwardBench, measure_bandwidth, per_token, time_decodes, time_forwards, weight_bytes
from ..benchmark.variants import available_variants, make_variant
from ..config import DEVICES, FLOAT_DTYPES, ConfigError, add_threads_argument
from ..model.random_model import SHAPES, build_random_model
from . import bench_models
from .common import add_quantization_argument, apply_threads, format_table, hardware_name

HELP = "benchmark decoding: per-forward time vs bandwidth floor, ms/token, plain vs static"
log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("--shape", default="small", choices=sorted(SHAPES), help="random-weight model shape")
    p.add_argument("--model", default=None, help="a checkpoint directory instead of random weights")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--dtype", default="auto", choices=("auto", *FLOAT_DTYPES))
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=list(ForwardBench.prompt_lengths))
    p.add_argument("--block-size", type=int, default=None,
                   help="the Block-B compared with AR (default: the checkpoint's block size with --model, "
                        "else the paper's 32)")
    p.add_argument("--batch", type=int, default=ForwardBench.batch)
    p.add_argument("--tokens-per-forward", type=float, default=ForwardBench.tokens_per_forward,
                   help="answer tokens fixed per denoise forward, measured on a trained model "
                        f"(default {ForwardBench.tokens_per_forward})")
    p.add_argument("--new-tokens", type=int, default=ForwardBench.new_tokens,
                   help="tokens per decode in the decode table")
    p.add_argument("--repeats", type=int, default=ForwardBench.repeats, help="timed runs per measurement (median)")
    p.add_argument("--variants", nargs="+", default=None,
                   help="subset of: plain static-sdpa static-sdpa-graph static-sdpa-compiled-graph "
                        "static-flashinfer static-flashinfer-graph (also static-sdpa-compiled: compiled, no graphs)")
    p.add_argument("--skip-decode", action="store_true", help="no end-to-end decode table")
    p.add_argument("--logit-scale", type=float, default=24.0,
                   help="random weights: logit scale (through the final norm), so confidences spread like a trained model's")
    p.add_argument("--seed", type=int, default=0)
    add_threads_argument(p)
    add_quantization_argument(p)
    p.add_argument("--json", default=None, help="also write every number here")
    bench_models.add_arguments(p)


def run(args) -> int:
    if args.data:
        return bench_models.run(args)
    import torch

    from ..model.checkpoint import load_checkpoint
    from ..model.devices import resolve_device, resolve_dtype

    apply_threads(args)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.model:   # the one precedence rule: --block-size > the checkpoint's settings > its format's
        loaded = load_checkpoint(args.model, device=str(device), dtype=args.dtype,
                                 overrides={"block_size": args.block_size}, quantization=args.quantization)
        model, config, shape = loaded.model, loaded.config, str(args.model)
    else:
        from ..model.quantization import quantize_language_model
        model, config = build_random_model(args.shape, device, dtype, args.seed, args.logit_scale)
        quantize_language_model(model, args.quantization)
        config = config.with_settings(block_size=args.block_size)
        shape = args.shape
    if config.block_size < 2:
        raise ConfigError(f"block_size: {config.block_size} (from {config.sources.get('block_size', 'the user')}); "
                          "the benchmark compares AR with Block-B, give --block-size B >= 2")
    bench = ForwardBench(prompt_lengths=tuple(args.prompt_lengths), block_size=config.block_size, batch=args.batch,
                         seed=args.seed, repeats=args.repeats, tokens_per_forward=args.tokens_per_forward,
                         new_tokens=args.new_tokens)
    variants = {}
    for name in args.variants or available_variants(device):
        try:
            variants[name] = make_variant(name, model, config)
        except (ConfigError, RuntimeError) as exc:
            log.warning("variant %s skipped: %s", name, exc)
    bandwidth = measure_bandwidth(device)
    device_name = hardware_name(device)
    print(f"device {device} ({device_name}, {torch.get_num_threads()} threads), {dtype}, shape {shape}, "
          f"batch {bench.batch}, B={bench.block_size}, quantization {args.quantization}, "
          f"measured bandwidth {bandwidth / 1e9:.1f} GB/s, weights {weight_bytes(model) / 1e6:.1f} MB, "
          f"medians of {args.repeats}")

    for name, decoder in variants.items():
        if name.endswith("-graph"):
            decoder.warmup(batch_sizes=(bench.batch,), prompt_tokens=bench.prompt_lengths[0],
                           settings=config.settings.replace(block_size=bench.block_size))
    forward_rows = time_forwards(variants, model, config, bench, device, bandwidth)
    add_kernel_counts(forward_rows, variants, config, bench, device)
    print("\n1. one forward (median and fastest ms) vs the memory-bandwidth floor (weights + K/V read / bandwidth)")
    print(format_table(forward_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("step", "step", ""),
                                ("ms", "ms", ".3f"), ("min_ms", "min ms", ".3f"), ("floor_ms", "floor ms", ".3f"),
                                ("x_floor", "x floor", ".2f"), ("kernels", "kernels", "")]))
    token_rows = per_token(forward_rows, bench)
    print(f"\n2. per token at {args.tokens_per_forward} tokens per denoise forward (AR: 1)")
    print(format_table(token_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("mode", "mode", ""),
                              ("ms_per_token", "ms/token", ".3f"), ("tokens_per_s", "tokens/s", ".1f")]))
    decode_rows = []
    if not args.skip_decode:
        decode_rows = time_decodes(variants, config, bench, device)
        print(f"\n3. decode {args.new_tokens} tokens: whole generate() calls (total: median and fastest of "
              "--repeats), split into prefill and decoding (medians); ms/token and tokens/s exclude the prefill")
        print(format_table(decode_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("mode", "mode", ""),
                                   ("ms", "total ms", ".1f"), ("min_ms", "min ms", ".1f"),
                                   ("prefill_ms", "prefill ms", ".1f"), ("decode_ms", "decode ms", ".1f"),
                                   ("forwards", "forwards", ""), ("tokens_per_forward", "tok/fwd", ".2f"),
                                   ("ms_per_token", "decode ms/token", ".3f"), ("tokens_per_s", "tokens/s", ".1f"),
                                   ("same_tokens_as_first", "same tokens", "")]))
        print("\n4. per stage of those calls, p50 / p95 ms (text prompts: no image, processor, vision or parse "
              "stage; `bench --data` times all of them on images)")
        print(format_table(decode_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("mode", "mode", ""),
                                   *((f"{k}_{q}_ms", f"{k} {q}", ".1f") for k in ("prefill", "denoise", "commit")
                                     for q in ("p50", "p95"))]))
    if args.json:
        payload = {"device": str(device), "device_name": device_name, "threads": torch.get_num_threads(),
                   "dtype": str(dtype), "quantization": args.quantization, "shape": shape, "tokens_per_forward": args.tokens_per_forward,
                   "batch": bench.batch, "block_size": bench.block_size, "bandwidth_gbps": bandwidth / 1e9,
                   "torch": torch.__version__, "forward": forward_rows, "per_token": token_rows,
                   "decode": decode_rows}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0
