"""The device check of the fast decoding paths, part by part, then one table (scripts/device_check.sh runs each
part as its own process under its own time bound, then ``--summary``).

    scripts/device_check.sh                                                 # on a GPU machine: the 2B shape, bf16
    wam-diff2 verify-device --device cpu --shape tiny --prompt-length 64    # the same code on CPU (CI)
    wam-diff2 verify-device --summary OUT                                   # the table of what a run left in OUT

Parts (``--parts``; with ``--out`` each writes ``<out>/<part>.jsonl``, a row as it is measured):
0. probe: versions, SDPA with a boolean mask in bf16, the pinned step SDPA, the token choice under the capture
   rules (benchmark/device_probe.py);
1. tokens: every fast variant the device has against the plain decoder on a head_dim-128 random model
   (benchmark/token_check.py: float32 identical, bf16 teacher-forced; a graphed row fails on a graph fallback);
2. forward: ms of one denoise forward of the ``--shape`` model at Block-32 and AR (plain, static eager, static
   in CUDA graphs) beside the memory floor, graphs / eager, and the kernels each launches;
3. decode: a greedy Block-32 decode of the default fast path at each ``mask_check_interval``;
4. frame: the policy's warm-up, then ``--frames`` camera frames -> trajectories with each stage's time, then
   ``--candidates`` N plan rows per frame;
5. profile: one graphed forward's replay ms and its eager twin's kernels by class, per SDPA pin order;
6. compiled: the compiled forward (``--compile-mode``): its token check and graphed forward, compile times;
7. quant: the token check and forward timings on quantized weights (``--quantization``).

Targets (met on the device, not in CI) are printed beside the figures; token mismatches, graph fallbacks and a
probe row NO fail (exit status 1).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

from ..benchmark import device_timing as parts_of
from ..benchmark.device_probe import flashinfer_version, probe, torchao_version
from ..benchmark.device_timing import DeviceCheck
from ..benchmark.kernel_count import FORWARD_TARGET
from ..benchmark.token_check import check_tokens
from ..config import COMPILE_MODES, QUANTIZATIONS
from .common import format_table, hardware_name

HELP = "verify the fast decoding paths on this device (tokens vs plain) and print the one table"
PARTS = ("probe", "tokens", "forward", "decode", "frame", "profile", "compiled", "quant")

# the device's targets: a graphed forward within 2x the memory floor (a compiled + graphed one 1.5x), graphs at least
# 2x eager, a verify decode at 0.5 ms/token, a 1080p frame at 50 ms (p50); kernels: benchmark/kernel_count.py
TARGETS = {"x_floor": 2.0, "x_floor_compiled": 1.5, "graph_speedup": 2.0, "ms_per_token": 0.5, "frame_p50_ms": 50.0}


def add_arguments(p) -> None:
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu", "npu"))
    p.add_argument("--shape", default=DeviceCheck.shape, choices=("2b", "small", "tiny"),
                   help="the benchmarked model's shape")
    p.add_argument("--prompt-length", type=int, default=DeviceCheck.prompt_length,
                   help="prompt tokens before the timed forwards")
    p.add_argument("--repeats", type=int, default=DeviceCheck.repeats)
    p.add_argument("--frames", type=int, default=DeviceCheck.frames, help="camera frames timed through DrivingPolicy")
    p.add_argument("--candidates", type=int, nargs="*", default=DeviceCheck.candidates,
                   help="plan candidate counts N > 1 also timed through DrivingPolicy (default none)")
    p.add_argument("--frame-size", type=int, nargs=2, default=DeviceCheck.frame_size, metavar=("WIDTH", "HEIGHT"),
                   help="the camera frame (CI: a small one)")
    p.add_argument("--new-tokens", type=int, default=DeviceCheck.new_tokens,
                   help="tokens of the timed decode (and at most 96 per frame)")
    p.add_argument("--check-tokens", type=int, default=DeviceCheck.check_tokens,
                   help="tokens per answer in the token checks")
    p.add_argument("--out", default=None, help="write <part>.jsonl (rows as measured) and verify.json here (a folder)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--quantization", nargs="+", default=DeviceCheck.quantization, choices=QUANTIZATIONS[1:],
                   help=f"the quant part's methods (engine.quantization; default {' '.join(DeviceCheck.quantization)})")
    p.add_argument("--compile-mode", default=DeviceCheck.compile_mode, choices=COMPILE_MODES,
                   help="the compiled part's Inductor mode (engine.compile_mode)")
    p.add_argument("--summary", default=None, metavar="OUT",
                   help="print the table of the rows a run left in OUT (its <part>.jsonl) and exit")
    p.add_argument("--perturb-token", action="store_true",
                   help="test hook: change one token of the first fast decode (the check must then fail)")


def _failed(part: str, rows: list[dict]) -> bool:
    if part == "probe":
        return any(r.get("ok") == "NO" for r in rows)
    if part in ("tokens", "compiled", "quant"):
        return any("FAIL" in str(r.get("note", "")) for r in rows)
    if part == "decode":
        agreement = [r["plain_agreement"] for r in rows if "plain_agreement" in r]
        float32 = any(r.get("dtype") == "float32" for r in rows)
        return any(r.get("same_tokens") is False for r in rows) or (float32 and agreement and agreement[0] < 1.0)
    return False


def summary_rows(parts: dict[str, list[dict]]) -> list[dict]:
    """The one table from each part's rows: each figure with its target and whether it is met."""
    rows = []
    skipped = {part: r["skipped"] for part, part_rows in parts.items() if part != "quant"
               for r in part_rows if "skipped" in r}
    parts = {part: [r for r in part_rows if part == "quant" or "skipped" not in r] for part, part_rows in parts.items()}
    for part in ("forward", "compiled", "quant"):        # each forward row with its kernels, counted after the timings
        kernels = {(r["kernels_of"], r["step"]): r for r in parts.get(part, []) if "kernels_of" in r}
        parts[part] = [{**r, **{k: kernels[(r["variant"], r["step"])][k] for k in ("kernels", "layer_kernels")}}
                       if "ms" in r and (r["variant"], r["step"]) in kernels else r
                       for r in parts.get(part, []) if "kernels_of" not in r]

    def add(what, value, target=None, met=None):
        rows.append({"what": what, "value": value, "target": target or "-",
                     "met": "-" if met is None else ("yes" if met else "NO")})

    def forward(r, prefix=""):
        graphed = r["variant"].endswith("-graph")           # real CUDA graphs (not the emulated ones)
        target = TARGETS["x_floor_compiled" if "-compiled" in r["variant"] else "x_floor"]
        layer_ops = f", layer ops {r['layer_kernels']}" if r.get("layer_kernels", "-") != "-" else ""
        add(f"{prefix}{r['variant']} {r['step']} forward", f"{r['ms']:.3f} ms = {r['x_floor']:.2f}x floor "
            f"{r['floor_ms']:.3f}, {r.get('kernels', '-')} kernels{layer_ops}",
            f"<= {target}x floor" if graphed else None, r["x_floor"] <= target if graphed else None)
        if r["variant"] != "plain" and isinstance(r.get("kernels"), int) and r["step"] == "Block-32":
            add(f"{prefix}{r['variant']} Block-32 kernels", str(r["kernels"]), f"<= {FORWARD_TARGET}",
                r["kernels"] <= FORWARD_TARGET)
        if r.get("x_uncompiled", "-") != "-":
            add(f"{prefix}{r['variant']} {r['step']} compiled / uncompiled", f"{r['x_uncompiled']:.2f}x")
        if "-graph" in r["variant"] and r.get("graph_speedup", "-") != "-":
            add(f"{prefix}{r['variant']} {r['step']} graphs / eager", f"{r['graph_speedup']:.2f}x",
                f">= {TARGETS['graph_speedup']}x", r["graph_speedup"] >= TARGETS["graph_speedup"])

    def tokens(label, token_rows):
        bad = [r for r in token_rows if "FAIL" in r["note"]]
        add(label, f"{len(token_rows) - len(bad)}/{len(token_rows)} rows agree",
            "float32 identical, bf16 no clear flip, no graph fallback", not bad)

    for part, why in skipped.items():
        add(part, f"skipped: {why}")
    for r in parts.get("forward", []) + parts.get("compiled", []):
        if "warmup_of" in r:
            add(f"{r['warmup_of']} warm-up (graphs captured)", f"{r['seconds']:.1f} s")
    if parts.get("probe"):
        bad = [r["what"] for r in parts["probe"] if r["ok"] == "NO"]
        add("probe", f"{len(parts['probe']) - len(bad)}/{len(parts['probe'])} rows ok" + (f" (NO: {bad})" if bad else ""),
            "every row ok", not bad)
    if parts.get("tokens"):
        tokens("fast tokens vs plain", parts["tokens"])
    for r in parts.get("forward", []):
        if "ms" in r:
            forward(r)
    sweep = [r for r in parts.get("decode", []) if "interval" in r]
    if sweep:
        default = next((r for r in sweep if r["default"]), sweep[0])
        add(f"Block-32 decode ({default['variant']})", f"{default['tokens_per_forward']:.2f} tokens/forward, "
            f"{default['ms_per_token']:.3f} ms/token", f"<= {TARGETS['ms_per_token']} ms/token",
            default["ms_per_token"] <= TARGETS["ms_per_token"])
        best = min(sweep, key=lambda r: r["ms_per_token"])
        add("mask_check_interval sweep", ", ".join(f"{r['interval']}: {r['ms_per_token']:.3f}" for r in sweep)
            + f" ms/token (fastest {best['interval']})", "same tokens at every interval",
            all(r["same_tokens"] for r in sweep))
        agreement = [r["plain_agreement"] for r in parts["decode"] if "plain_agreement" in r]
        if agreement:
            add("decode tokens as plain's", f"{agreement[0]:.1%}", "100% in float32")
    frames = parts.get("frame", [])
    for r in frames:
        if "warmup_s" in r:
            add("policy warm-up (graphs captured)", f"{r['warmup_s']:.1f} s ({r['decoder']}, layer ops {r['layer_kernels']})")
    timed = [r for r in frames if "frame" in r]
    if timed:
        ms = sorted(r["ms"] for r in timed)
        p50 = statistics.median(ms)
        add(f"{timed[0]['size']} frame -> trajectory", f"p50 {p50:.1f} ms, p95 {ms[round(0.95 * (len(ms) - 1))]:.1f} ms",
            f"p50 <= {TARGETS['frame_p50_ms']} ms", p50 <= TARGETS["frame_p50_ms"])
        stages = [k for k in timed[0] if k.endswith("_ms") and k not in ("total_ms",)]
        add("frame stages (p50 ms)", ", ".join(f"{k[:-3]} {statistics.median(r[k] for r in timed):.1f}" for k in stages))
        for r in frames:
            if "candidates" in r:
                add(f"{timed[0]['size']} frame, {r['candidates']} candidates", f"p50 {r['p50_ms']:.1f} ms = "
                    f"{r['p50_ms'] / p50:.2f}x one candidate ({(r['p50_ms'] - p50) / (r['candidates'] - 1):.1f} ms "
                    "per added row)")
    for r in parts.get("profile", []):
        busy = ", ".join(f"{k.removeprefix('busy_ms ')} {v:.3f}" for k, v in r.items() if k.startswith("busy_ms "))
        timing = f"replay {r['replay_ms']:.3f} ms" if "replay_ms" in r else f"eager {r['eager_ms']:.3f} ms"
        add(f"profile, SDPA pin {r['sdpa_pin']}", f"{timing}; {r['kernels_dispatched']} kernels dispatched, "
            f"{r['gpu_kernels']} on the GPU, busy {r['gpu_busy_ms']:.3f} ms" + (f" ({busy})" if busy else ""))
    compiled = parts.get("compiled", [])
    if compiled:
        tokens("compiled forward tokens vs plain", [r for r in compiled if "note" in r])
        for r in compiled:
            if "ms" in r and "-compiled" in r["variant"]:
                forward(r)
            if "check" in r:
                add(f"compiled: {r['check']}", f"{r['seconds']:.0f} s")
    quant = parts.get("quant", [])
    for method in dict.fromkeys(r["method"] for r in quant):
        mine = [r for r in quant if r["method"] == method]
        skipped = [r for r in mine if "skipped" in r]
        if skipped:
            add(f"quantized {method}", f"skipped: {skipped[0]['skipped']}")
            continue
        tokens(f"{method} fast tokens vs plain (same quantized weights)", [r for r in mine if "note" in r])
        for r in mine:
            if "ms" in r:
                vs = f", {r['x_unquantized']:.2f}x unquantized" if r["x_unquantized"] != "-" else ""
                add(f"{method} {r['variant']} {r['step']} forward",
                    f"{r['ms']:.3f} ms = {r['x_floor']:.2f}x floor {r['floor_ms']:.3f}{vs}")
    return rows


