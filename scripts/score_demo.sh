#!/usr/bin/env bash
# The demo models' figures in models/README.md, reproduced under the model card's protocol (the sets'
# seeds and sizes: wam_diff2_core/sim/protocol.py):
#   training seeds   0 (runs/demo/data train.json), 3000, 4000 (closed-loop adaptation and refinement
#                    scenes), 5000 (DAgger routes); twins of seed 4000 (--mirror-turns)
#   selection set    runs/demo/data/val.json (the 40 held-out drives of seed 0) and closed-loop route
#                    seeds 2000-2002 (6000: a tried DAgger round): every choice of model, variant,
#                    threshold or schedule was made here
#   report set       planning samples of 40 drives of seed 8000 and closed-loop route seeds 8001, 8002:
#                    no training and no choice ever looked at them; the model card's figures come from here
#   SET=report bash scripts/score_demo.sh      (default; about 30 minutes on 2 CPU cores)
#   SET=selection bash scripts/score_demo.sh   (what choices look at; needs runs/demo/data/val.json or makes it)
#   MODEL=, AR_MODEL=, OUT= (default outputs/score_demo/$SET), BENCH_ARGS= (extra `wam-diff2 bench` options),
#   ROUTE_SEEDS= (a subset of the set's closed-loop route seeds, e.g. 8001: the ablation rows' 10 routes)
#   THREADS= (CPU threads of each run, default 2; give 1 to each of two runs sharing 2 cores: OpenMP threads
#   oversubscribing the cores slow a closed loop many times over)
# Writes OUT/bench (wam-diff2 bench --data), OUT/closed_loop_SEED (wam-diff2 closed-loop) and OUT/summary.md
# (scripts/score_summary.py: the figures with 95 % bootstrap intervals).
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${SET:-report}
model=${MODEL:-models/wam-diff2-demo-b32}
ar_model=${AR_MODEL:-models/wam-diff2-demo-ar}
out=${OUT:-outputs/score_demo/$set_name}
case "$set_name" in
  report|selection) eval "$(python -m wam_diff2_core.sim.protocol --shell "$set_name")"
    data=${DATA:-$data}; samples=$data/$(basename "$samples") ;;
  *) echo "score_demo.sh: SET must be report or selection, got '$set_name'" >&2; exit 2 ;;
esac
for seed in ${ROUTE_SEEDS:-}; do
  case " $route_seeds " in *" $seed "*) ;; *) echo "score_demo.sh: ROUTE_SEEDS: $seed is not a route seed of the $set_name set ($route_seeds)" >&2; exit 2 ;; esac
done
route_seeds=${ROUTE_SEEDS:-$route_seeds}
threads=${THREADS:-2}
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "score_demo.sh: THREADS must be a positive integer, got '$threads'" >&2; exit 2; }
[ -f "$samples" ] || wam-diff2 synth "$data" "${synth[@]}" --formats json --vqa-per-frame 0 --no-detection --workers 2 \
  --no-progress --overwrite
mkdir -p "$out"
# shellcheck disable=SC2086
wam-diff2 --log-level WARNING bench --model "$model" --ar-model "$ar_model" --data "$samples" --every $every \
  --device cpu --threads $threads --out "$out/bench" --overwrite ${BENCH_ARGS:-} | tee "$out/bench.txt"
loops=()
for seed in $route_seeds; do
  wam-diff2 --log-level WARNING closed-loop --model "$model" --seed "$seed" --routes "$routes" --threads $threads \
    --out "$out/closed_loop_$seed" --overwrite | tee "$out/closed_loop_$seed.txt"
  loops+=("$out/closed_loop_$seed")
done
python scripts/score_summary.py --bench "$out/bench" --closed-loop "${loops[@]}" --json "$out/summary.json" \
  | tee "$out/summary.md"
