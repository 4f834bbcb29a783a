"""The parts of the device check (``wam-diff2 verify-device``, scripts/device_check.sh) under one
:class:`DeviceCheck`, each writing its rows as they are measured (:class:`Rows`), so a part stopped at its time
bound leaves what it had. The parts, each function's docstring saying what it measures: ``forward``
(:func:`time_block_forwards`), ``decode`` (:func:`measure_decode`), ``frame`` (:func:`measure_frames`),
``profile`` (:func:`profile_forward`), ``compiled`` (:func:`measure_compiled`), ``quant``
(:func:`check_quantized`).

    rows = Rows("forward", Path("out"))
    ok = time_block_forwards(device, torch.bfloat16, DeviceCheck(), rows)
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..candidate_selection import CandidateSettings
from ..config import ConfigError, DiffusionConfig
from ..geometry import EgoMotion
from ..model.prompt_encoding import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
from ..model.random_model import SHAPES, VISION_2B, build_random_model
from .kernel_count import add_kernel_counts, count_kernels
from .timing import ForwardBench, interleaved_times, measure_bandwidth, time_forwards
from .token_check import check_tokens
from .variants import available_variants, make_variant, random_prompt

INTERVALS = (1, 2, 4, 8)   # mask_check_interval values the decode is timed at (the default among them)


@dataclass(frozen=True)
class DeviceCheck:
    """What the device check measures (``verify-device``'s options)."""

    shape: str = "2b"                       # the timed model's shape (model/random_model.py)
    prompt_length: int = 2048               # prompt tokens before the timed forwards and decodes
    repeats: int = 20                       # timed runs per measurement (median)
    frames: int = 10                        # camera frames timed through DrivingPolicy
    frame_size: tuple[int, int] = (1920, 1080)
    candidates: tuple[int, ...] = ()        # plan candidate counts N > 1 also timed per frame
    new_tokens: int = 128                   # tokens of the timed decode (at most 96 per frame)
    check_tokens: int = 64                  # tokens per answer in the token checks
    quantization: tuple[str, ...] = ("int8",)
    compile_mode: str = "default"           # the compiled part's Inductor mode (engine.compile_mode)
    seed: int = 0

    def bench(self) -> ForwardBench:
        return ForwardBench(prompt_lengths=(self.prompt_length,), block_size=32, batch=1, seed=self.seed,
                            repeats=self.repeats)


class Rows:
    """A part's rows, in memory and appended to ``<out>/<part>.jsonl`` (flushed) as each is measured."""

    def __init__(self, part: str, out: Path | None = None):
        self.part, self.rows = part, []
        self.path = None if out is None else Path(out) / f"{part}.jsonl"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        return row

    @staticmethod
    def read(path: Path) -> list[dict]:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def eager_twin(variant: str) -> str:
    """The eager, uncompiled variant a graphed one is compared with (graphs / eager)."""
    return variant.removesuffix("-emulated").removesuffix("-graph").replace("-compiled", "")


def _timed_model(device, dtype, check: DeviceCheck):
    """(model, config at Block-32): the random model of ``check.shape`` that the parts time."""
    model, config = build_random_model(check.shape, device, dtype, check.seed, 24.0)
    return model, config.with_settings(block_size=32)


def _timed_variants(model, config, names) -> dict:
    variants = {}
    for name in names:
        try:
            variants[name] = make_variant(name, model, config)
        except Exception as exc:  # noqa: BLE001 - a variant that cannot start here is left out, with the reason
            print(f"variant {name} skipped: {type(exc).__name__}: {exc}")
    return variants


def forward_rows(model, config, device, variants: dict, check: DeviceCheck, rows: Rows,
                 bandwidth: float | None = None) -> list[dict]:
    """Block-32 and AR forwards of ``variants``: graphed ones warmed first (a row each with its seconds), then
    the timings (graphs / eager against the eager twin when it was timed too), saved before the kernels are
    counted (a row each: ``kernels_of``); returns the timing rows with their kernels."""
    bench = check.bench()
    for name, decoder in variants.items():
        if "-graph" in name:
            t0 = time.perf_counter()
            decoder.warmup(batch_sizes=(1,), prompt_tokens=check.prompt_length,
                           settings=config.settings.replace(block_size=32))
            rows.add({"warmup_of": name, "seconds": time.perf_counter() - t0})
    timed = [r for r in time_forwards(variants, model, config, bench, device, bandwidth or measure_bandwidth(device))
             if r["queries"] <= 32]
    ms = {(r["variant"], r["step"]): r["ms"] for r in timed}
    for r in timed:
        eager = ms.get((eager_twin(r["variant"]), r["step"]))
        r["graph_speedup"] = eager / r["ms"] if "-graph" in r["variant"] and eager else "-"
        uncompiled = ms.get((r["variant"].replace("-compiled", ""), r["step"]))
        r["x_uncompiled"] = r["ms"] / uncompiled if "-compiled" in r["variant"] and uncompiled else "-"
        rows.add(dict(r))
    add_kernel_counts(timed, variants, config, bench, device)
    for r in timed:
        rows.add({"kernels_of": r["variant"], "step": r["step"], "kernels": r["kernels"],
                  "layer_kernels": r["layer_kernels"]})
    return timed


def time_block_forwards(device, dtype, check: DeviceCheck, rows: Rows) -> bool:
    """The forward part: the 2B-shaped model's forwards, plain / static eager / static graphed side by side."""
    model, config = _timed_model(device, dtype, check)
    names = [v for v in available_variants(device) if "-compiled" not in v]
    forward_rows(model, config, device, _timed_variants(model, config, names), check, rows)
    return True


def measure_decode(device, dtype, check: DeviceCheck, rows: Rows) -> bool:
    """The decode part: a greedy Block-32 decode of ``new_tokens`` (EOS banned) by the path a node runs by default
    (the last graphed variant, not compiled): tokens per forward and ms per token at each ``mask_check_interval``
    of ``INTERVALS`` (fewer host reads against idle steps); the tokens must not change, and in float32 equal the
    plain decoder's (a last row: the agreement)."""
    from ..policy import token_agreement

    model, config = _timed_model(device, dtype, check)
    name = [v for v in available_variants(device) if v != "plain" and "-compiled" not in v][-1]
    decoder, plain = make_variant(name, model, config), make_variant("plain", model, config)
    inputs = random_prompt(config.vocab_size, 1, check.prompt_length, check.seed + 1, device)
    base = config.settings.replace(block_size=32, denoising_steps=32, max_new_tokens=check.new_tokens)
    reference, ok, dtype_name = None, True, str(dtype).removeprefix("torch.")
    for interval in sorted({*INTERVALS, base.mask_check_interval}):
        settings = base.replace(mask_check_interval=interval)
        decoder.generate(inputs, settings)                                       # warm
        outs = [decoder.generate(inputs, settings) for _ in range(max(1, check.repeats // 4))]
        s = outs[-1].stats[0]
        reference = reference if reference is not None else outs[-1].sequences[0]
        same = outs[-1].sequences[0] == reference
        ok &= same
        rows.add({"variant": name, "dtype": dtype_name, "interval": interval,
                  "default": interval == base.mask_check_interval, "same_tokens": same, "tokens": s.tokens,
                  "forwards": s.forwards, "tokens_per_forward": s.tokens / max(1, s.forwards),
                  "ms_per_token": statistics.median(o.stats[0].denoise_ms + o.stats[0].commit_ms for o in outs)
                  / max(1, s.tokens), "prefill_ms": statistics.median(o.stats[0].prefill_ms for o in outs)})
    same, total, _ = token_agreement([reference], plain.generate(inputs, base).sequences)
    agreement = same / max(1, total)
    rows.add({"variant": name, "dtype": dtype_name, "plain_agreement": agreement})
    return ok and (dtype_name != "float32" or agreement == 1.0)


def frame_policy(device, dtype, check: DeviceCheck, candidates: int = 1):
    """A DrivingPolicy over a random model of ``check.shape`` with the Qwen token layout and, for ``2b``, the real
    vision tower's shape (a random model's answers do not parse: this times the decode, not the parsing)."""
    from ..model.checkpoint import LoadedModel
    from ..model.tiny import build_processor, build_tokenizer
    from ..policy import DrivingPolicy

    tokenizer = build_tokenizer(check.seed, qwen_layout=True)
    ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    dims = {**SHAPES[check.shape], "vocab_size": 151936}                     # the Qwen id layout
    model, _ = build_random_model(dims, device, dtype, check.seed, 24.0, token_ids=ids,
                                  vision=VISION_2B if check.shape == "2b" else None)
    processor = build_processor(tokenizer, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=DEFAULT_MAX_PIXELS)
    config = DiffusionConfig.resolve(None, tokenizer, model.config, {"max_new_tokens": min(96, check.new_tokens)},
                                     checkpoint_format="wam_diff2")
    loaded = LoadedModel(model=model, processor=processor, config=config, path=Path("random-" + check.shape),
                         device=device, dtype=dtype)
    return DrivingPolicy(loaded, parse_retry="none", candidates=CandidateSettings(count=candidates))


def measure_frames(device, dtype, check: DeviceCheck, rows: Rows) -> bool:
    """The frame part: the policy's warm-up (as the node's configure runs it), then ``frames`` camera frames ->
    trajectories, one row each with its stage times; then per candidate count N one row, N rows in one batched
    decode (its p50 beside one candidate's)."""
    width, height = check.frame_size
    frame = np.random.default_rng(check.seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ego = EgoMotion((5.0, 0.0), (0.0, 0.0))
    policy = frame_policy(device, dtype, check)
    t0 = time.perf_counter()
    policy.warmup()
    rows.add({"warmup_s": time.perf_counter() - t0, "decoder": policy.decoder.__class__.__name__,
              "layer_kernels": getattr(getattr(policy.decoder, "layer_kernels", None), "name", "-")})
    policy.step(frame, ego, "straight")                                      # the frame's shapes, once
    for i in range(check.frames):
        out = policy.step(frame, ego, "straight")
        rows.add({"frame": i, "size": f"{width}x{height}", "ms": out.latency_ms, "tokens": out.plan.stats.tokens,
                  **{k: v for k, v in out.stages.as_dict().items() if k.endswith("_ms")}})
    for count in check.candidates:
        many = frame_policy(device, dtype, check, candidates=count)
        many.warmup()
        many.step(frame, ego, "straight")
        rows.add({"candidates": count, "p50_ms": statistics.median(many.step(frame, ego, "straight").latency_ms
                                                                   for _ in range(check.frames))})
    return True


def profile_forward(device, dtype, check: DeviceCheck, rows: Rows) -> bool:
    """The profile part: for each order of the SDPA pin (memory-efficient first, cuDNN first), one Block-32
    forward's graph replay ms (median of ``repeats``; eager off CUDA) and the kernels of its eager twin under
    torch.profiler: count, GPU-busy ms, and busy ms by class. Replay ms minus busy ms is what a graph spends
    between kernels; the faster order is the one to keep in attention.SDPA_STEP_BACKENDS."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.profiler import ProfilerActivity, profile

    from ..decoding import attention as attention_module
    from ..decoding.step import forward_step

    cuda = device.type == "cuda"
    model, config = _timed_model(device, dtype, check)
    inputs = random_prompt(config.vocab_size, 1, check.prompt_length, check.seed, device)
    orders = {"efficient,cudnn": (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION),
              "cudnn,efficient": (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)} if cuda else {"-": None}
    kept = attention_module.SDPA_STEP_BACKENDS.get("cuda")
    try:
        for label, order in orders.items():
            if order is not None:
                attention_module.SDPA_STEP_BACKENDS["cuda"] = order
            decoder = make_variant("static-sdpa-graph" if cuda else "static-sdpa", model, config)
            with torch.no_grad():
                state = decoder.begin(inputs, 32, answer_slots=128)
                buf = decoder.plan_step(state, [(0, 32)])
                buf.tokens.fill_(config.mask_token_id)
                replay_ms = interleaved_times({"f": lambda: decoder.forward(state, buf)}, device, check.repeats)["f"][0]
                eager = lambda: forward_step(decoder.text, state.run.cache, decoder.attention, buf)  # noqa: E731
                dispatched = count_kernels(eager).total
                with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
                    eager()
                    if cuda:
                        torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy: dict[str, float] = {}
            for e in kernels:
                busy[_kernel_class(e.name)] = busy.get(_kernel_class(e.name), 0.0) + e.time_range.elapsed_us() / 1e3
            rows.add({"sdpa_pin": label, "replay_ms" if cuda else "eager_ms": replay_ms, "kernels_dispatched": dispatched,
                      "gpu_kernels": len(kernels), "gpu_busy_ms": sum(busy.values()),
                      **{f"busy_ms {k}": v for k, v in sorted(busy.items())}})
    finally:
        if kept is not None:
            attention_module.SDPA_STEP_BACKENDS["cuda"] = kept
    return True


# a GPU kernel's class by what its name contains, the first class that matches
KERNEL_CLASSES = (("gemm", ("gemm", "gemv", "cutlass", "xmma", "splitk", "cublas", "nvjet")),
                  ("attention", ("fmha", "attention", "flash", "cudnn", "sdpa")),
                  ("fused ops (triton)", ("_kernel", "triton")),
                  ("copy/index", ("index", "scatter", "gather", "copy", "cat", "fill")),
                  ("reduce", ("reduce", "softmax")))


def _kernel_class(name: str) -> str:
    n = name.lower()
    return next((label for label, parts in KERNEL_CLASSES if any(s in n for s in parts)), "elementwise/other")


def measure_compiled(device, dtype, check: DeviceCheck, rows: Rows) -> bool:
    """The compiled part: the compiled forward's token check (Block-32 greedy, single sequences, the compile time
    in its row), then its Block-32 forward in CUDA graphs (emulated off CUDA) beside the uncompiled graphed one."""
    compiled = ["static-sdpa-compiled-graph" if device.type == "cuda" else "static-sdpa-compiled-graph-emulated"]
    t0 = time.perf_counter()
    _, ok = check_tokens(device, False, check.check_tokens, variants=compiled, on_row=rows.add,
                         compile_mode=check.compile_mode)
    rows.add({"check": "token check with compiles", "seconds": time.perf_counter() - t0})
    model, config = _timed_model(device, dtype, check)
    variants = {name: make_variant(name, model, config, compile_mode=check.compile_mode)
                for name in compiled + [v.replace("-compiled", "") for v in compiled]}
    t0 = time.perf_counter()
    forward_rows(model, config, device, variants, check, rows)
    rows.add({"check": "forward rows with compiles", "seconds": time.perf_counter() - t0})
    return ok


def check_quantized(device, dtype, check: DeviceCheck, method: str, rows: Rows,
                    unquantized: list[dict] = ()) -> bool:
    """The quant part for one method: the token check on quantized weights, then the forward timings of the
    ``shape`` model quantized, each beside the same variant's unquantized ms (``unquantized``: the forward part's
    rows, when that part ran). A missing torchao is a skipped row with the reason, not a failure (the machine
    may lack it; device_check.sh carries its wheel from gpu_wheels/)."""
    from ..model.quantization import quantize_language_model, require_torchao

    try:
        require_torchao(method)
    except ConfigError as exc:
        rows.add({"method": method, "skipped": str(exc)})
        return True
    _, ok = check_tokens(device, False, check.check_tokens, quantization=method,
                         on_row=lambda r: rows.add({"method": method, **r}))
    model, config = _timed_model(device, dtype, check)
    report = quantize_language_model(model, method)
    rows.add({"method": method, "weights": report.describe()})
    names = [v for v in available_variants(device) if v != "plain" and "flashinfer" not in v and "-compiled" not in v]
    before = {(r["variant"], r["step"]): r["ms"] for r in unquantized if "ms" in r}
    timed = forward_rows(model, config, device, _timed_variants(model, config, names), check, Rows("scratch"))
    for r in timed:
        r["x_unquantized"] = r["ms"] / before[(r["variant"], r["step"])] if (r["variant"], r["step"]) in before else "-"
        rows.add({"method": method, **r})
    return ok
