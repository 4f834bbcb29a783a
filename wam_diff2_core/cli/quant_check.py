"""The parity gate of a quantized model: it and its float self decode the same planning samples.

    wam-diff2 quant-check models/wam-diff2-demo-b32 --quantization int8 --data report_set/train.json --every 5

Both models decode every planning sample of ``--data`` (the records whose answer is 8 waypoints) with the
checkpoint's decoding settings (flags override them) and the same engine. Gated, each by a tolerance:

- ``token_agreement``    answer token positions where the two answers agree, over the longer answer of each
                         pair (as DrivingPolicy.check_fast_path counts them) >= ``--min-token-agreement``;
- ``parsed``             share of answers that parse as 8 waypoints: the quantized model's is at most
                         ``--max-parse-drop`` below the float model's;
- ``l2_4s``              mean L2 at 4 s over the samples where both answers parse, with the paired 95 %
                         bootstrap interval of the difference (quantized - float, evaluation/spread.py): fails
                         when the interval's lower end is above ``--max-l2-increase-m`` (worse than the
                         tolerance with 95 % confidence); not gated when no sample parses in both;
- ``tokens_per_forward`` median answer tokens per forward after the prefill (quantization noise moves
                         confidences across the 0.9 threshold): |quantized / float - 1| <= ``--max-tpf-change``.

Exit status 0 when every gate passes, 1 when one fails (a line per failure names the metric), 2 for bad
settings. ``--json`` writes every number and the per-sample rows.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import (DEVICES, FLOAT_DTYPES, IMPLEMENTATIONS, QUANTIZATIONS, ConfigError, EngineSettings,
                      add_threads_argument)
from .common import (add_decoding_arguments, add_sample_path_arguments, apply_threads, decoding_overrides, format_table,
                     hardware_name)

HELP = "compare a quantized model with its float self on planning samples (exit 1 beyond tolerances)"


@dataclass(frozen=True)
class Tolerances:
    min_token_agreement: float = 0.95
    max_parse_drop: float = 0.0
    max_l2_increase_m: float = 0.0
    max_tpf_change: float = 0.05


def add_arguments(p) -> None:
    p.add_argument("model", help="the float checkpoint directory")
    p.add_argument("--quantization", required=True, choices=QUANTIZATIONS[1:], help="the method checked")
    p.add_argument("--data", required=True, help="planning samples (seed JSON/JSONL)")
    add_sample_path_arguments(p)
    p.add_argument("--every", type=int, default=1, help="take every N-th planning sample")
    p.add_argument("--limit", type=int, default=None, help="at most this many planning samples (after --every)")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--dtype", default="auto", choices=("auto", *FLOAT_DTYPES))
    p.add_argument("--implementation", default="auto", choices=IMPLEMENTATIONS, help="decoder of both models")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (per sample: seed + index)")
    add_threads_argument(p)
    g = p.add_argument_group("tolerances (exit 1 beyond any)")
    for name, default in asdict(Tolerances()).items():
        g.add_argument("--" + name.replace("_", "-"), type=float, default=default, help=f"default {default}")
    p.add_argument("--json", default=None, help="also write every number and the per-sample rows here")
    add_decoding_arguments(p)


@dataclass
class Check:
    metric: str
    reference: float | None       # the float model
    quantized: float | None
    detail: str                   # how it compares, with the tolerance
    passed: bool | None           # None: not gated (nothing to measure)


def parity_checks(rows: list[dict[str, Any]], tol: Tolerances) -> list[Check]:
    """The gates over per-sample rows ``{"float": {...}, "quantized": {...}}``, each side holding ``tokens``
    (answer ids), ``parsed``, ``l2_4s`` (None unless parsed) and ``tokens_per_forward``."""
    import numpy as np

    from ..evaluation.spread import bootstrap_interval, format_with_interval
    from ..policy import token_agreement

    same, total, _ = token_agreement([r["quantized"]["tokens"] for r in rows], [r["float"]["tokens"] for r in rows])
    agreement = same / total if total else 1.0
    checks = [Check("token_agreement", 1.0, agreement, f"{same}/{total} positions; needs >= {tol.min_token_agreement}",
                    agreement >= tol.min_token_agreement)]

    parsed = {side: sum(r[side]["parsed"] for r in rows) / len(rows) for side in ("float", "quantized")}
    checks.append(Check("parsed", parsed["float"], parsed["quantized"],
                        f"drop {parsed['float'] - parsed['quantized']:+.3f}; needs <= {tol.max_parse_drop}",
                        parsed["float"] - parsed["quantized"] <= tol.max_parse_drop + 1e-12))

    pairs = np.array([(r["quantized"]["l2_4s"], r["float"]["l2_4s"]) for r in rows
                      if r["quantized"]["l2_4s"] is not None and r["float"]["l2_4s"] is not None])   # [n, 2]
    if len(pairs):
        diff = pairs[:, 0] - pairs[:, 1]
        interval = bootstrap_interval(diff, np.mean)
        checks.append(Check("l2_4s", float(pairs[:, 1].mean()), float(pairs[:, 0].mean()),
                            f"{len(pairs)} samples parsed in both; difference "
                            f"{format_with_interval(float(diff.mean()), interval)} m; fails when the interval's "
                            f"lower end > {tol.max_l2_increase_m}", interval[0] <= tol.max_l2_increase_m))
    else:
        checks.append(Check("l2_4s", None, None, "no sample parsed in both: not gated", None))

    tpf = {side: statistics.median(r[side]["tokens_per_forward"] for r in rows) for side in ("float", "quantized")}
    change = tpf["quantized"] / tpf["float"] - 1.0
    checks.append(Check("tokens_per_forward", tpf["float"], tpf["quantized"],
                        f"change {change:+.1%}; needs |change| <= {tol.max_tpf_change:.1%}",
                        abs(change) <= tol.max_tpf_change + 1e-12))
    return checks


def _decode_sample(decoder, loaded, sample, images, truth, seed: int) -> dict[str, Any]:
    import torch

    from ..decoding.sampling import seeded_generators
    from ..evaluation.metrics import waypoint_errors
    from ..model.prompt_encoding import encode_prompts
    from ..outputs.parsing import parse_waypoints

    inputs = encode_prompts(loaded.processor, [sample.prompt_messages], [images]).to(loaded.device)
    t = time.perf_counter()
    with torch.no_grad():
        out = decoder.generate(inputs, loaded.config.settings, seeded_generators([seed], decoder.device))
    ms = (time.perf_counter() - t) * 1e3
    text = loaded.tokenizer.batch_decode(out.sequences, skip_special_tokens=False)[0]
    plan = parse_waypoints(text)
    s = out.stats[0]
    return {"tokens": list(out.sequences[0]), "text": text, "parsed": plan.ok,
            "l2_4s": float(waypoint_errors(plan.waypoints, truth)[-1]) if plan.ok else None,
            "tokens_per_forward": s.tokens / s.forwards if s.forwards else 0.0, "forwards": s.forwards, "ms": ms}


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from ..data.samples import SampleError, load_images
    from ..decoding import make_decoder
    from ..model.checkpoint import load_checkpoint
    from ..benchmark.model_comparison import bench_samples
    from ..model.quantization import quantized_weights, tensor_bytes

    tol = Tolerances(**{name: getattr(args, name) for name in asdict(Tolerances())})
    samples, _, skipped = bench_samples(args.data, args.data_root, args.limit, args.every, tasks=("planning",),
                                        allow_absolute_paths=args.allow_absolute_image_paths)
    apply_threads(args)
    engine = EngineSettings().replace(implementation=args.implementation, cpu_threads=args.cpu_threads)
    overrides = decoding_overrides(args)
    models = {"float": load_checkpoint(args.model, device=args.device, dtype=args.dtype, overrides=overrides)}
    if models["float"].quantization != "none":
        raise ConfigError(f"model: {args.model} is stored quantized ({models['float'].quantization}); "
                          "quant-check compares a float checkpoint with its quantized self")
    models["quantized"] = load_checkpoint(args.model, device=args.device, dtype=args.dtype, overrides=overrides,
                                          quantization=args.quantization)
    decoders = {side: make_decoder(m.model, m.config, engine=engine) for side, m in models.items()}
    weights = {side: sum(tensor_bytes(w) for w in quantized_weights(m.model).values())
               for side, m in models.items()}          # decoder-layer linears, LM head, token embedding

    rows = []
    for i, (sample, truth) in enumerate(tqdm(samples, desc=f"quant-check {args.quantization}", unit="sample")):
        try:
            images = load_images(sample)
        except SampleError as exc:
            skipped.append({"id": sample.id, "reason": str(exc)})
            continue
        rows.append({"id": sample.id, **{side: _decode_sample(decoders[side], models[side], sample, images, truth,
                                                              args.seed + i) for side in models}})
    if not rows:
        raise ConfigError(f"--data {args.data}: no planning sample has readable images")
    checks = parity_checks(rows, tol)

    loaded = models["float"]
    device_name = hardware_name(loaded.device)
    print(f"quant-check {args.model}: {args.quantization} vs float, {len(rows)} planning samples of {args.data}, "
          f"{loaded.device} ({device_name}, {torch.get_num_threads()} threads), {str(loaded.dtype).replace('torch.', '')}, decoder "
          f"{decoders['float'].__class__.__name__}; quantized weights (decoder linears, LM head, "
          f"embedding) {weights['float'] / 1e6:.2f} MB -> "
          f"{weights['quantized'] / 1e6:.2f} MB")
    ms = {side: statistics.median(r[side]["ms"] for r in rows) for side in models}
    print(f"median ms per answer (prefill + decoding): float {ms['float']:.1f}, {args.quantization} "
          f"{ms['quantized']:.1f}")
    table = [{**asdict(c), "result": {True: "pass", False: "FAIL", None: "not gated"}[c.passed]} for c in checks]
    print(format_table(table, [("metric", "metric", ""), ("reference", "float", ".4f"),
                               ("quantized", args.quantization, ".4f"), ("result", "result", ""), ("detail", "detail", "")]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": str(args.model), "quantization": args.quantization, "data": str(args.data),
            "device": str(loaded.device), "device_name": device_name, "threads": torch.get_num_threads(),
            "dtype": str(loaded.dtype), "tolerances": asdict(tol), "weight_bytes": weights, "ms_per_answer": ms,
            "checks": [asdict(c) for c in checks], "skipped": skipped, "samples": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    failed = [c for c in checks if c.passed is False]
    for c in failed:
        print(f"wam-diff2 quant-check: FAIL {c.metric}: {args.quantization} {c.quantized:.4f} vs float "
              f"{c.reference:.4f} ({c.detail})", file=sys.stderr)
    return 1 if failed else 0
