#!/usr/bin/env bash
# The one device call: every part of the device check, each its own process under its own time bound, at most
# 300 s in all (the bounds below add up to 285 s; a part stopped at its bound gets 5 s more to die); then the
# one table. On the lent GPU image as it is (system
# python3 3.12 with torch, transformers, pytest): nothing is installed; the wheels in ${WHEELS:-gpu_wheels}/
# (bash scripts/gpu_wheels.sh here first; the call carries that folder) are unpacked onto PYTHONPATH
# (scripts/device_parts.sh: what this and scripts/device_ros.sh share).
#
#   scripts/device_check.sh                                         # on the GPU machine: the 2B shape, bf16
#   DEVICE=cpu SHAPE=tiny scripts/device_check.sh --prompt-length 64 ...   # its CPU twin (CI: test/scripts/test_device_check.py)
#   PARTS="tokens:60 forward:40" scripts/device_check.sh            # some parts, other bounds
#
# Parts (wam-diff2 verify-device --parts P, wam_diff2_core/cli/verify_device.py; "tests" is pytest -m gpu):
# probe, tests, tokens, forward, decode, frame, profile, compiled, quant. Each writes its rows as they are
# measured, so a part stopped at its bound leaves what it had. After every part the raw results are packed into
# ${OUT:-device_check_out}/device_check.tar.gz (each part's .jsonl and .log, status.txt), beside summary.txt at
# the end: two files, as a device call brings back at most eight.
# Exit status 1 if a part fails (a token mismatch, a graph fallback, a probe row NO, a failed test) or is stopped
# at its bound.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-device_check_out}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-2b}
PARTS=${PARTS:-"probe:15 tests:40 tokens:45 forward:40 decode:20 frame:40 profile:25 compiled:40 quant:20"}
mkdir -p "$OUT_DIR"
. scripts/device_parts.sh
device_wheels "${WHEELS:-gpu_wheels}"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
for entry in $PARTS; do
    part=${entry%%:*} bound=${entry##*:}
    if [ "$part" = tests ]; then
        run_part tests "$bound" "$OUT_DIR/device_check.tar.gz" "$PY" -m pytest -q -m gpu -p no:cacheprovider \
            test/core/decoding/test_graph_emulation.py test/core/decoding/test_static_decoder.py \
            test/core/decoding/test_layer_ops.py
    else
        run_part "$part" "$bound" "$OUT_DIR/device_check.tar.gz" "$PY" -m wam_diff2_core.cli verify-device \
            --device "$DEVICE" --shape "$SHAPE" --parts "$part" --out "$RAW" "$@"
    fi
done
"$PY" -m wam_diff2_core.cli verify-device --summary "$RAW" > "$RAW/summary.txt" 2>&1 || status=1
cat "$RAW/status.txt" >> "$RAW/summary.txt"
cp "$RAW/summary.txt" "$OUT_DIR/summary.txt"
tar czf "$OUT_DIR/device_check.tar.gz" -C "$RAW" .
cat "$OUT_DIR/summary.txt"
echo "device_check: $([ $status -eq 0 ] && echo 'every part passed' || echo 'FAILED') ($SECONDS s)"
exit $status
