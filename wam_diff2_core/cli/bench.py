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
   (bytes of weights + K/V read / the device's measured copy bandwidth);
2. per token at ``--tokens-per-forward`` (measure it on a trained model: answer tokens / denoise steps):
   a block costs S_b = B / tpf forwards, plus one commit forward on the plain path; AR costs one
   forward per token;
3. decode: whole generate() calls, plain vs static, same prompts (EOS is banned so every run
   produces exactly ``--new-tokens`` tokens), split into prefill and decoding time.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

from ..model.random_model import SHAPES, build_random_model
from ..profiling import StageTimes, stage_summary
from ..config import add_threads_argument
from .common import add_quantization_argument, apply_threads, cpu_name, format_table

HELP = "benchmark decoding: per-forward time vs bandwidth floor, ms/token, plain vs static"
log = logging.getLogger(__name__)

def add_arguments(p) -> None:
    p.add_argument("--shape", default="small", choices=sorted(SHAPES), help="random-weight model shape")
    p.add_argument("--model", default=None, help="a checkpoint directory instead of random weights")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--block-size", type=int, default=None,
                   help="the Block-B compared with AR (default: the checkpoint's block size with --model, "
                        "else the paper's 32)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens-per-forward", type=float, default=4.0,
                   help="answer tokens fixed per denoise forward, measured on a trained model (default 4.0)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per decode in the decode table")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per measurement (median)")
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
    from . import bench_models
    bench_models.add_arguments(p)


# ---------------------------------------------------------------------------------- timing
def _sync(device) -> None:
    from ..decoding.common import PhaseTimer
    PhaseTimer(device).sync()


