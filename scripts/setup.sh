#!/usr/bin/env bash
# One-command set-up on a machine without ROS: a .venv with torch, transformers, the ROS 2
# Kilted wheels, this package's messages (built with CMake into ./install), this package (editable)
# and the upstream carla_msgs / derived_object_msgs (colcon, into ~/.cache/wam-diff2). Idempotent:
# each step is skipped when its inputs did not change.
#   bash scripts/setup.sh            # or: make setup
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=$root/.venv
prefix=$root/install
python=${PYTHON:-python3.11}

step() { printf '[setup] %s\n' "$*"; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv with $python"
  "$python" -m venv "$venv"
fi
py=$venv/bin/python

deps_hash=$(cat requirements/*.txt setup.py | sha256sum | cut -c1-16)
if ! stamp_ok "$venv/.deps-stamp" "$deps_hash"; then
  step "installing Python dependencies (torch, transformers, ROS 2 wheels)"
  # torch's CUDA build (the one torchvision imports beside, see requirements/core.txt) makes the
  # venv about 6.2 GB: say so up front rather than let pip stop half-way with ENOSPC.
  free_kb=$(df -Pk "$venv" | awk 'NR == 2 {print $4}')
  if [ "${free_kb:-0}" -lt $((7 * 1024 * 1024)) ]; then
    printf '[setup] warning: %s MB free under %s; the dependencies need about 6200 MB\n' \
      "$((free_kb / 1024))" "$venv" >&2
  fi
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q -r requirements/core.txt -r requirements/ros.txt -r requirements/test.txt \
    -r requirements/colcon.txt
  # compat mode puts the source root on sys.path (a .pth file), so wam_diff2_ros can be
  # extended by the generated message package in $prefix (pkgutil.extend_path).
  "$py" -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=compat \
    > "$venv/.editable-install.log" 2>&1 || { cat "$venv/.editable-install.log"; exit 1; }
  echo "$deps_hash" > "$venv/.deps-stamp"
else
  step "Python dependencies up to date"
fi

# The ROS wheels' exported CMake targets name the wheel builder's include paths. The links are the machine's, not
# this checkout's: numpy's headers are linked from a copy in the cache, which outlives this venv (another checkout's
# build follows the same link).
py_include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
read -r np_version np_headers < <("$py" -c 'import numpy; print(numpy.__version__, numpy.get_include())')
np_include=${WAM_DIFF2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wam-diff2}/numpy-include/$np_version
if [ ! -d "$np_include" ]; then
  mkdir -p "$(dirname "$np_include")"
  cp -r "$np_headers" "$np_include.$$" && mv "$np_include.$$" "$np_include"
fi
quirk=/opt/python/cp311-cp311
for pair in "$quirk/include/python3.11=$py_include" \
            "$quirk/lib/python3.11/site-packages/numpy/_core/include=$np_include"; do
  link=${pair%%=*}; target=${pair#*=}
  if [ "$(readlink "$link" 2>/dev/null)" != "$target" ]; then
    mkdir -p "$(dirname "$link")"
    ln -sfn "$target" "$link"
  fi
done

msgs_hash=$(cat msg/*.msg CMakeLists.txt package.xml requirements/ros.txt | sha256sum | cut -c1-16)
site=$prefix/lib/python3.11/site-packages
if ! stamp_ok "$prefix/.msgs-stamp" "$msgs_hash"; then
  step "building msg/ with CMake into $prefix"
  rm -rf "$root/build/msgs" "$prefix"
  # CMake refuses include paths inside its source tree, and .venv lives inside this one:
  # configure a copy of the package's build files instead.
  src=$root/build/msgs-src
  rm -rf "$src" && mkdir -p "$src" && cp -r CMakeLists.txt package.xml msg "$src/"
  AMENT_PREFIX_PATH=$venv cmake -S "$src" -B "$root/build/msgs" -DWAM_DIFF2_MSGS_ONLY=ON \
    -DCMAKE_PREFIX_PATH="$venv" -DPython3_EXECUTABLE="$py" -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_INSTALL_RPATH="$prefix/lib" -DBUILD_TESTING=OFF > "$root/build/cmake.log" 2>&1 \
    || { cat "$root/build/cmake.log"; exit 1; }
  make -C "$root/build/msgs" -j"$(nproc)" install > "$root/build/make.log" 2>&1 \
    || { tail -50 "$root/build/make.log"; exit 1; }
  # The generated package root would shadow the source package; the source package
  # extends its __path__ to reach the generated wam_diff2_ros.msg instead.
  rm -f "$site/wam_diff2_ros/__init__.py"
  echo "$msgs_hash" > "$prefix/.msgs-stamp"
else
  step "messages up to date"
fi
# Message modules on sys.path after the source root; their libraries through RPATH and here.
venv_site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$venv_site/zz_wam_diff2_msgs.pth"
# The upstream interface packages the stack talks to (carla_msgs, derived_object_msgs, vision_msgs, tf2_msgs, autoware_planning_msgs), built once
# per checkout's venv outside the checkout (reused while unchanged); scripts/env.sh puts them on the paths.
step "upstream interface packages (carla_msgs, derived_object_msgs, vision_msgs, tf2_msgs, autoware_planning_msgs)"
bash "$root/scripts/build_ros_interfaces.sh"
step "done: source scripts/env.sh (or use make) to run with the messages"
