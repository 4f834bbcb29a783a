#!/usr/bin/env bash
# Download the wheels of requirements/gpu_image.txt (pure-Python builds only, no dependencies) into
# ${WHEELS:-gpu_wheels}/, here, before a device call that carries that folder (the GPU image has no registry):
#
#   bash scripts/gpu_wheels.sh          # then: run(command="scripts/device_check.sh", carry=["gpu_wheels"])
#
# Fails when a wheel is not pure Python or the folder exceeds the 64 MiB a device call may carry.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-gpu_wheels}
mkdir -p "$WHEELS"
${PYTHON:-python3} -m pip download --quiet --no-deps --only-binary=:all: --platform any --python-version 3.12 \
    -r requirements/gpu_image.txt -d "$WHEELS"
for wheel in "$WHEELS"/*.whl; do
    case "$wheel" in *-none-any.whl) ;; *) echo "gpu_wheels: $wheel is not pure Python" >&2; exit 1 ;; esac
done
size=$(du -sb "$WHEELS" | cut -f1)
[ "$size" -le $((64 << 20)) ] || { echo "gpu_wheels: $size bytes, over the 64 MiB a device call carries" >&2; exit 1; }
echo "gpu_wheels: $(ls "$WHEELS" | tr '\n' ' ')($size bytes) in $WHEELS/"
