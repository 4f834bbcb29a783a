#!/usr/bin/env bash
# The distillation ablation in miniature (models/README.md): Stage II (block-wise distillation, JSD / forward KL / reverse KL,
# against a Stage I control of the same steps) and Stage III (a 3.4x larger teacher) on the demo world,
# every run from a config in training/demo/ablation_*.yaml, choices on the selection set only, figures
# on the report set (the protocol of scripts/score_demo.sh and models/README.md).
#   bash scripts/ablation_demo.sh            (CPU, 2 cores: about 2 h of training + 1 h of scoring, one run at a time;
#                                             the model card's run: two 1-thread runs side by side, 75 + 31 min)
#   THREADS=1 bash scripts/ablation_demo.sh  (scoring at one thread, to share the cores with another run)
#   RUNS=runs/ablation bash scripts/ablation_demo.sh [extra wam-diff2 train overrides]
# Every step is skipped when its output exists and training resumes from its last checkpoint
# (save_every_steps 25), so an interrupted run continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-runs/ablation}
data=${DATA:-runs/demo/data}
ar=models/wam-diff2-demo-ar
paths="--data.train_file $data/train.json --data.data_root $data"
[ -f "$data/val.json" ] || wam-diff2 synth "$data" --episodes 160 --frames 100 --frame-stride 5 --formats json \
  --vqa-per-frame 0 --no-detection --recovery-fraction 0.3 --workers 2 --no-progress --overwrite
resume() { [ -d "$1" ] && echo --resume || true; }
# train NAME CONFIG FROM [overrides...]: runs/ablation/NAME from training/demo/ablation_CONFIG.yaml
train() {
  local name=$1 config=$2 from=$3
  shift 3
  [ -d "$runs/$name/final" ] || wam-diff2 train --config "training/demo/ablation_$config.yaml" --model.path "$from" \
    $paths --output.dir "$runs/$name" $(resume "$runs/$name") "$@"
}
convert() { [ -d "$2" ] || wam-diff2 convert "$1" "$2" --block-size "$3"; }
select=$runs/selection
# val_loss NAME MODEL [--teacher T]: the selection-set loss (and rho_5 with a teacher) in selection/NAME.json
val_loss() {
  local name=$1 model=$2
  shift 2
  [ -f "$select/$name.json" ] || wam-diff2 val-loss --model "$model" --data "$data/val.json" --limit 200 --device cpu \
    --json "$select/$name.json" "$@"
}

convert "$ar" "$runs/init_b4" 4
train teacher_b4 teacher_b4 "$runs/init_b4" "$@"
convert "$ar" "$runs/init_b32" 32
train direct direct "$runs/init_b32" "$@"
train stage1_control stage1_control "$runs/direct/final" "$@"
teacher="--distill.teacher_path $runs/teacher_b4/final"
train stage2_jsd stage2 "$runs/direct/final" $teacher "$@"
train stage2_fkl stage2 "$runs/direct/final" $teacher --distill.loss forward_kl "$@"
train stage2_rkl stage2 "$runs/direct/final" $teacher --distill.loss reverse_kl "$@"
# JSD off-policy: the ground-truth answers noised, never the student's own (whose answers are often malformed)
train stage2_jsd_off_policy stage2 "$runs/direct/final" $teacher --distill.on_policy false "$@"
# the same JSD from an AR teacher of the same size (the shipped AR model, its next-token view)
train stage2_ar_teacher stage2 "$runs/direct/final" --distill.teacher_path "$ar" --distill.teacher_block_size 1 "$@"
# rho_5 of the two same-size teachers with the student they distil into, on the selection set
mkdir -p "$select"
for t in b4 ar; do
  [ "$t" = b4 ] && tpath=$runs/teacher_b4/final || tpath=$ar
  val_loss "rho5_small_$t" "$runs/direct/final" --teacher "$tpath"
done

# Stage III's teacher: a larger model through this package's own Phase 1 + Stage I on the same data
[ -d "$runs/init_large" ] || wam-diff2 tiny-checkpoint "$runs/init_large" --ar --seed 1 --hidden-size 512 --layers 4 \
  --logit-scale 1
train teacher_large_ar teacher_large_ar "$runs/init_large" "$@"
convert "$runs/teacher_large_ar/final" "$runs/init_large_b32" 32
train teacher_large_b32 teacher_large_b32 "$runs/init_large_b32" "$@"
# the large teacher's own selection-set loss at B = 32, beside its students'
val_loss teacher_large_b32 "$runs/teacher_large_b32/final"

# choice on the selection set (the 40 held-out drives of seed 0): the Stage II arm with the lowest
# fixed-noise validation loss at B = 32 goes on to Stage III
# (the other rows and the shipped Block-32 model beside them: whether any arm beats what ships)
for arm in direct stage1_control stage2_jsd stage2_fkl stage2_rkl stage2_jsd_off_policy stage2_ar_teacher shipped_b32; do
  [ "$arm" = shipped_b32 ] && model=models/wam-diff2-demo-b32 || model=$runs/$arm/final
  val_loss "$arm" "$model"
done
best=$(python - "$select" <<'PY'
import json, sys
from pathlib import Path
arms = {p.stem: json.loads(p.read_text())["ce"] for p in Path(sys.argv[1]).glob("stage2_*.json")}
print(min(arms, key=arms.get))
PY
)
echo "ablation: Stage III starts from $best (lowest selection-set validation loss)"
train stage3 stage3 "$runs/$best/final" --distill.teacher_path "$runs/teacher_large_b32/final" "$@"
# Stage III's control: the same 50 steps of Stage I CE at B = 32 from the same start
train stage3_control stage1_control "$runs/$best/final" "$@"
for arm in stage3 stage3_control; do val_loss "$arm" "$runs/$arm/final"; done
# rho_5 of a diffusion teacher vs an AR teacher of the same size, on the selection set
for t in ar b32; do
  val_loss "rho5_large_$t" "$runs/$best/final" --teacher "$runs/teacher_large_$t/final"
done

# the report set: every row scored with scripts/score_demo.sh's report protocol (AR = the shipped AR model)
# on its 200 planning samples and, to fit a session, the 10 closed-loop routes of seed 8001
for row in direct stage1_control stage2_jsd stage2_fkl stage2_rkl stage2_jsd_off_policy stage2_ar_teacher stage3 stage3_control; do
  [ -f "$runs/report/$row/summary.json" ] || SET=report MODEL="$runs/$row/final" OUT="$runs/report/$row" \
    BENCH_ARGS="--block-sizes 32 --thresholds 0.9" ROUTE_SEEDS=8001 bash scripts/score_demo.sh
done
python scripts/ablation_table.py "$runs" | tee "$runs/ablation_table.md"
echo "ablation: the table in $runs/ablation_table.md; report-set summaries in $runs/report/*/summary.md; selection-set choices in $select/"
