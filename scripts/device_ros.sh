#!/usr/bin/env bash
# The ROS nodes on the accelerator, in one device call: ROS 2 brought up on the lent GPU image from wheels (it has
# no ROS and no registry), the planner node over DDS at camera rate, and the leaderboard's pacing at full speed and
# slowed 3x. Each part is its own process under its own time bound, at most ${TOTAL_S:-480} s in all (a bound is cut
# to what is left); each part's figures are written as they are measured and packed after every part.
#
#   bash scripts/gpu_wheels.sh && bash scripts/device_ros_wheels.sh            # here, first (PyPI)
#   run(command="bash scripts/device_ros.sh", carry=["device_ros_wheels", "gpu_wheels"], timeout_s=540)
#   DEVICE=cpu RANDOM_SHAPE=tiny NODE_SIZE="160 90" ... scripts/device_ros.sh  # its CPU twin (CI: test/scripts/test_device_ros.py)
#   PARTS="node-demo:100" bash scripts/device_ros.sh                           # some parts, other bounds
#
# Parts:
#   prefix      scripts/ros_prefix.py unpack: the wheels of ${ROS_WHEELS:-device_ros_wheels}/ onto ${ROS_PREFIX}
#               (never installed); then its env.sh is sourced
#   msgs        scripts/ros_prefix.py build: msg/, ros_environment, carla_msgs and tf2_msgs with CMake into the prefix
#               (prefix and msgs are skipped when the interpreter already imports rclpy and the messages: the
#               CPU twin's venv, or a warm machine whose prefix under build/ is still there)
#   node-random scripts/node_rate.py --random ${RANDOM_SHAPE:-2b}: the planner node as its own process, fed over DDS
#               by a camera (bgra8 ${NODE_SIZE:-1920 1080} at ${NODE_RATE_HZ:-10} Hz for ${NODE_DURATION_S:-60} s),
#               odometry and a route; camera -> trajectory p50 / p95, frames planned / dropped by keep-latest,
#               memory, configure -> active
#   node-demo   the same with the demo model (${DEMO_MODEL:-models/wam-diff2-demo-b32}, ${DEMO_PARAMS}: its pixel budget)
#   pacing      scripts/pacing_runs.py: docs/carla.md's `wam-diff2-ros closed-loop ... --timing leaderboard --bridge
#               --pacing hold --planner-slowdown {1,3}`, ${PACING_ROUTES:-10} routes of ${PACING_ROUTE_M:-60} m with
#               the demo model, ${PACING_CHUNK:-2} routes per process, ${PACING_JOBS:-10} processes at a time
# Then scripts/device_ros_summary.py: the table (with the H200 targets on CUDA). ${OUT:-device_ros_out}/ gets two
# files (a device call brings back at most eight): device_ros.tar.gz (each part's rows, logs, the pacing runs'
# summaries, status.txt), packed after every part, and summary.txt at the end.
# Exit status 1 if a part fails or is stopped at its bound (targets missed are figures, not failures).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-device_ros_out}
DEVICE=${DEVICE:-cuda}
TOTAL_S=${TOTAL_S:-480}
ROS_WHEELS=${ROS_WHEELS:-device_ros_wheels}
WHEELS=${WHEELS:-gpu_wheels}
ROS_PREFIX=${ROS_PREFIX:-$PWD/build/device_ros_prefix}
RANDOM_SHAPE=${RANDOM_SHAPE:-2b}
DEMO_MODEL=${DEMO_MODEL:-models/wam-diff2-demo-b32}
# the demo model sees its own pixel budget (its 320x180 camera), as a user of a 1080p camera sets it: at the
# processor's default budget a 1080p frame is ~2,000 vision tokens the model never saw, and its answers do not parse
DEMO_PARAMS=${DEMO_PARAMS:-image.max_pixels:=57600}
NODE_SIZE=${NODE_SIZE:-1920 1080}
NODE_RATE_HZ=${NODE_RATE_HZ:-10}
NODE_DURATION_S=${NODE_DURATION_S:-60}
NODE_THREADS=${NODE_THREADS:-0}
PACING_ROUTES=${PACING_ROUTES:-10}
PACING_ROUTE_M=${PACING_ROUTE_M:-60}
PACING_CHUNK=${PACING_CHUNK:-2}
PACING_JOBS=${PACING_JOBS:-10}
DOMAIN_BASE=${DOMAIN_BASE:-150}           # the node parts' DDS domains: DOMAIN_BASE and DOMAIN_BASE + 1
PACING_DOMAIN=${PACING_DOMAIN:-$((DOMAIN_BASE + 10))}   # the pacing runs': from PACING_DOMAIN, one per process
PARTS=${PARTS:-"prefix:10 msgs:70 node-random:175 node-demo:90 pacing:120"}
RESERVE_S=10                              # kept for the summary and the last pack
mkdir -p "$OUT_DIR"
. scripts/device_parts.sh
device_wheels "$WHEELS"                   # the project's other device wheels (pure Python)
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST

