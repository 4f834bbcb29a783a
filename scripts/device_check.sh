#!/usr/bin/env bash
# The one device call (about 5 minutes on the lent H200): everything GPU-related, checked and timed.
#   1. wam-diff2 verify-device --parts probe   versions, SDPA backends with a bool mask in bf16, the token
#                                              choice captured in a CUDA graph with a registered generator;
#   2. pytest -m gpu                           the GPU tests (real CUDA graphs across calls against plain,
#                                              graph replay == eager step, FlashInfer == SDPA when it imports);
#   3. scripts/gpu_verify.sh                   tokens of every fast variant vs plain, forward / decode /
#                                              frame timings and the summary table (docs/decoding.md, "The device check").
# Exit status: 1 if any part fails (a token mismatch, a graph fallback, a probe row NO, a failed test).
# Runs on the machine as it is (the image's python3 with torch, transformers, pytest): nothing is
# installed; the call carries gpu_wheels/ (torchao for the quantized rows: bash scripts/gpu_wheels.sh here
# first), which gpu_verify.sh unpacks. Output: ${OUT:-gpu_verify_out}/ (verify.json, probe.json, pytest.log).
#
#   scripts/device_check.sh                       # on the GPU machine
#   DEVICE=cpu SHAPE=tiny scripts/device_check.sh --prompt-length 64 ...   # the same three parts on CPU (CI)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-gpu_verify_out}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
status=0
echo "== 1. probe"
"$PY" -m wam_diff2_core.cli verify-device --device "$DEVICE" --parts probe --out "$OUT_DIR/probe" || status=1
echo "== 2. pytest -m gpu"
"$PY" -m pytest -q -m gpu -p no:cacheprovider \
    test/core/decoding/test_graph_emulation.py test/core/decoding/test_static_decoder.py 2>&1 | tee "$OUT_DIR/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== 3. gpu_verify.sh"
OUT=$OUT_DIR bash scripts/gpu_verify.sh --device "$DEVICE" --shape "${SHAPE:-2b}" "$@" || status=1
echo "device_check: $([ $status -eq 0 ] && echo 'every part passed' || echo 'FAILED')"
exit $status
