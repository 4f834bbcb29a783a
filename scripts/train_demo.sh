#!/usr/bin/env bash
# The demo models' whole recipe, from the synthetic world to the shipped weights (models/):
# data -> a 3.2M-parameter Qwen3-VL built from code -> AR training (B = 1) -> convert ->
# Stage I curriculum B = 4 -> 8 -> 16 -> 32 -> closed-loop adaptation at B = 32 (recovery,
# standstill and slowed-down copies of every frame) -> a longer B = 32 refinement on fresh scenes
# -> a DAgger round (the model's own drive, labelled by the expert) -> bf16 copies. Every step
# is skipped when its output exists and training steps resume, so an interrupted run continues
# where it stopped, also in a later session on the same machine: the run state lives in the user's
# cache, ~/.cache/wam-diff2/runs/demo (wam_diff2_core/utils/cache_dirs.py: WAM_DIFF2_CACHE or
# WAM_DIFF2_RUNS move it; RUNS= names the folder itself), not in the work tree.
#   make train-demo            (CPU: about 3.5 h on 2 cores; on a GPU add --train.device auto)
#   RUNS=/path/to/run bash scripts/train_demo.sh [extra wam-diff2 train overrides]
# The same recipe's GPU counterpart, in one device call: scripts/train_device.py.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-$(python -m wam_diff2_core.utils.cache_dirs runs demo)}
echo "train_demo: run state in $runs"
[ -n "${RUNS:-}" ] || [ ! -d runs/demo ] || [ -d "$runs" ] || echo "train_demo: runs/demo (an earlier run in the" \
  "work tree) is not continued; RUNS=runs/demo continues it" >&2
models=${MODELS:-models}
data="--data.train_file $runs/data/train.json --data.data_root $runs/data"
overrides=("$@")
[ -f "$runs/data/manifest.json" ] || wam-diff2 synth "$runs/data" --episodes 160 --frames 100 --frame-stride 5 \
  --formats json --vqa-per-frame 0 --no-detection --recovery-fraction 0.3 --workers 2 --no-progress --overwrite
[ -d "$runs/init" ] || wam-diff2 tiny-checkpoint "$runs/init" --ar --seed 0 --hidden-size 256 --layers 4 --logit-scale 1
resume() { [ -d "$1" ] && echo --resume || true; }
[ -d "$runs/ar/final" ] || wam-diff2 train --config training/demo/ar.yaml --model.path "$runs/init" $data \
  --output.dir "$runs/ar" $(resume "$runs/ar") "$@"
[ -d "$runs/init_diffusion" ] || wam-diff2 convert "$runs/ar/final" "$runs/init_diffusion" --block-size 4
[ -d "$runs/curriculum/block32/final" ] || wam-diff2 train --config training/demo/curriculum.yaml \
  --model.path "$runs/init_diffusion" $data --output.dir "$runs/curriculum" $(resume "$runs/curriculum") "$@"
# scenes for the B = 32 stages: every 5th tick, planning samples only
scene_flags=(--frame-stride 5 --formats json --vqa-per-frame 0 --no-detection --val-fraction 0 --workers 2 --no-progress
             --overwrite)
# a B = 32 stage on scenes of its own: NAME (training/demo/NAME.yaml, runs/data_NAME, runs/NAME), the model
# it starts from, then the synth options of its scenes
b32_stage() {
  local name=$1 from=$2 scenes=$runs/data_$1
  shift 2
  [ -f "$scenes/manifest.json" ] || wam-diff2 synth "$scenes" "$@" "${scene_flags[@]}"
  [ -d "$runs/$name/final" ] || wam-diff2 train --config "training/demo/$name.yaml" --model.path "$from" \
    --data.train_file "$scenes/train.json" --data.data_root "$scenes" --output.dir "$runs/$name" \
    $(resume "$runs/$name") "${overrides[@]}"
}
b32_stage closed_loop "$runs/curriculum/block32/final" --seed 3000 --episodes 40 --frames 60 --recovery-fraction 1 \
  --recovery-standstill 0.3 --recovery-slow 0.3
refine_scenes=(--seed 4000 --episodes 120 --frames 80 --recovery-fraction 0.5 --recovery-standstill 0.3
               --recovery-slow 0.3)
b32_stage refine "$runs/closed_loop/final" "${refine_scenes[@]}"
# a DAgger round (training/demo/dagger.yaml): the refined model drives 10 routes of seed 5000, the expert
# labels every frame it planned on from the state it reached; those labels and the refinement scenes' turns,
# paired with the same worlds turning the other way at every crossing, mixed into the refinement scenes
[ -f "$runs/dagger1_labels/expert_labels/train.json" ] || wam-diff2 closed-loop --model "$runs/refine/final" \
  --seed 5000 --routes 10 --threads 2 --expert-labels --no-plots --overwrite --out "$runs/dagger1_labels"
for twin in turns turns_mirror; do
  [ -f "$runs/data_$twin/manifest.json" ] || wam-diff2 synth "$runs/data_$twin" "${refine_scenes[@]}" \
    --commands left right $([ $twin = turns_mirror ] && echo --mirror-turns) "${scene_flags[@]}"
done
mix=$(sed -n 's/^  mix: //p' training/demo/dagger.yaml | sed "s#runs/demo/#$runs/#g")
[ -d "$runs/dagger1/final" ] || wam-diff2 train --config training/demo/dagger.yaml --model.path "$runs/refine/final" \
  --data.train_file "$runs/data_refine/train.json" --data.data_root "$runs/data_refine" --data.mix "$mix" \
  --output.dir "$runs/dagger1" $(resume "$runs/dagger1") "${overrides[@]}"
[ -d "$models/wam-diff2-demo-ar" ] || wam-diff2 export "$runs/ar/final" "$models/wam-diff2-demo-ar" --dtype bfloat16
[ -d "$models/wam-diff2-demo-b32" ] || wam-diff2 export "$runs/dagger1/final" "$models/wam-diff2-demo-b32" --dtype bfloat16
echo "demo models: $models/wam-diff2-demo-ar (AR), $models/wam-diff2-demo-b32 (Block-32)"
