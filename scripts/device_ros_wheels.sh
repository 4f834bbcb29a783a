#!/usr/bin/env bash
# Download, here, the ROS 2 Kilted wheels a device call carries (requirements/device_ros.txt: rclpy with Fast DDS,
# the message packages the nodes import, ament_cmake and the rosidl generators that build msg/) for CPython 3.12 on
# manylinux_2_28 x86_64, without dependencies, into ${ROS_WHEELS:-device_ros_wheels}/ (git-ignored), plus the sources
# of the bridge's carla_msgs and tf2_msgs and of ros_environment (from ../shared/ros_interfaces, built there: the
# closed loop's --bridge needs them). The GPU image has no registry and no ROS: scripts/device_ros.sh unpacks the
# wheels onto a prefix there and builds the messages with CMake.
#
#   bash scripts/gpu_wheels.sh && bash scripts/device_ros_wheels.sh
#   # then: run(command="scripts/device_ros.sh", carry=["device_ros_wheels", "gpu_wheels"])
#   PY_VERSION=3.11 ROS_WHEELS=/tmp/ros311 bash scripts/device_ros_wheels.sh    # the same set for this machine's
#                                                                               # Python (a rehearsal of the prefix)
#
# Prints each wheel's size and the total; fails when a wheel is neither for that CPython nor pure Python, or when
# the folder together with ${WHEELS:-gpu_wheels}/ is over the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
ROS_WHEELS=${ROS_WHEELS:-device_ros_wheels}
GPU_WHEELS=${WHEELS:-gpu_wheels}
PY_VERSION=${PY_VERSION:-3.12}
INTERFACES=${WAM_DIFF2_ROS_INTERFACES:-../shared/ros_interfaces}
LIMIT=$((64 << 20))
# PyPI has empy (the rosidl generators' template engine) as a source archive only: its wheel (pure Python) is built
# here, so that the device side only ever unpacks wheels. The version is requirements/ros.txt's resolution.
EMPY=empy==4.2.1
PY=${PYTHON:-python3}
tag=cp${PY_VERSION/./}

[ -n "$ROS_WHEELS" ] && [ "$ROS_WHEELS" != / ] || { echo "device_ros_wheels: ROS_WHEELS is empty" >&2; exit 2; }
[ -d "$INTERFACES/carla_msgs" ] || { echo "device_ros_wheels: $INTERFACES/carla_msgs not found (set WAM_DIFF2_ROS_INTERFACES)" >&2; exit 2; }
rm -rf "$ROS_WHEELS"                 # one interpreter's set at a time
mkdir -p "$ROS_WHEELS/src"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version "$PY_VERSION" --implementation cp -r requirements/device_ros.txt -d "$ROS_WHEELS"
"$PY" -m pip wheel --quiet --no-deps --no-binary empy "$EMPY" -w "$ROS_WHEELS"
for wheel in "$ROS_WHEELS"/*.whl; do
    case "$wheel" in
        *-$tag-$tag-manylinux*_x86_64.whl|*-none-any.whl) ;;
        *) echo "device_ros_wheels: $wheel is neither a $tag manylinux x86_64 wheel nor pure Python" >&2; exit 1 ;;
    esac
done
for pkg in build_support/ros_environment carla_msgs tf2_msgs; do
    cp -r "$INTERFACES/$pkg" "$ROS_WHEELS/src/"      # copies of the unchanged upstream packages, never committed
    chmod -R u+w "$ROS_WHEELS/src/$(basename "$pkg")"
done

echo "device_ros_wheels: $(ls "$ROS_WHEELS"/*.whl | wc -l) wheels for $tag in $ROS_WHEELS/ (bytes, largest first):"
for wheel in "$ROS_WHEELS"/*.whl; do
    printf '%10d  %s\n' "$(stat -c %s "$wheel")" "$(basename "$wheel")"
done | sort -rn
ros_size=$(du -sb "$ROS_WHEELS" | cut -f1)
sources=$(du -sb "$ROS_WHEELS/src" | cut -f1)
gpu_size=0
[ -d "$GPU_WHEELS" ] && gpu_size=$(du -sb "$GPU_WHEELS" | cut -f1)
total=$((ros_size + gpu_size))
printf 'device_ros_wheels: %s/ holds %d bytes (%.1f MiB; the interface sources %d bytes); with %s/ (%d bytes): %d bytes (%.1f MiB) of the %d MiB a call carries\n' \
    "$ROS_WHEELS" "$ros_size" "$(echo "$ros_size / 1048576" | bc -l)" "$sources" "$GPU_WHEELS" "$gpu_size" "$total" \
    "$(echo "$total / 1048576" | bc -l)" $((LIMIT >> 20))
if [ "$total" -gt "$LIMIT" ]; then
    echo "device_ros_wheels: $total bytes, over the 64 MiB a device call carries" >&2
    exit 1
fi