def read_parts(out: Path) -> dict[str, list[dict]]:
    return {part: parts_of.Rows.read(out / f"{part}.jsonl") for part in PARTS if (out / f"{part}.jsonl").exists()}


def print_summary(parts: dict[str, list[dict]], heading: str) -> bool:
    print(f"\nverify-device summary ({heading})")
    print(format_table(summary_rows(parts), [("what", "what", ""), ("value", "value", ""), ("target", "target", ""),
                                              ("met", "met", "")]))
    return not any(_failed(part, rows) for part, rows in parts.items())


def run(args) -> int:
    if args.summary:
        ok = print_summary(read_parts(Path(args.summary)), args.summary)
        print(f"\nverify-device: {'every check passed' if ok else 'FAILED (see the rows marked FAIL / NO)'}")
        return 0 if ok else 1
    import torch

    from ..candidate_selection import MAX_CANDIDATES
    from ..model.devices import resolve_device, resolve_dtype

    bad = [n for n in args.candidates if not 2 <= n <= MAX_CANDIDATES]
    if bad:
        print(f"verify-device: --candidates {bad}: each count must lie in 2..{MAX_CANDIDATES} (1 is the frame row)")
        return 2
    device = resolve_device(args.device)
    dtype = resolve_dtype("bfloat16" if device.type != "cpu" else "float32", device)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(DeviceCheck) if hasattr(args, f.name)}
    check = DeviceCheck(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    heading = (f"{device} ({hardware_name(device)}), torch {torch.__version__}, flashinfer {flashinfer_version()}, "
               f"torchao {torchao_version()}, shape {args.shape} {str(dtype).replace('torch.', '')}")
    print(f"verify-device: {heading}")
    out = Path(args.out) if args.out else None
    parts, ok, t0 = {}, True, time.perf_counter()

    def tokens_part(d, t, c, rows):
        return check_tokens(d, args.perturb_token, c.check_tokens, on_row=rows.add)[1]

    def quant_part(d, t, c, rows):      # beside the forward part's rows, of this process or an earlier one
        unquantized = parts.get("forward") or read_parts(out).get("forward", []) if out else parts.get("forward", [])
        return all([parts_of.check_quantized(d, t, c, method, rows, unquantized) for method in c.quantization])

    def probe_part(d, t, c, rows):
        return probe(d, rows)
    runners = {"probe": probe_part, "tokens": tokens_part, "forward": parts_of.time_block_forwards, "decode": parts_of.measure_decode,
               "frame": parts_of.measure_frames, "profile": parts_of.profile_forward,
               "compiled": parts_of.measure_compiled, "quant": quant_part}
    for part in [p for p in PARTS if p in args.parts]:
        started = time.perf_counter()
        rows = parts_of.Rows(part, out)
        try:
            part_ok = runners[part](device, dtype, check, rows)
        except ImportError as exc:          # Pillow / jinja2 / torchvision / torchao not on the machine
            rows.add({"skipped": f"{exc} (a package this part needs is missing on this machine)"})
            part_ok = True
        ok &= bool(part_ok) and not _failed(part, rows.rows)
        parts[part] = rows.rows
        print(f"\n{part} ({time.perf_counter() - started:.0f} s)")
        for r in rows.rows:
            print("  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    ok = print_summary(parts, heading) and ok
    seconds = time.perf_counter() - t0
    if out is not None:
        (out / "verify.json").write_text(json.dumps({"heading": heading, "ok": ok, "seconds": seconds, **parts},
                                                    indent=2, default=str) + "\n")
    print(f"\nverify-device: {'every check passed' if ok else 'FAILED (see the rows marked FAIL / NO)'} ({seconds:.0f} s)")
    return 0 if ok else 1

