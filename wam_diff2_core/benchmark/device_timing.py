"""Device timings of the fast decoding path: one denoise forward per variant beside its eager twin, a
greedy Block-32 decode at each ``mask_check_interval``, a camera frame through ``DrivingPolicy``, and the
same on quantized weights. What ``wam-diff2 verify-device`` runs as its forward, decode, frame and quant
parts; ``args`` below is that command's arguments (``seed``, ``shape``, ``prompt_length``, ``repeats``,
``new_tokens``, ``check_tokens``, ``frames``, ``frame_size``, ``candidates``).

    rows = time_block_forwards(model, config, device, decoders, args, measure_bandwidth(device))
"""
from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace

from .timing import measure_bandwidth, time_forwards
from .token_check import check_tokens
from .variants import available_variants, make_variant, random_prompt

INTERVALS = (1, 2, 4, 8)   # mask_check_interval values the decode is timed at (the default among them)


def eager_twin(variant: str) -> str:
    """The eager, uncompiled variant a graphed one is compared with (graphs / eager)."""
    return variant.removesuffix("-graph").replace("-compiled", "")


def time_block_forwards(model, config, device, variants: dict, args, bandwidth) -> list[dict]:
    bench_args = SimpleNamespace(block_size=32, batch=1, seed=args.seed, prompt_lengths=[args.prompt_length],
                                 repeats=args.repeats)
    for name, decoder in variants.items():
        if name.endswith("-graph"):
            decoder.warmup(batch_sizes=(1,), prompt_tokens=args.prompt_length,
                           settings=config.settings.replace(block_size=32))
    rows = [r for r in time_forwards(variants, model, config, bench_args, device, bandwidth) if r["queries"] <= 32]
    ms = {(r["variant"], r["step"]): r["ms"] for r in rows}
    for r in rows:                      # each graphed variant against its eager twin (uncompiled)
        eager = ms.get((eager_twin(r["variant"]), r["step"]))
        r["graph_speedup"] = eager / r["ms"] if r["variant"].endswith("-graph") and eager else "-"
    return rows


