"""The README's "Memory and time budget per target": the real Qwen3-VL 2B text shape with random weights,
measured on this CPU per variant (peak RSS, text prefill, one Block-32 forward), then per named board the
memory-bandwidth floor per forward and per plan, projected from the measured weight bytes.

    python scripts/budget_table.py                      # all variants, each in its own process (~25 min here, <= 9 GB)
    python scripts/budget_table.py --variants bfloat16 bfloat16+int8 --prompt 128
    python scripts/budget_table.py --json budget.json   # also every number

A variant is ``DTYPE[+METHOD]``: the model built in DTYPE (activations, norms), quantized by METHOD
(engine.quantization, model/quantization.py: the decoder layers' linear layers by METHOD, the LM head and the
tied embedding int8). Each process's peak RSS is its own. A float variant runs in one process; a quantized one
in two, as it is deployed: the first quantizes at load (the random float model is built, then quantize_ replaces
its weights) and writes the quantized weights as ``wam-diff2 export --quantize`` does, the second loads them as a
quantized checkpoint loads (parameters on the meta device, filled with the stored tensors) and is measured.
``load peak`` is the process's peak up to the model being ready, ``run peak`` the peak from then on (VmHWM reset
through /proc/self/clear_refs) over the prefill and the Block-32 forwards, what a process holding the model
needs while it plans. ``process before the model`` is the same process's RSS once torch, transformers, torchao
and this package are imported, before the model is built: the interpreter and libraries, the same in every
variant. The model's own peaks are the peaks minus it; ``model's peak quantizing at load`` is the first
process's (the float model and its quantized weights). The children run with MALLOC_MMAP_THRESHOLD_ fixed at
1 MiB so that freed float weights go back to the system instead of staying in malloc's heap.

The board rows are projections, not measurements: (weight bytes read per forward + K/V bytes of ``--kv-keys``
keys in bf16) / the board's peak memory bandwidth, times ``--forwards-per-plan``. Weight bytes: measured here
for bf16 and int8; int4 as packed by a GPU kernel (4 bits a weight + a bf16 scale and zero point per group of
INT4_GROUP_SIZE), computed from the quantized layers' size, because torchao's CPU int4 format here keeps each
int4 value in an int8 byte (measured, printed beside it).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

BLOCK = 32
# Peak memory bandwidth from the vendors' data sheets, bytes/s.
BOARDS = (("Jetson AGX Orin 32 GB", 204.8e9), ("Jetson AGX Orin 64 GB", 204.8e9), ("Jetson AGX Thor", 273e9),
          ("H200 (reference)", 4.8e12))
VARIANTS = ("float32", "bfloat16", "bfloat16+int8", "bfloat16+int4")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _peak_bytes() -> int:
    """VmHWM, the process's peak RSS since the last reset (the kernel updates it lazily: at least VmRSS)."""
    return max(_status_kb("VmHWM"), _status_kb("VmRSS")) * 1024


def _settle() -> int:
    """Resident bytes once freed memory has gone back to the system; VmHWM reset to them from here on."""
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    resident = _status_kb("VmRSS") * 1024
    Path("/proc/self/clear_refs").write_text("5")
    return resident


