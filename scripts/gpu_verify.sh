#!/usr/bin/env bash
# The device check of the fast decoding paths: tokens of every fast variant vs the plain decoder
# (exit status 1 on any mismatch or graph fallback), then the table: ms per denoise forward (eager, CUDA graphs, graphs +
# FlashInfer) vs the HBM floor, graphs / eager, measured tokens per forward and ms/token, and a camera
# frame -> parsed trajectory latency through DrivingPolicy, also with 2, 4 and 8 plan candidates in one batch
# (--candidates; wam_diff2_core/cli/verify_device.py).
#
#   scripts/gpu_verify.sh [verify-device options]        # default: --device cuda --shape 2b (bf16)
#   scripts/gpu_verify.sh --device cpu --shape tiny ...   # the same run on CPU (CI: test/scripts/test_gpu_verify.py)
#
# Runs on a machine as it is: the interpreter is ${PYTHON:-python3} (the lent GPU image's system Python
# 3.12 with torch, transformers, safetensors, tokenizers, Pillow, jinja2, torchvision), nothing is
# installed and no registry is asked. Wheels put in ${WHEELS:-gpu_wheels}/ (git-ignored; scripts/gpu_wheels.sh
# downloads requirements/gpu_image.txt's there: torchao for the quant part) are unpacked into a temporary
# folder on PYTHONPATH, never installed; the device call carries that folder.
# Results: ${OUT:-gpu_verify_out}/verify.json. scripts/device_check.sh runs this after the probe and the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-gpu_wheels}
OUT_DIR=${OUT:-gpu_verify_out}
extra=""
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    extra=$(mktemp -d)
    for wheel in "$WHEELS"/*.whl; do
        "$PY" -m zipfile -e "$wheel" "$extra" || { echo "gpu_verify: cannot unpack $wheel" >&2; exit 2; }
    done
    echo "gpu_verify: wheels from $WHEELS on PYTHONPATH ($(ls "$WHEELS" | tr '\n' ' '))"
fi
export PYTHONPATH="$PWD${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout "${VERIFY_TIMEOUT_S:-480}" "$PY" -m wam_diff2_core.cli verify-device --out "$OUT_DIR" "$@"
status=$?
[ $status -eq 124 ] && echo "gpu_verify: stopped after ${VERIFY_TIMEOUT_S:-480} s" >&2
exit $status
