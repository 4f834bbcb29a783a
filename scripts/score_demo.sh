#!/usr/bin/env bash
# The demo models' figures in models/README.md, reproduced (about 15 minutes on 2 CPU cores):
# the decoding benchmark on held-out planning samples (AR vs Block-4/8/16/32, thresholds) and the
# closed-loop drive of the evaluation routes (policy + controller in one process; `wam-diff2-ros
# closed-loop` runs them as the planner and controller nodes over DDS, the same code, slower here).
#   bash scripts/score_demo.sh [OUT=outputs/score_demo]   (needs runs/demo/data/val.json: make train-demo's data)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/score_demo}
data=${DATA:-runs/demo/data}
mkdir -p "$out"
[ -f "$data/val.json" ] || wam-diff2 synth "$data" --episodes 160 --frames 100 --frame-stride 5 --formats json \
  --vqa-per-frame 0 --no-detection --recovery-fraction 0.3 --workers 2 --no-progress --overwrite
wam-diff2 --log-level WARNING bench --model models/wam-diff2-demo-b32 --ar-model models/wam-diff2-demo-ar \
  --data "$data/val.json" --every 50 --device cpu --threads 2 --out "$out/bench" --overwrite | tee "$out/bench.txt"
wam-diff2 --log-level WARNING closed-loop --model models/wam-diff2-demo-b32 --routes 10 --threads 2 \
  --out "$out/closed_loop" --overwrite | tee "$out/closed_loop.txt"
