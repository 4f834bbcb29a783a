#!/usr/bin/env bash
# Download (here, where the registry is reachable) the wheels scripts/gpu_verify.sh carries to the lent
# GPU machine, whose image has no Pillow / jinja2 / torchvision / flashinfer and no registry: Python 3.12,
# x86_64 manylinux, no dependencies resolved (the image has the rest). Into ${WHEELS:-gpu_wheels}/
# (git-ignored); the device tool carries at most 64 MiB with the working tree, so the total is printed.
#
#   scripts/gpu_wheels.sh              # Pillow, jinja2, MarkupSafe, torchvision 0.26 (torch 2.11)
#   FLASHINFER=1 scripts/gpu_wheels.sh # also flashinfer-python (its kernels need flashinfer-cubin or nvcc)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-gpu_wheels}
mkdir -p "$WHEELS"
PY=${PYTHON:-python3}
packages=(pillow jinja2 markupsafe torchvision==0.26.0)
[ "${FLASHINFER:-0}" = 1 ] && packages+=(flashinfer-python)
"$PY" -m pip download --dest "$WHEELS" --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any "${packages[@]}"
du -sh "$WHEELS"
