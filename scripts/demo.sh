#!/usr/bin/env bash
# The README's main job until the trained demo model lands: build the tiny random checkpoint,
# decode the embedded NAVSIM-format example with the AR baseline (B = 1) and Block-32, and
# print what each did. A random model answers garbage: this shows the pipeline, not driving.
set -euo pipefail
cd "$(dirname "$0")/.."
out=outputs/demo
mkdir -p "$out"
[ -d "$out/tiny" ] || wam-diff2 tiny-checkpoint "$out/tiny" --seed 0
for b in 1 32; do
  wam-diff2 --log-level WARNING infer --model "$out/tiny" --input examples/navsim_mini/eval.json \
    --output "$out/preds_b$b.json" --block-size "$b" --max-new-tokens 64
done
python - "$out" <<'PY'
import json, sys, statistics
out = sys.argv[1]
print(f"{'decoder':<10}{'samples':>8}{'tokens':>8}{'forwards':>10}{'tok/fwd':>9}{'decode ms':>11}{'parsed':>8}")
for b in (1, 32):
    recs = [r for r in json.load(open(f"{out}/preds_b{b}.json")) if "stats" in r]
    tok = sum(r["stats"]["tokens"] for r in recs)
    fwd = sum(r["stats"]["forwards"] for r in recs)
    ms = statistics.median(r["stats"]["prefill_ms"] + r["stats"]["denoise_ms"] + r["stats"]["commit_ms"] for r in recs)
    ok = sum(r.get("waypoints") is not None for r in recs)
    name = "AR" if b == 1 else f"Block-{b}"
    print(f"{name:<10}{len(recs):>8}{tok:>8}{fwd:>10}{tok / max(fwd, 1):>9.2f}{ms:>11.1f}{ok:>8}")
print(f"predictions: {out}/preds_b1.json, {out}/preds_b32.json")
PY
