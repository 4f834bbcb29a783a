"""Decoding speed: ms of one forward beside its memory-bandwidth floor, ms per token, whole decodes.

What ``wam-diff2 bench`` (random weights or a checkpoint, random text prompts) and ``verify-device``
measure, under one :class:`ForwardBench`; the command lines choose the variants and print the tables.

    rows = time_forwards(decoders, model, config, ForwardBench(prompt_lengths=(1024,)), device, measure_bandwidth(device))
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..profiling import StageTimes, stage_summary
from .variants import random_prompt


@dataclass(frozen=True)
class ForwardBench:
    """What the forward, per-token and decode tables measure."""

    prompt_lengths: tuple[int, ...] = (1024, 2048)
    block_size: int = 32            # the Block-B compared with AR
    batch: int = 1
    seed: int = 0
    repeats: int = 10               # timed runs per measurement (median)
    tokens_per_forward: float = 4.0  # the per-token table's answer tokens per denoise forward
    new_tokens: int = 64            # tokens per decode in the decode table


def interleaved_times(fns: dict, device, repeats: int, warmup: int = 2) -> dict:
    """(median, min) ms of each callable, timed round-robin (A B C A B C ...) so that every one sees
    the same machine state: fair side-by-side numbers on a shared or throttling machine. The device is
    synchronised before and after each timed call."""
    from ..decoding.common import PhaseTimer

    sync = PhaseTimer(device).sync
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[key].append((time.perf_counter() - t0) * 1e3)
    return {key: (statistics.median(t), min(t)) for key, t in times.items()}


def measure_bandwidth(device) -> float:
    """Device memory bandwidth in bytes/s: a large copy reads and writes every byte once."""
    import torch
    size = (1 << 30) if device.type != "cpu" else (256 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms, _ = interleaved_times({"copy": lambda: dst.copy_(src)}, device, repeats=5)["copy"]
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


def step_shapes(size: int, fused: bool = True) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """(label, queries, response segments) of the step shapes a benchmark times: AR (1 query), Block-B, and
    the static path's fused commit + step (2B queries)."""
    shapes = [("AR", 1, [(0, 1)]), (f"Block-{size}", size, [(0, size)])]
    return shapes + [(f"fused commit+step ({2 * size} q)", 2 * size, [(0, size), (size, size)])] if fused else shapes


def forward_steps(name, decoder, config, bench: ForwardBench, device, length: int) -> list[tuple[dict, object]]:
    """(row, callable) per step shape after a prompt of ``length``: AR (1 query), block (B), and for
    the static path the fused commit + step (2B). Each callable runs one forward."""
    import torch
    size, batch = bench.block_size, bench.batch
    inputs = random_prompt(config.vocab_size, batch, length, bench.seed, device)
    steps = []
    with torch.no_grad():
        if name == "plain":
            prefix = decoder.prefill(inputs, size)
            block = torch.full((batch, size), config.mask_token_id, device=device)
        else:
            state = decoder.begin(inputs, size, answer_slots=4 * size)
        for label, queries, segments in step_shapes(size, fused=name != "plain"):
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


def time_forwards(variants: dict, model, config, bench: ForwardBench, device, bandwidth) -> list[dict]:
    """Median ms of one forward per (variant, prompt length, step shape), variants interleaved."""
    rows = []
    for length in bench.prompt_lengths:
        steps = [step for name, decoder in variants.items()
                 for step in forward_steps(name, decoder, config, bench, device, length)]
        times = interleaved_times({i: fn for i, (_, fn) in enumerate(steps)}, device, bench.repeats)
        for i, (row, _) in enumerate(steps):
            floor = (weight_bytes(model) + kv_bytes(model, row["keys"], bench.batch)) / bandwidth * 1e3
            median, fastest = times[i]
            rows.append({**row, "ms": median, "min_ms": fastest, "floor_ms": floor, "x_floor": median / floor})
    return rows


def per_token(forward_rows: list[dict], bench: ForwardBench) -> list[dict]:
    """ms/token and tokens/s from per-forward medians at ``bench.tokens_per_forward``."""
    size, tpf, out = bench.block_size, bench.tokens_per_forward, []
    by_key = {(r["variant"], r["prompt"], r["queries"]): r["ms"] for r in forward_rows}
    for (variant, prompt, queries), ms in by_key.items():
        if queries == 1:
            ms_token, mode = ms, "AR"
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
                    "tokens_per_s": 1e3 / ms_token * bench.batch})
    return out


def time_decodes(variants: dict, config, bench: ForwardBench, device) -> list[dict]:
    """Whole generate() calls on the same prompts, AR and Block-B, variants interleaved."""
    import torch
    rows = []
    for length in bench.prompt_lengths:
        inputs = random_prompt(config.vocab_size, bench.batch, length, bench.seed + 1, device)
        for block in (1, bench.block_size):
            settings = config.settings.replace(block_size=block, denoising_steps=block,
                                               max_new_tokens=bench.new_tokens)
            outs = {name: [] for name in variants}
            fns = {name: (lambda d=decoder, o=outs[name]: o.append(d.generate(inputs, settings)))
                   for name, decoder in variants.items()}
            with torch.no_grad():
                times = interleaved_times(fns, device, bench.repeats, warmup=1)
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
                for o in outs[name][-bench.repeats:]:          # the timed calls, not the warm-up
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
