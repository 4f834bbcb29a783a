#!/usr/bin/env bash
# Builds the upstream ROS 2 interface packages this project talks to (carla_msgs of the
# Leaderboard 2.0 bridge, carla-ros-bridge's derived_object_msgs) from ../shared/ros_interfaces/
# with the real `colcon build` of the venv, once per checkout's venv, outside the checkout:
#   ${XDG_CACHE_HOME:-~/.cache}/wam-diff2/ros-interfaces/<hash>/   (WAM_DIFF2_CACHE moves it)
# The hash covers the package folders, the venv's ROS wheels and path, and this script (scripts/ros_interfaces.sh),
# so an unchanged set is reused. The build runs in a temporary folder renamed at the end: a killed
# build leaves no half workspace under the final name. scripts/env.sh puts the result on the paths.
#   bash scripts/build_ros_interfaces.sh        # run by scripts/setup.sh; 5-10 min the first time on 2 cores
set -euo pipefail
_wd2_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$_wd2_root/scripts/ros_interfaces.sh"
venv=$_wd2_root/.venv
shared=${WAM_DIFF2_ROS_INTERFACES:-$_wd2_root/../shared/ros_interfaces}
step() { printf '[ros-interfaces] %s\n' "$*"; }

if [ ! -d "$shared/carla_msgs" ]; then
  echo "[ros-interfaces] error: $shared/carla_msgs not found: the upstream interface packages are expected in ../shared/ros_interfaces beside the checkout (or set WAM_DIFF2_ROS_INTERFACES)" >&2
  exit 1
fi
final=$(wd2_ros_interfaces_dir)
log=$final.log
if [ -d "$final/install" ]; then
  step "up to date: $final"
  exit 0
fi
mkdir -p "$(dirname "$final")"
tmp=$(mktemp -d "$final.partial.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
for pkg in $WD2_ROS_INTERFACE_PACKAGES; do
  cp -r "$shared/$pkg" "$tmp/src/"          # copies: colcon and CMake write nothing into shared/
  chmod -R u+w "$tmp/src/$(basename "$pkg")"
done
step "building $WD2_ROS_INTERFACE_PACKAGES with colcon into $final (log: $log)"
# ROS_VERSION=2: both packages choose their ROS 2 dependencies by it in package.xml and CMake.
# ROS_DISTRO_OVERRIDE: ros_environment would otherwise record "rolling" as the distribution.
# --merge-install: one prefix (lib/, share/, site-packages) for scripts/env.sh to add.
if ! (cd "$tmp" && env ROS_VERSION=2 ROS_DISTRO_OVERRIDE=kilted AMENT_PREFIX_PATH="$venv" VIRTUAL_ENV="$venv" \
      PATH="$venv/bin:$PATH" "$venv/bin/python" -m colcon build --merge-install \
      --cmake-args -DBUILD_TESTING=OFF > "$log" 2>&1); then
  tail -40 "$log" >&2
  echo "[ros-interfaces] error: colcon build failed (the whole log: $log)" >&2
  exit 1
fi
rm -rf "$tmp/build" "$tmp/src"
# colcon's shell scripts and the ament index name the prefix they were built in: name the final one
# (text files only: -I; a .pyc names it too, only for tracebacks, and an edit would corrupt it)
grep -rlIF "$tmp" "$tmp/install" | xargs -r sed -i "s|$tmp|$final|g"
# Another set-up may have finished the same build meanwhile: then keep that one.
if mv -T "$tmp" "$final" 2>/dev/null; then
  trap - EXIT
  step "built: $final/install"
else
  step "built by another set-up meanwhile: $final/install"
fi
