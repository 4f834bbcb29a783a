"""The one device check of the fast decoding paths (what ``scripts/gpu_verify.sh`` runs), then one table.

    scripts/gpu_verify.sh                                    # on a GPU machine: the 2B shape, bf16
    wam-diff2 verify-device --device cpu --shape tiny        # the same code on CPU (CI)

1. tokens: every fast variant the device has (static eager, CUDA graphs, the compiled forward in CUDA graphs,
   FlashInfer eager and with graphs; off CUDA the graphed paths, plain and compiled, with emulated graphs)
   against the plain decoder on the same prompts
   (greedy and seeded sampling, Block-32 and AR; each variant warmed up, then two calls per batch size with
   other prompt lengths in the same key-span bucket) on a random model with head_dim 128 (the size of the
   2B and 8B models, and of FlashInfer's prebuilt kernels): float32 must be identical; bf16 reports the
   free-running agreement and gates on a teacher-forced check (plain's answer fed to both paths: no argmax
   flip where plain's top-2 margin is clear); a graphed row fails on any graph fallback or when it replayed
   nothing; any miss makes the exit status 1 (``--perturb-token`` changes one fast-path token: the test
   hook that proves it);
2. forward: ms of one denoise forward of the ``--shape`` model (``2b``: Qwen3-VL-2B's text shape,
   random bf16 weights) at Block-32 and AR for each variant (eager, graphed, compiled + graphed side by
   side), beside the HBM floor (weights + K/V read at the measured copy bandwidth), and graphs / eager;
3. decode: tokens per forward and ms per token **measured** on a greedy Block-32 decode of the fast
   path a node runs by default (not compiled) (confidences of a random model scaled like a trained one's; EOS banned), at mask_check_interval
   1, 2, 4 and 8 (the tokens must not change; the fastest is the device's answer for that default), its
   tokens against the plain decoder's (float32: identical, else exit 1; bf16: the agreement reported);
4. frame: a 1920 x 1080 camera frame to a parsed trajectory through ``DrivingPolicy`` (the real
   vision tower's shape for ``2b``), p50 / p95; then the same frame with ``--candidates`` N plan candidates
   (the planner's ``candidates.count``: N rows in one batched decode, row 1 greedy, rows 2..N sampled),
   p50 per N and its ratio to one candidate: what a row costs on the device (a random model's answers do
   not parse, so this is the decode's cost; scoring a parsed candidate adds CPU time per candidate,
   which scripts/candidates_bench.py measures);
5. quant: for each ``--quantization`` method (default weight-only int8; torchao, which gpu_verify.sh takes from
   its wheel in ``gpu_wheels/`` where the machine lacks it), the token check of 1. with the language model's
   linear layers quantized (the fast variants against the plain decoder on the same quantized weights:
   float32 identical, bf16 teacher-forced; compiled variants on CUDA only) and the forward timings of 2.
   (the HBM floor from the quantized weight bytes, and quantized / unquantized ms of the same variant).
   Without torchao the part is a skipped row that says why.

Targets (met on the device, not in CI) are printed beside the figures; token mismatches and graph
fallbacks fail.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..config import QUANTIZATIONS

HELP = "verify the fast decoding paths on this device (tokens vs plain) and print the one table"

# the device's targets; x floor: a graphed forward <= 2x the HBM floor, a compiled + graphed one <= 1.5x
TARGETS = {"x_floor": 2.0, "x_floor_compiled": 1.5, "graph_speedup": 2.0, "ms_per_token": 0.75, "frame_p50_ms": 50.0}


def add_arguments(p) -> None:
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu", "npu"))
    p.add_argument("--shape", default="2b", choices=("2b", "small", "tiny"), help="the benchmarked model's shape")
    p.add_argument("--prompt-length", type=int, default=2048, help="prompt tokens before the timed forwards")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--frames", type=int, default=10, help="camera frames timed through DrivingPolicy")
    p.add_argument("--candidates", type=int, nargs="*", default=[2, 4, 8],
                   help="plan candidate counts N > 1 also timed through DrivingPolicy (none: skip)")
    p.add_argument("--frame-size", type=int, nargs=2, default=[1920, 1080], metavar=("WIDTH", "HEIGHT"),
                   help="the camera frame (CI: a small one)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens of the timed decode (and at most 96 per frame)")
    p.add_argument("--check-tokens", type=int, default=64, help="tokens per answer in the token checks")
    p.add_argument("--out", default=None, help="write verify.json here (a folder)")
    p.add_argument("--parts", nargs="+", default=["probe", "tokens", "forward", "decode", "frame", "quant"],
                   choices=("probe", "tokens", "forward", "decode", "frame", "quant"))
    p.add_argument("--quantization", nargs="+", default=["int8"], choices=QUANTIZATIONS[1:],
                   help="the quant part's methods (engine.quantization; default int8)")
    p.add_argument("--perturb-token", action="store_true",
                   help="test hook: change one token of the first fast decode (the check must then fail)")


def summary_rows(result: dict) -> list[dict]:
    """The one table: each figure of TARGETS with its target and whether it is met."""
    rows = []

    def add(what, value, target=None, met=None):
        rows.append({"what": what, "value": value, "target": target or "-",
                     "met": "-" if met is None else ("yes" if met else "NO")})
    tokens = result.get("tokens")
    if tokens is not None:
        bad = [r for r in tokens if "FAIL" in r["note"]]
        add("fast tokens vs plain", f"{len(tokens) - len(bad)}/{len(tokens)} rows agree",
            "float32 identical, bf16 no clear flip, no graph fallback", not bad)
    for r in result.get("forward", []):
        if r["variant"] == "plain":
            continue
        graphed = r["variant"].endswith("-graph")
        target = TARGETS["x_floor_compiled" if "-compiled" in r["variant"] else "x_floor"]
        add(f"{r['variant']} {r['step']} forward", f"{r['ms']:.3f} ms = {r['x_floor']:.2f}x floor {r['floor_ms']:.3f}",
            f"<= {target}x floor" if graphed else None, r["x_floor"] <= target if graphed else None)
        if graphed and r["graph_speedup"] != "-":
            add(f"{r['variant']} {r['step']} graphs / eager", f"{r['graph_speedup']:.2f}x",
                f">= {TARGETS['graph_speedup']}x", r["graph_speedup"] >= TARGETS["graph_speedup"])
    decode = result.get("decode")
    if decode:
        add(f"Block-32 decode ({decode['variant']})", f"{decode['tokens_per_forward']:.2f} tokens/forward, "
            f"{decode['ms_per_token']:.3f} ms/token", f"<= {TARGETS['ms_per_token']} ms/token",
            decode["ms_per_token"] <= TARGETS["ms_per_token"])
        best = min(decode["sweep"], key=lambda r: r["ms_per_token"])
        add("mask_check_interval sweep", ", ".join(f"{r['interval']}: {r['ms_per_token']:.3f}" for r in decode["sweep"])
            + f" ms/token (fastest {best['interval']})", "same tokens at every interval", decode["same_tokens"])
    for q in result.get("quant", []):
        if "skipped" in q:
            add(f"quantized {q['method']}", f"skipped: {q['skipped']}")
            continue
        bad = [r for r in q["tokens"] if "FAIL" in r["note"]]
        add(f"{q['method']} fast tokens vs plain (same quantized weights)",
            f"{len(q['tokens']) - len(bad)}/{len(q['tokens'])} rows agree",
            "float32 identical, bf16 no clear flip, no graph fallback", not bad)
        for r in q["forward"]:
            vs = f", {r['x_unquantized']:.2f}x unquantized" if r["x_unquantized"] != "-" else ""
            add(f"{q['method']} {r['variant']} {r['step']} forward",
                f"{r['ms']:.3f} ms = {r['x_floor']:.2f}x floor {r['floor_ms']:.3f}{vs}")
    frame = result.get("frame")
    if frame and "skipped" not in frame:
        add(f"{frame['size']} frame -> trajectory", f"p50 {frame['p50_ms']:.1f} ms, p95 {frame['p95_ms']:.1f} ms",
            f"p50 <= {TARGETS['frame_p50_ms']} ms", frame["p50_ms"] <= TARGETS["frame_p50_ms"])
        for count, ms in frame.get("candidates_p50_ms", {}).items():
            add(f"{frame['size']} frame, {count} candidates", f"p50 {ms:.1f} ms = {ms / frame['p50_ms']:.2f}x one "
                f"candidate ({(ms - frame['p50_ms']) / (int(count) - 1):.1f} ms per added row)")
    elif frame:
        add("frame -> trajectory", frame["skipped"])
    return rows


def run(args) -> int:
    import torch

    from ..config import ConfigError
    from ..model.devices import resolve_device, resolve_dtype
    from ..benchmark.device_probe import flashinfer_version, probe, torchao_version
    from ..benchmark.device_timing import check_quantized, measure_decode, measure_frames, time_block_forwards
    from ..benchmark.timing import measure_bandwidth
    from ..benchmark.token_check import check_tokens
    from ..benchmark.variants import available_variants, make_variant
    from ..model.random_model import build_random_model
    from .common import cpu_name, format_table

    args.seed = 0
    from ..candidate_selection import MAX_CANDIDATES
    bad = [n for n in args.candidates if not 2 <= n <= MAX_CANDIDATES]
    if bad:
        print(f"verify-device: --candidates {bad}: each count must lie in 2..{MAX_CANDIDATES} (1 is the frame row)")
        return 2
    device = resolve_device(args.device)
    dtype = resolve_dtype("bfloat16" if device.type != "cpu" else "float32", device)
    flashinfer = flashinfer_version()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    torchao = torchao_version()
    print(f"verify-device: {device} ({name}), torch {torch.__version__}, flashinfer {flashinfer}, torchao {torchao}, "
          f"shape {args.shape} {str(dtype).replace('torch.', '')}")
    result: dict = {"device": str(device), "device_name": name, "torch": torch.__version__, "flashinfer": flashinfer,
                    "torchao": torchao, "shape": args.shape}
    ok = True
    t0 = time.perf_counter()
    if "probe" in args.parts:
        rows, ok = probe(device)
        result["probe"] = rows
        print("\n0. probe: what the fast path relies on")
        print(format_table(rows, [("what", "what", ""), ("result", "result", ""), ("ok", "ok", "")]))
    if "tokens" in args.parts:
        rows, tokens_ok = check_tokens(device, args.perturb_token, args.check_tokens)
        ok = ok and tokens_ok
        result["tokens"] = rows
        print("\n1. tokens: fast variants vs the plain decoder (head_dim-128 random model, mixed-length batches)")
        print(format_table(rows, [("dtype", "dtype", ""), ("variant", "variant", ""), ("case", "case", ""),
                                        ("same", "same tokens", ""), ("note", "note", "")]))
    if "forward" in args.parts or "decode" in args.parts:
        model, config = build_random_model(args.shape, device, dtype, args.seed, 24.0)
        config = config.with_settings(block_size=32)
        variants = {}
        for variant in available_variants(device):
            try:
                variants[variant] = make_variant(variant, model, config)
            except (ConfigError, RuntimeError) as exc:
                print(f"variant {variant} skipped: {exc}")
        if "forward" in args.parts:
            bandwidth = measure_bandwidth(device)
            rows = time_block_forwards(model, config, device, variants, args, bandwidth)
            result["bandwidth_gbps"], result["forward"] = bandwidth / 1e9, rows
            print(f"\n2. one denoise forward after {args.prompt_length} prompt tokens (median ms of {args.repeats}) "
                  f"vs the HBM floor at {bandwidth / 1e9:.0f} GB/s; targets: graphs <= {TARGETS['x_floor']}x floor, "
                  f"compiled + graphs <= {TARGETS['x_floor_compiled']}x, >= {TARGETS['graph_speedup']}x eager")
            print(format_table(rows, [("variant", "variant", ""), ("step", "step", ""), ("ms", "ms", ".3f"),
                                            ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"),
                                            ("graph_speedup", "graphs / eager", ".2f")]))
        if "decode" in args.parts:
            # the path a node runs by default (implementation auto): the last graphed one, not compiled
            fast = next(v for v in reversed(list(variants)) if v != "plain" and "-compiled" not in v)
            decode = {"variant": fast, **measure_decode(variants[fast], variants["plain"], config, device, args)}
            result["decode"] = decode
            ok = ok and decode["same_tokens"] and (dtype != torch.float32 or decode["plain_agreement"] == 1.0)
            print(f"\n3. decode {args.new_tokens} tokens, Block-32 greedy, {fast}: {decode['tokens_per_forward']:.2f} "
                  f"tokens per forward (measured), {decode['ms_per_token']:.3f} ms/token at mask_check_interval "
                  f"{decode['interval']} (target <= {TARGETS['ms_per_token']}), prefill {decode['prefill_ms']:.1f} ms, "
                  f"tokens as plain's: {decode['plain_agreement']:.1%}")
            print(format_table(decode["sweep"], [("interval", "mask_check_interval", ""),
                                                 ("ms_per_token", "ms/token", ".3f"),
                                                 ("tokens_per_forward", "tokens/forward", ".2f"),
                                                 ("same_tokens", "same tokens", "")]))
        del model, variants
    if "frame" in args.parts:
        try:
            frames = measure_frames(device, dtype, args)
        except ImportError as exc:          # Pillow / jinja2 / torchvision not on the machine
            frames = {"skipped": f"{exc} (a package the frame path needs is missing on this machine)"}
        result["frame"] = frames
        print(f"\n4. {args.frame_size[0]}x{args.frame_size[1]} frame -> parsed trajectory through DrivingPolicy: " + (
            frames["skipped"] if "skipped" in frames else
            f"p50 {frames['p50_ms']:.1f} ms, p95 {frames['p95_ms']:.1f} ms over {frames['frames']} frames "
            f"({frames['answer_tokens']:.0f} answer tokens, {frames['decoder']}; target p50 <= "
            f"{TARGETS['frame_p50_ms']} ms)" + "".join(f"; {n} candidates p50 {ms:.1f} ms"
                                                      for n, ms in frames["candidates_p50_ms"].items())))
    if "quant" in args.parts:
        result["quant"] = []
        for method in args.quantization:
            quant, quant_ok = check_quantized(device, dtype, args, method, result.get("forward", []))
            ok = ok and quant_ok
            result["quant"].append(quant)
            if "skipped" in quant:
                print(f"\n5. quantized {method}: skipped: {quant['skipped']}")
                continue
            print(f"\n5. quantized {method} ({quant['weights']}): fast variants vs plain on the same quantized weights")
            print(format_table(quant["tokens"], [("dtype", "dtype", ""), ("variant", "variant", ""), ("case", "case", ""),
                                                 ("same", "same tokens", ""), ("note", "note", "")]))
            print(f"one denoise forward after {args.prompt_length} prompt tokens, {method} (median ms of {args.repeats})")
            print(format_table(quant["forward"], [("variant", "variant", ""), ("step", "step", ""), ("ms", "ms", ".3f"),
                                                  ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"),
                                                  ("x_unquantized", "x unquantized", ".2f")]))
    result["ok"], result["seconds"] = ok, time.perf_counter() - t0
    print(f"\nverify-device summary ({result['device_name']}, torch {result['torch']}, flashinfer {flashinfer}, "
          f"shape {args.shape})")
    print(format_table(summary_rows(result), [("what", "what", ""), ("value", "value", ""),
                                                    ("target", "target", ""), ("met", "met", "")]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "verify.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nverify-device: {'every check passed' if ok else 'FAILED (see the rows marked FAIL / NO)'} "
          f"({result['seconds']:.0f} s)")
    return 0 if ok else 1
