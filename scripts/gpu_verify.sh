#!/usr/bin/env bash
# GPU verification of the fast decoding paths (run on a machine with an NVIDIA GPU):
#   1. the GPU tests (CUDA graph replay == eager step; graphed float32 tokens == plain; FlashInfer vs SDPA);
#   2. token agreement with eager SDPA (the plain decoder) on the tiny checkpoint, float32 and bfloat16,
#      for static eager / CUDA graphs / FlashInfer / FlashInfer + graphs: a short table;
#   3. the benchmark, 2B-shaped random bf16 model: per-forward ms vs bandwidth floor, ms/token, decodes.
#
#   scripts/gpu_verify.sh [OUT_DIR]        (default OUT_DIR: ${OUT:-gpu_verify_out})
#
# Needs the package installed (pip install -e .[gpu,test]); FlashInfer rows are skipped (and said so)
# when flashinfer is not importable. Results go to OUT_DIR (logs, bench_2b.json, tokens.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_verify_out}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python}
status=0

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU"; exit 2; }
$PY - <<'EOF'
import torch, transformers
try:
    import flashinfer; fi = flashinfer.__version__
except ImportError:
    fi = "not installed"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, flashinfer {fi}")
EOF

echo "== 1. GPU tests"
timeout 600 $PY -m pytest -q -m gpu test/test_static_decoder.py -p no:cacheprovider 2>&1 | tee "$OUT_DIR/pytest_gpu.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 2. tokens vs eager SDPA (tiny checkpoint)"
timeout 600 $PY - "$OUT_DIR" <<'EOF' 2>&1 | tee "$OUT_DIR/tokens.log"
import json, sys, tempfile, torch
from wam_diff2_core.model.tiny import build_tiny_checkpoint
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.model.prompt_encoding import encode_prompts
from wam_diff2_core.decoding import make_decoder

ckpt = build_tiny_checkpoint(tempfile.mkdtemp() + "/tiny", seed=0)
texts = ["The navigation information is: left", "Is there a car ahead?", "predict 8 new waypoints 12.50,-3.25",
         "The current velocity is: (4.66,-0.09) and current accelerate is: (0.10,0.02)",
         "Detect every car, truck and pedestrian", "Instruction: predict the optimal driving action"]
variants = {"static eager": dict(), "static graphs": dict(cuda_graphs=True),
            "flashinfer eager": dict(attention_backend="flashinfer"),
            "flashinfer graphs": dict(attention_backend="flashinfer", cuda_graphs=True)}
rows = []
for dtype in ("float32", "bfloat16"):
    m = load_checkpoint(ckpt, device="cuda", dtype=dtype)
    batches = [encode_prompts(m.processor, [[{"role": "user", "content": t}]], [[]]) for t in texts]
    batches.append(encode_prompts(m.processor, [[{"role": "user", "content": t}] for t in texts[:4]], [[]] * 4))
    plain = make_decoder(m.model, m.config, "plain")
    for block in (1, 8, 32):
        settings = m.config.settings.replace(block_size=block, denoising_steps=block, confidence_threshold=0.7,
                                             max_new_tokens=64)
        reference = [plain.generate(b, settings).sequences for b in batches]
        for name, options in variants.items():
            if "flashinfer" in name and dtype == "float32":
                continue
            try:
                decoder = make_decoder(m.model, m.config, "static", **options)
                got = [decoder.generate(b, settings).sequences for b in batches]
            except Exception as exc:  # reported, not fatal: the table says why
                rows.append(dict(dtype=dtype, block=block, variant=name, same="-", note=f"{type(exc).__name__}: {exc}"[:80]))
                continue
            same = sum(x == y for r, g in zip(reference, got) for x, y in zip(r, g))
            total = sum(len(r) for r in reference)
            fallbacks = getattr(getattr(decoder, "graphs", None), "failures", {})
            rows.append(dict(dtype=dtype, block=block, variant=name, same=f"{same}/{total}",
                             note=("graph fallbacks: %d" % len(fallbacks)) if fallbacks else ""))
print(f"{'dtype':9} {'B':>3} {'variant':18} {'same tokens':11} note")
for r in rows:
    print(f"{r['dtype']:9} {r['block']:>3} {r['variant']:18} {r['same']:11} {r['note']}")
json.dump(rows, open(sys.argv[1] + "/tokens.json", "w"), indent=2)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 3. benchmark: Qwen3-VL-2B text shape, random bf16 weights"
timeout 900 $PY -m wam_diff2_core.cli bench --shape 2b --device cuda --dtype bfloat16 --prompt-lengths 1024 2048 \
    --block-size 32 --repeats 20 --new-tokens 128 --json "$OUT_DIR/bench_2b.json" 2>&1 | tee "$OUT_DIR/bench_2b.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== done (status $status); logs and JSON in $OUT_DIR"
exit $status