def _prepare(variant: str, threads: int):
    """torch and every module a build, a load and a decode import, imported before the baseline is read."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import transformers.models.qwen3_vl.modeling_qwen3_vl  # noqa: F401
    import wam_diff2_core.benchmark.timing  # noqa: F401
    import wam_diff2_core.benchmark.variants  # noqa: F401
    dtype_name, _, method = variant.partition("+")
    if method:
        import torchao.prototype.safetensors.safetensors_support  # noqa: F401
        import torchao.quantization  # noqa: F401
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    torch.set_default_dtype(dtype)            # built in its dtype: no float32 copy first
    return torch, dtype, method


def export(variant: str, out: str, threads: int, shape: str) -> dict:
    """Quantize at load and write the quantized weights (``wam-diff2 export --quantize``'s file) to ``out``:
    the random float model is built, then quantize_ replaces its weights. Its load peak is quantizing at load's."""
    torch, dtype, method = _prepare(variant, threads)
    from wam_diff2_core.model.quantization import INT4_GROUP_SIZE, quantize_language_model, save_quantized_weights
    from wam_diff2_core.model.random_model import build_random_model

    baseline = _settle()
    model, _ = build_random_model(shape, torch.device("cpu"), dtype, 0, 24.0)
    report = quantize_language_model(model, method)
    peak = _peak_bytes()
    save_quantized_weights(model, Path(out))
    numel = report.float_bytes // dtype.itemsize        # int4 as a GPU kernel packs it: + a bf16 scale and zero
    return {"quantize_at_load_peak_bytes": peak, "quantize_at_load_baseline_bytes": baseline,
            "quantized_layers": report.linear_layers, "quantized_float_bytes": report.float_bytes,
            "packed_int4_bytes": numel // 2 + numel // INT4_GROUP_SIZE * 2 * 2 if method == "int4" else None,
            "quantized_bytes": report.quantized_bytes, "table_float_bytes": report.table_float_bytes,
            "table_bytes": report.table_bytes}


def measure(variant: str, prompt: int, repeats: int, threads: int, shape: str = "2b", stored: str | None = None) -> dict:
    """One variant in this process: the model (built; or, quantized, loaded from ``stored`` as a quantized
    checkpoint loads), prefill, Block-32 forwards; a dict of figures."""
    torch, dtype, method = _prepare(variant, threads)
    from wam_diff2_core.benchmark.timing import kv_bytes, weight_bytes
    from wam_diff2_core.benchmark.variants import make_variant, random_prompt
    from wam_diff2_core.model.quantization import build_without_weights, load_quantized
    from wam_diff2_core.model.random_model import build_random_model, random_model_config

    dev = torch.device("cpu")
    baseline = _settle()                      # interpreter + libraries: what every variant's process holds
    start = time.perf_counter()
    if method:
        model_config, config = random_model_config(shape)
        model = build_without_weights(model_config, dtype, "sdpa")
        load_quantized(model, Path(stored), method)
        model.eval()
    else:
        model, config = build_random_model(shape, dev, dtype, 0, 24.0)
    load_s = time.perf_counter() - start
    load_peak = _peak_bytes()
    resident = _settle()
    decoder = make_variant("static-sdpa", model, config)
    inputs = random_prompt(config.vocab_size, 1, prompt, 0, dev)
    with torch.no_grad():
        t = time.perf_counter()
        state = decoder.begin(inputs, BLOCK, answer_slots=4 * BLOCK)
        prefill_s = time.perf_counter() - t
        buf = decoder.plan_step(state, [(0, BLOCK)])
        buf.tokens.fill_(config.mask_token_id)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            decoder.forward(state, buf)
            times.append(time.perf_counter() - t)
    run_peak = _peak_bytes()
    return {"variant": variant, "shape": shape, "pid": os.getpid(), "prompt": prompt, "threads": threads,
            "load_s": load_s, "baseline_bytes": baseline, "load_peak_bytes": load_peak, "resident_bytes": resident,
            "run_peak_bytes": run_peak, "model_load_peak_bytes": load_peak - baseline,
            "model_run_peak_bytes": run_peak - baseline, "prefill_s": prefill_s,
            "block_forward_s": statistics.median(times), "block_forward_all_s": times,
            "weight_bytes": weight_bytes(model), "kv_bytes_per_key_bf16": kv_bytes(model, 1, 1) * 2 // dtype.itemsize,
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _child(args, *extra) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    cmd = [sys.executable, __file__, "--threads", str(args.threads), "--shape", args.shape, *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(extra)}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_child(variant: str, args) -> dict:
    """A float variant in one process; a quantized one quantized at load and exported in one, then loaded
    from that export and measured in another (the two load peaks: quantizing at load, a stored checkpoint)."""
    timing = ["--prompt", str(args.prompt), "--repeats", str(args.repeats)]
    if "+" not in variant:
        return _child(args, "--measure", variant, *timing)
    with tempfile.TemporaryDirectory(prefix="budget-") as stored:
        exported = _child(args, "--export", variant, "--stored", stored)
        row = _child(args, "--measure", variant, "--stored", stored, *timing)
    row.update(exported, model_quantize_at_load_peak_bytes=exported["quantize_at_load_peak_bytes"]
               - exported["quantize_at_load_baseline_bytes"])
    return row


def print_tables(rows: dict, args) -> None:
    gb = 1e9
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    first = next(iter(rows.values()))
    print(f"Measured: {cpu}, {os.cpu_count()} cores, {first['threads']} threads, random {first.get('shape', '2b')} weights, "
          f"{first['prompt']}-token text prefill, Block-{BLOCK} forward: median of {len(first['block_forward_all_s'])}")
    print("| variant | weights read / forward | process before the model | load peak RSS | run peak RSS "
          "| model's load peak | model's run peak | model's peak quantizing at load | prefill | Block-32 forward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v, r in rows.items():
        at_load = r.get("model_quantize_at_load_peak_bytes")
        print(f"| {v} | {r['weight_bytes'] / gb:.2f} GB | {r['baseline_bytes'] / gb:.2f} GB | "
              f"{r['load_peak_bytes'] / gb:.2f} GB | {r['run_peak_bytes'] / gb:.2f} GB | "
              f"{r['model_load_peak_bytes'] / gb:.2f} GB | {r['model_run_peak_bytes'] / gb:.2f} GB | "
              f"{'-' if at_load is None else f'{at_load / gb:.2f} GB'} | "
              f"{r['prefill_s']:.1f} s | {r['block_forward_s']:.2f} s |")
    bf16, int8 = rows.get("bfloat16"), rows.get("bfloat16+int8")
    if bf16 and int8:
        # Run peaks: both hold the weights resident (a stored checkpoint's are mapped from the file and read in
        # by the first forward, so its load peak is no comparison) and the target reads the model's.
        for key, label in (("model_run_peak_bytes", "model's run peak"), ("run_peak_bytes", "run peak RSS")):
            ratio = int8[key] / bf16[key]
            print(f"int8 / bf16 {label}: {ratio:.2f}x (target <= 0.55x: {'met' if ratio <= 0.55 else 'MISSED'})")
    # Projection: bytes per forward for bf16 / int8 / int4 (packed), K/V in bf16.
    sizes = {}
    if bf16:
        sizes["bf16"] = bf16["weight_bytes"]
    if int8:
        sizes["int8"] = int8["weight_bytes"]
    int4 = rows.get("bfloat16+int4")
    if int4:
        sizes["int4 (packed)"] = int4["weight_bytes"] - int4["quantized_bytes"] + int4["packed_int4_bytes"]
    if not sizes:
        return
    kv = first["kv_bytes_per_key_bf16"] * args.kv_keys
    print(f"\nProjection (not measured on a board): (weights + K/V of {args.kv_keys} keys, {kv / 1e6:.0f} MB) / "
          f"peak bandwidth; per plan = {args.forwards_per_plan} forwards")
    print("| board | bandwidth | " + " | ".join(f"{k}: {(b + kv) / gb:.2f} GB / forward, plan" for k, b in sizes.items())
          + " |")
    print("|---|---|" + "---|" * len(sizes))
    for board, bw in BOARDS:
        cells = [f"{(b + kv) / bw * 1e3:.1f} ms, {(b + kv) / bw * args.forwards_per_plan * 1e3:.0f} ms"
                 for b in sizes.values()]
        print(f"| {board} | {bw / 1e9:.0f} GB/s | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--shape", default="2b", help="bench's random-weight shape (2b: Qwen3-VL-2B's text shape)")
    parser.add_argument("--prompt", type=int, default=300, help="prefill tokens (text)")
    parser.add_argument("--repeats", type=int, default=3, help="Block-32 forwards timed (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-keys", type=int, default=1024,
                        help="projection: keys a forward reads (image + text prompt + answer so far)")
    parser.add_argument("--forwards-per-plan", type=int, default=28,
                        help="projection: denoise forwards per plan (the demo model: median 24-28 per answer)")
    parser.add_argument("--json", default=None, help="also write every number here")
    parser.add_argument("--from-json", default=None, help="print the tables of an earlier --json, measuring nothing")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stored", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure or args.export:
        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        print(json.dumps(export(args.export, args.stored, args.threads, args.shape) if args.export else
                         measure(args.measure, args.prompt, args.repeats, args.threads, args.shape, args.stored)))
        return
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())
    else:
        rows = {}
        for v in args.variants:
            rows[v] = run_child(v, args)
            print(f"{v}: done", file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print_tables(rows, args)


if __name__ == "__main__":
    main()