def _time_ms(fn, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def _median_ms(fn, device, repeats: int, warmup: int = 2) -> float:
    return _interleaved_times({"x": fn}, device, repeats, warmup)["x"][0]


def _interleaved_times(fns: dict, device, repeats: int, warmup: int = 2) -> dict:
    """(median, min) ms of each callable, timed round-robin (A B C A B C ...) so that every one sees
    the same machine state: fair side-by-side numbers on a shared or throttling machine."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            times[key].append(_time_ms(fn, device))
    return {key: (statistics.median(t), min(t)) for key, t in times.items()}


def measure_bandwidth(device) -> float:
    """Device memory bandwidth in bytes/s: a large copy reads and writes every byte once."""
    import torch
    size = (1 << 30) if device.type != "cpu" else (256 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), device, repeats=5)
    return 2 * size / (ms / 1e3)


def weight_bytes(model) -> int:
    """Bytes a forward must read: the text layers, the final norm and the LM head (the embedding
    table is only gathered from, unless it is the LM head)."""
    from ..model.quantization import tensor_bytes

    text = model.model.language_model
    params = {id(p): p for p in list(text.layers.parameters()) + list(text.norm.parameters())
              + list(model.lm_head.parameters())}
    return sum(tensor_bytes(p) for p in params.values())       # quantized weights: their int8 data + scales


def kv_bytes(model, keys: int, batch: int) -> int:
    cfg = model.model.language_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * keys * cfg.num_key_value_heads * head_dim * model.dtype.itemsize


# ---------------------------------------------------------------------------------- variants
def available_variants(device) -> list[str]:
    variants = ["plain", "static-sdpa"]
    if device.type == "cuda":
        variants += ["static-sdpa-graph", "static-sdpa-compiled-graph"]
        from ..decoding.attention_flashinfer import flashinfer_problem
        if flashinfer_problem():
            log.warning("no FlashInfer rows: %s", flashinfer_problem())
        else:
            variants += ["static-flashinfer", "static-flashinfer-graph"]
    return variants


def make_variant(name: str, model, config):
    """A decoder by variant name: ``static-<attention>[-compiled][-graph][-emulated]``; ``-compiled`` runs the
    forward through torch.compile (engine.compile_forward), ``-graph-emulated`` is the graphed path with
    emulated graphs (decoding/cuda_graphs.py: any device; verify-device's check of the capture rules off a GPU)."""
    from ..decoding import make_decoder
    if name == "plain":
        return make_decoder(model, config, "plain")
    backend = "flashinfer" if "flashinfer" in name else "sdpa"
    compiled = "-compiled" in name
    if name.endswith("-emulated"):
        from ..config import EngineSettings
        from ..decoding.static import StaticBlockDiffusionDecoder
        engine = EngineSettings(implementation="static", cuda_graphs=True, attention_backend=backend,
                                compile_forward=compiled)
        return StaticBlockDiffusionDecoder(model, config, engine, graph_emulation=True)
    decoder = make_decoder(model, config, "static", attention_backend=backend, cuda_graphs=name.endswith("-graph"),
                           compile_forward=compiled)
    if name.endswith("-graph") and not decoder.graphs.enabled:
        raise RuntimeError(decoder.graphs.reason)
    return decoder


def random_prompt(vocab: int, batch: int, length: int, seed: int, device):
    """Random token ids [batch, length] (seeded) as a benchmark prompt, on ``device``."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 8, (batch, length), generator=gen)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def forward_steps(name, decoder, config, args, device, length: int) -> list[tuple[dict, object]]:
    """(row, callable) per step shape after a prompt of ``length``: AR (1 query), block (B), and for
    the static path the fused commit + step (2B). Each callable runs one forward."""
    import torch
    size, batch = args.block_size, args.batch
    inputs = random_prompt(config.vocab_size, batch, length, args.seed, device)
    shapes = [("AR", 1, [(0, 1)]), (f"Block-{size}", size, [(0, size)])]
    if name != "plain":
        shapes.append((f"fused commit+step ({2 * size} q)", 2 * size, [(0, size), (size, size)]))
    steps = []
    with torch.no_grad():
        if name == "plain":
            prefix = decoder.prefill(inputs, size)
            block = torch.full((batch, size), config.mask_token_id, device=device)
        else:
            state = decoder.begin(inputs, size, answer_slots=4 * size)
        for label, queries, segments in shapes:
            if name == "plain":   # transformers forward on a DynamicCache, cropped back
                fn = (lambda q=queries: decoder.forward_block(prefix, block[:, :q], 0, keep=False))
            else:
                buf = decoder.plan_step(state, segments)
                buf.tokens.fill_(config.mask_token_id)
                fn = (lambda b=buf: decoder.forward(state, b))
            keys = length + segments[-1][0] + segments[-1][1]
            steps.append(({"variant": name, "prompt": length, "step": label, "queries": queries,
                           "keys": keys}, torch.no_grad()(fn)))
    return steps


def time_forwards(variants: dict, model, config, args, device, bandwidth) -> list[dict]:
    """Median ms of one forward per (variant, prompt length, step shape), variants interleaved."""
    rows = []
    for length in args.prompt_lengths:
        steps = [step for name, decoder in variants.items()
                 for step in forward_steps(name, decoder, config, args, device, length)]
        times = _interleaved_times({i: fn for i, (_, fn) in enumerate(steps)}, device, args.repeats)
        for i, (row, _) in enumerate(steps):
            floor = (weight_bytes(model) + kv_bytes(model, row["keys"], args.batch)) / bandwidth * 1e3
            median, fastest = times[i]
            rows.append({**row, "ms": median, "min_ms": fastest, "floor_ms": floor, "x_floor": median / floor})
    return rows


def per_token(forward_rows: list[dict], args) -> list[dict]:
    """ms/token and tokens/s from per-forward medians at --tokens-per-forward."""
    size, tpf, out = args.block_size, args.tokens_per_forward, []
    by_key = {(r["variant"], r["prompt"], r["queries"]): r["ms"] for r in forward_rows}
    for (variant, prompt, queries), ms in by_key.items():
        if queries == 1:
            ms_token = ms
            mode = "AR"
        elif queries == size:
            steps = max(1.0, size / tpf)
            if variant == "plain":      # S_b steps + a commit forward of the same shape
                ms_block, mode = (steps + 1) * ms, f"Block-{size}"
            else:                       # the first step carries the previous block's commit
                fused = by_key[(variant, prompt, 2 * size)]
                ms_block, mode = (steps - 1) * ms + fused, f"Block-{size} fused"
            ms_token = ms_block / size
        else:
            continue
        out.append({"variant": variant, "prompt": prompt, "mode": mode, "tokens_per_forward":
                    1.0 if queries == 1 else tpf, "ms_per_token": ms_token,
                    "tokens_per_s": 1e3 / ms_token * args.batch})
    return out


def time_decodes(variants: dict, config, args, device) -> list[dict]:
    """Whole generate() calls on the same prompts, AR and Block-B, variants interleaved."""
    import torch
    rows = []
    for length in args.prompt_lengths:
        inputs = random_prompt(config.vocab_size, args.batch, length, args.seed + 1, device)
        for block in (1, args.block_size):
            settings = config.settings.replace(block_size=block, denoising_steps=block,
                                               max_new_tokens=args.new_tokens)
            outs = {name: [] for name in variants}
            fns = {name: (lambda d=decoder, o=outs[name]: o.append(d.generate(inputs, settings)))
                   for name, decoder in variants.items()}
            with torch.no_grad():
                times = _interleaved_times(fns, device, args.repeats, warmup=1)
            reference = None
            for name in variants:
                out = outs[name][-1]
                reference = out.sequences if reference is None else reference
                s = out.stats[0]
                tokens = sum(x.tokens for x in out.stats)
                ms, fastest = times[name]
                # Decoding alone (prefill excluded), per call from the decoder's own phase timers.
                decode_ms = statistics.median(o.stats[0].denoise_ms + o.stats[0].commit_ms for o in outs[name])
                stages = []            # text prompts: no image, processor or vision stage; no parsing
                for o in outs[name][-args.repeats:]:          # the timed calls, not the warm-up
                    st = StageTimes()
                    st.add_decode(o.stats[0], 0.0)
                    st.total_ms = st.stage_sum_ms
                    stages.append(st)
                ms_by_stage = stage_summary(stages)["ms"]
                rows.append({"variant": name, "prompt": length, "mode": "AR" if block == 1 else f"Block-{block}",
                             "ms": ms, "min_ms": fastest, "forwards": s.forwards, "tokens": s.tokens,
                             "tokens_per_forward": s.tokens / max(1, s.denoise_steps),
                             "prefill_ms": statistics.median(o.stats[0].prefill_ms for o in outs[name]),
                             "decode_ms": decode_ms, "ms_per_token": decode_ms / max(1, s.tokens),
                             "tokens_per_s": tokens / (decode_ms / 1e3), "same_tokens_as_first": out.sequences == reference,
                             **{f"{k}_{q}_ms": ms_by_stage[k][q] for k in ("prefill", "denoise", "commit")
                                for q in ("p50", "p95")}})
    return rows


def run(args) -> int:
    if args.data:
        from . import bench_models
        return bench_models.run(args)
    import torch

    from ..config import ConfigError
    from ..model.checkpoint import load_checkpoint, resolve_device, resolve_dtype

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
    args.block_size = config.block_size
    if args.block_size < 2:
        raise ConfigError(f"block_size: {args.block_size} (from {config.sources.get('block_size', 'the user')}); "
                          "the benchmark compares AR with Block-B, give --block-size B >= 2")
    names = args.variants or available_variants(device)
    variants = {}
    for name in names:
        try:
            variants[name] = make_variant(name, model, config)
        except (ConfigError, RuntimeError) as exc:
            log.warning("variant %s skipped: %s", name, exc)
    bandwidth = measure_bandwidth(device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"device {device} ({device_name}, {torch.get_num_threads()} threads), {dtype}, shape {shape}, "
          f"batch {args.batch}, B={args.block_size}, quantization {args.quantization}, "
          f"measured bandwidth {bandwidth / 1e9:.1f} GB/s, weights {weight_bytes(model) / 1e6:.1f} MB, "
          f"medians of {args.repeats}")

    for name, decoder in variants.items():
        if name.endswith("-graph"):
            decoder.warmup(batch_sizes=(args.batch,), prompt_tokens=args.prompt_lengths[0],
                           settings=config.settings.replace(block_size=args.block_size))
    forward_rows = time_forwards(variants, model, config, args, device, bandwidth)
    print("\n1. one forward (median and fastest ms) vs the memory-bandwidth floor (weights + K/V read / bandwidth)")
    print(format_table(forward_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("step", "step", ""),
                                ("ms", "ms", ".3f"), ("min_ms", "min ms", ".3f"), ("floor_ms", "floor ms", ".3f"),
                                ("x_floor", "x floor", ".2f")]))
    token_rows = per_token(forward_rows, args)
    print(f"\n2. per token at {args.tokens_per_forward} tokens per denoise forward (AR: 1)")
    print(format_table(token_rows, [("variant", "variant", ""), ("prompt", "prompt", ""), ("mode", "mode", ""),
                              ("ms_per_token", "ms/token", ".3f"), ("tokens_per_s", "tokens/s", ".1f")]))
    decode_rows = []
    if not args.skip_decode:
        decode_rows = time_decodes(variants, config, args, device)
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
                   "batch": args.batch, "block_size": args.block_size, "bandwidth_gbps": bandwidth / 1e9,
                   "torch": torch.__version__, "forward": forward_rows, "per_token": token_rows,
                   "decode": decode_rows}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0