def measure_decode(decoder, plain, config, device, args) -> dict:
    """A greedy Block-32 decode of ``--new-tokens`` (EOS banned): tokens per forward and ms per token at
    each ``mask_check_interval`` of ``INTERVALS`` (the host reads the "still masked?" flag every k steps:
    fewer syncs against idle steps, the trade a device run settles); the tokens must not change."""
    from ..policy import token_agreement

    inputs = random_prompt(config.vocab_size, 1, args.prompt_length, args.seed + 1, device)
    base = config.settings.replace(block_size=32, denoising_steps=32, max_new_tokens=args.new_tokens)
    sweep, reference = [], None
    for interval in sorted({*INTERVALS, base.mask_check_interval}):
        settings = base.replace(mask_check_interval=interval)
        decoder.generate(inputs, settings)                                       # warm
        outs = [decoder.generate(inputs, settings) for _ in range(max(1, args.repeats // 4))]
        s = outs[-1].stats[0]
        reference = reference if reference is not None else outs[-1].sequences[0]
        sweep.append({"interval": interval, "same_tokens": outs[-1].sequences[0] == reference,
                      "tokens": s.tokens, "forwards": s.forwards, "tokens_per_forward": s.tokens / max(1, s.forwards),
                      "ms_per_token": statistics.median(o.stats[0].denoise_ms + o.stats[0].commit_ms
                                                        for o in outs) / max(1, s.tokens),
                      "prefill_ms": statistics.median(o.stats[0].prefill_ms for o in outs)})
    default = next(r for r in sweep if r["interval"] == base.mask_check_interval)
    same, total, _ = token_agreement([reference], plain.generate(inputs, base).sequences)
    return {**default, "sweep": sweep, "same_tokens": all(r["same_tokens"] for r in sweep),
            "plain_agreement": same / max(1, total)}


def check_quantized(device, dtype, args, method: str, unquantized: list[dict]) -> tuple[dict, bool]:
    """The quant part for one method: the token check on quantized weights, then the forward timings of the
    ``--shape`` model quantized, each beside the same variant's unquantized ms (``unquantized``: the forward
    part's rows, when that part ran). A missing torchao is a skipped result with the reason, not a failure
    (the machine may lack it; gpu_verify.sh carries its wheel from gpu_wheels/)."""
    from ..config import ConfigError
    from ..model.quantization import quantize_language_model, require_torchao
    from ..model.random_model import build_random_model

    try:
        require_torchao(method)
    except ConfigError as exc:
        return {"method": method, "skipped": str(exc)}, True
    tokens, ok = check_tokens(device, False, args.check_tokens, quantization=method)
    model, config = build_random_model(args.shape, device, dtype, args.seed, 24.0)
    report = quantize_language_model(model, method)
    config = config.with_settings(block_size=32)
    variants = {}
    for variant in available_variants(device):
        if variant == "plain" or "flashinfer" in variant:
            continue
        try:
            variants[variant] = make_variant(variant, model, config)
        except Exception as exc:  # noqa: BLE001 - a variant that cannot start on quantized weights fails
            tokens.append(dict(dtype=method, variant=variant, case="-", same="-", note=f"FAIL {type(exc).__name__}: {exc}"))
            ok = False
    rows = time_block_forwards(model, config, device, variants, args, measure_bandwidth(device)) if variants else []
    before = {(r["variant"], r["step"]): r["ms"] for r in unquantized}
    for r in rows:
        r["x_unquantized"] = r["ms"] / before[(r["variant"], r["step"])] if (r["variant"], r["step"]) in before else "-"
    del model, variants
    return {"method": method, "weights": report.describe(), "tokens": tokens, "forward": rows}, ok


def measure_frames(device, dtype, args) -> dict:
    """1920 x 1080 frames -> parsed trajectories through DrivingPolicy (p50 / p95 of ``--frames``)."""
    import numpy as np

    from ..config import DiffusionConfig
    from ..model.checkpoint import LoadedModel
    from ..model.tiny import build_processor, build_tokenizer
    from ..geometry import EgoMotion
    from ..candidate_selection import CandidateSettings
    from ..policy import DrivingPolicy
    from ..model.random_model import SHAPES, VISION_2B, build_random_model

    tokenizer = build_tokenizer(args.seed, qwen_layout=True)
    ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    dims = {**SHAPES[args.shape], "vocab_size": 151936}                      # the Qwen id layout
    model, _ = build_random_model(dims, device, dtype, args.seed, 24.0, token_ids=ids,
                                  vision=VISION_2B if args.shape == "2b" else None)
    from ..model.prompt_encoding import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
    processor = build_processor(tokenizer, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=DEFAULT_MAX_PIXELS)
    config = DiffusionConfig.resolve(None, tokenizer, model.config, {"max_new_tokens": min(96, args.new_tokens)},
                                     checkpoint_format="wam_diff2")
    loaded = LoadedModel(model=model, processor=processor, config=config, path=Path("random-" + args.shape),
                         device=device, dtype=dtype)
    policy = DrivingPolicy(loaded, parse_retry="none")
    policy.warmup()                                                          # as the node does
    width, height = args.frame_size
    frame = np.random.default_rng(args.seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ego = EgoMotion((5.0, 0.0), (0.0, 0.0))
    policy.step(frame, ego, "straight")                                      # the frame's shapes, once
    times, tokens = [], []
    for _ in range(args.frames):
        out = policy.step(frame, ego, "straight")
        times.append(out.latency_ms)
        tokens.append(out.plan.stats.tokens)
    candidates = {}
    for count in args.candidates:                                            # N rows in one batched decode
        many = DrivingPolicy(loaded, parse_retry="none", candidates=CandidateSettings(count=count))
        many.warmup()
        many.step(frame, ego, "straight")
        candidates[count] = statistics.median(many.step(frame, ego, "straight").latency_ms
                                              for _ in range(args.frames))
    times.sort()
    return {"frames": len(times), "size": f"{width}x{height}", "p50_ms": statistics.median(times),
            "p95_ms": times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))],
            "answer_tokens": statistics.median(tokens), "decoder": policy.decoder.__class__.__name__,
            "candidates_p50_ms": candidates}
