#!/usr/bin/env bash
# Live replay without ROS tools: a synthetic carla-like bag is played over DDS with /clock
# (wam-diff2 replay) into the planner node running on use_sim_time, then the same bag is scored
# offline (wam-diff2 eval-bag) with the same parameters. Uses the tiny random checkpoint unless
# MODEL=... is given (its answers do not parse: the trajectories are published as invalid).
#   make replay-demo [MODEL=ckpt] [RATE=0.5]
set -euo pipefail
cd "$(dirname "$0")/.."
out=outputs/replay_demo
model=${MODEL:-outputs/demo/tiny}
rate=${RATE:-0.5}
mkdir -p "$out"
[ -n "${MODEL:-}" ] || [ -d "$model" ] || wam-diff2 tiny-checkpoint "$model" --seed 0
bag=$out/synth/bags/mcap/e0000
[ -d "$bag" ] || wam-diff2 synth "$out/synth" --episodes 1 --frames 60 --formats mcap --no-progress --overwrite
role=/carla/ego_vehicle
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-57}
wam-diff2-planner --ros-args --params-file config/planner.yaml -p model_path:="$model" -p use_sim_time:=true \
  -r "~/input/image:=$role/rgb_front/image" -r "~/input/camera_info:=$role/rgb_front/camera_info" \
  -r "~/input/odometry:=$role/odometry" -r "~/input/route:=$role/waypoints" > "$out/planner.log" 2>&1 &
planner=$!
trap 'kill -INT $planner 2>/dev/null || true; wait $planner 2>/dev/null || true' EXIT
wam-diff2 replay "$bag" --clock --rate "$rate" --wait-for-subscribers "$role/rgb_front/image" "$role/odometry"
kill -INT $planner && wait $planner || true
trap - EXIT
echo "planner log: $out/planner.log"
wam-diff2 eval-bag "$bag" --params-file config/planner.yaml --model "$model" --out "$out/eval" --overwrite
