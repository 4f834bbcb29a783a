#!/usr/bin/env bash
# The README's main job: the embedded Block-32 demo model drives the planner node over real DDS.
# A held-out demo-world drive (sim/protocol.py's DEMO_DRIVE_SEED, never trained on) is generated as a carla-ros-bridge-like
# bag, played with /clock (wam-diff2-ros replay) into the planner node running on sim time, and what
# the node published is recorded and scored against the recorded drive (wam-diff2 eval-bag
# --predictions): L2 at 1-4 s beside the constant-velocity baseline, decode statistics, latency, and the
# COCO AP of the boxes the node published against what the camera saw of the bag's objects.
#   make demo [MODEL=ckpt] [FRAMES=120] [RATE=1.0] [OUT=outputs/demo] [CANDIDATES=1] [DETECT_EVERY=10]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/demo}
model=${MODEL:-models/wam-diff2-demo-b32}
frames=${FRAMES:-120}
rate=${RATE:-1.0}
# Boxes: the detect prompt rides in the plan's decode (the planner's tasks both) on every DETECT_EVERY-th frame;
# 0 = plans only. Every 10th frame keeps the mean frame within 1.5x of planning alone on 2 cores with the shipped
# Block-32 model, whose detect answers (it was trained on planning only) cost ~5x a plan (wam_diff2_ros/README.md).
detect_every=${DETECT_EVERY:-10}
[[ "$detect_every" =~ ^[0-9]+$ ]] || { echo "demo.sh: DETECT_EVERY must be a whole number (0 = no boxes), got '$detect_every'" >&2; exit 2; }
if [ "$detect_every" -eq 0 ]; then tasks=(-p tasks:=plan); else
  tasks=(-p tasks:=both -p detection_every_n_frames:="$detect_every"); fi
mkdir -p "$out"
bag=$out/drive_f$frames/bags/mcap/e0000
[ -d "$bag" ] || wam-diff2 synth "$out/drive_f$frames" --episodes 1 --frames "$frames" --frame-stride 5 \
  --seed "$(python -m wam_diff2_core.sim.protocol --seed demo-drive)" \
  --formats mcap --val-fraction 0 --no-progress --overwrite
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-57}
# the planner's inputs onto carla-ros-bridge's topics, which share their keys (wam_diff2_core/topics.py)
bridge_topics=$(python -m wam_diff2_core.topics carla)
remaps=()
while read -r name topic; do remaps+=(-r "~/input/$name:=$topic"); done <<< "$bridge_topics"
# engine.cpu_threads 1: torch's default (one per core) spin-waits against the node's executor
# threads and the player on a 2-core machine and made each plan ~40x slower (16 s instead of 0.4 s).
wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:="$model" -p use_sim_time:=true \
  -p engine.cpu_threads:="${PLANNER_THREADS:-1}" -p candidates.count:="${CANDIDATES:-1}" "${tasks[@]}" \
  "${remaps[@]}" > "$out/planner.log" 2>&1 &
planner=$!
# As ros2 launch does: SIGINT, then SIGTERM after 10 s, then SIGKILL (a node has once been seen
# to miss its first SIGINT on shutdown).
stop_planner() {
  for sig in INT TERM KILL; do
    kill -$sig $planner 2>/dev/null || break
    for _ in $(seq 50); do kill -0 $planner 2>/dev/null || break 2; sleep 0.2; done
    echo "planner did not stop on SIG$sig within 10 s" >&2
  done
  wait $planner 2>/dev/null || true
}
trap stop_planner EXIT
echo "planner node: $model (log $out/planner.log); replaying $bag ($frames camera frames at ${rate}x)"
wam-diff2-ros --log-level WARNING replay "$bag" --clock --rate "$rate" --wait-for-planner \
  --record "$out/node_answers" --overwrite
stop_planner
trap - EXIT
wam-diff2 --log-level WARNING eval-bag "$bag" --predictions "$out/node_answers" --out "$out/eval" --overwrite \
  --label "planner node, $(basename "$model")" --no-progress