use_prefix() {          # the prefix's paths, the checkout still first on PYTHONPATH
    . "$ROS_PREFIX/env.sh"
    export PYTHONPATH="$PWD:$PYTHONPATH"
}
has_ros() { "$PY" -c "import rclpy, wam_diff2_ros.msg, carla_msgs.msg, tf2_msgs.msg" > /dev/null 2>&1; }
[ -f "$ROS_PREFIX/env.sh" ] && ! has_ros && use_prefix
{
    echo "device_ros: $(date -u +%FT%TZ), device $DEVICE, $("$PY" --version 2>&1), project $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch, numpy; print(f'torch {torch.__version__}, numpy {numpy.__version__}')" 2>&1
    echo "cores $(env -u OMP_NUM_THREADS nproc); /dev/shm (Fast DDS's shared memory): $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 {print $2 " size, " $4 " free"}')"
} | tee "$RAW/machine.txt"

part_command() {        # the command of part $1, its rows and log in $RAW
    case $1 in
        prefix) echo "$PY scripts/ros_prefix.py unpack $ROS_WHEELS $ROS_PREFIX" ;;
        msgs) echo "$PY scripts/ros_prefix.py build $ROS_PREFIX . $ROS_WHEELS/src/ros_environment $ROS_WHEELS/src/carla_msgs $ROS_WHEELS/src/tf2_msgs" ;;
        node-random) echo "$PY scripts/node_rate.py --random $RANDOM_SHAPE --device $DEVICE --size $NODE_SIZE --rate-hz $NODE_RATE_HZ --duration-s $NODE_DURATION_S --threads $NODE_THREADS --domain-id $DOMAIN_BASE --out $RAW/node-random.jsonl" ;;
        node-demo) echo "$PY scripts/node_rate.py --model $DEMO_MODEL --device $DEVICE --size $NODE_SIZE --rate-hz $NODE_RATE_HZ --duration-s $NODE_DURATION_S --threads $NODE_THREADS --domain-id $((DOMAIN_BASE + 1)) --out $RAW/node-demo.jsonl${DEMO_PARAMS:+$(printf ' --param %s' $DEMO_PARAMS)}" ;;
        pacing) echo "$PY scripts/pacing_runs.py --model $DEMO_MODEL --device $DEVICE --routes $PACING_ROUTES --route-length-m $PACING_ROUTE_M --chunk $PACING_CHUNK --jobs $PACING_JOBS --domain-base $PACING_DOMAIN --out $RAW/pacing" ;;
        *) return 1 ;;
    esac
}

status=0
for entry in $PARTS; do
    part=${entry%%:*} bound=${entry##*:}
    left=$((TOTAL_S - SECONDS - RESERVE_S))
    [ "$bound" -gt "$left" ] && bound=$left
    if ! cmd=$(part_command "$part"); then
        echo "$part: FAILED (no such part)" | tee -a "$RAW/status.txt"; status=1; continue
    fi
    if [ "$bound" -lt 5 ]; then
        echo "$part: NOT RUN (no time left of the $TOTAL_S s)" | tee -a "$RAW/status.txt"; status=1; continue
    fi
    if { [ "$part" = prefix ] || [ "$part" = msgs ]; } && has_ros; then
        echo "$part: skipped (this Python already imports rclpy and the messages)" | tee -a "$RAW/status.txt"
        continue
    fi
    # shellcheck disable=SC2086  # the command's words
    run_part "$part" "$bound" "$OUT_DIR/device_ros.tar.gz" $cmd
    [ "$part" = prefix ] && [ -f "$ROS_PREFIX/env.sh" ] && use_prefix
    [ "$part" = msgs ] && cp "$ROS_PREFIX"/build/*.log "$RAW/" 2> /dev/null
done
"$PY" scripts/device_ros_summary.py "$RAW" --device "$DEVICE" > "$RAW/summary.txt" 2>&1 || status=1
cat "$RAW/status.txt" >> "$RAW/summary.txt"
cp "$RAW/summary.txt" "$OUT_DIR/summary.txt"
tar czf "$OUT_DIR/device_ros.tar.gz" -C "$RAW" .
cat "$OUT_DIR/summary.txt"
echo "device_ros: $([ $status -eq 0 ] && echo 'every part passed' || echo 'FAILED') ($SECONDS s)"
exit $status
