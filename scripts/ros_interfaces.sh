# Sourced by scripts/build_ros_interfaces.sh and scripts/env.sh: where the upstream interface
# packages (carla_msgs, derived_object_msgs, vision_msgs, tf2_msgs, autoware_planning_msgs) are built
# for this checkout. The folder's name is a
# hash of what the build reads (the package folders, the venv's ROS wheels and path, the build script),
# so a change to any of them means a new build and an unchanged set reuses the old one.
#   _wd2_root must be set (the checkout); defines wd2_ros_interfaces_dir (prints that folder, whose
#   install/ is the prefix, or nothing when ../shared/ros_interfaces is not beside the checkout).

# What is built (colcon orders them): the CMake helpers the Kilted wheels lack, then the interface
# packages the nodes and tests talk to (the bridge's, vision_msgs' detections, /tf, Autoware's trajectory).
WD2_ROS_INTERFACE_PACKAGES="build_support/ros_environment build_support/ament_cmake_auto carla_msgs derived_object_msgs
  vision_msgs tf2_msgs autoware_common_msgs autoware_planning_msgs"

wd2_ros_interfaces_dir() {
  local shared=${WAM_DIFF2_ROS_INTERFACES:-$_wd2_root/../shared/ros_interfaces}
  [ -d "$shared/carla_msgs" ] || return 0
  local venv_site=$_wd2_root/.venv/lib/python3.11/site-packages key
  key=$(
    cd "$shared" && for pkg in $WD2_ROS_INTERFACE_PACKAGES; do
      find "$pkg" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    done
    # the ROS wheels they are generated against (name and version, from the dist-info folders)
    ls "$venv_site" 2>/dev/null | grep -E '^ros_.*\.dist-info$'
    sha256sum < "$_wd2_root/scripts/build_ros_interfaces.sh"
    # the venv itself: the build records its paths (numpy's include folder, the parent prefixes), so a
    # build made for another checkout's venv would break this one's msg/ build once that venv is gone
    printf '%s\n' "$(cd "$_wd2_root" && pwd -P)/.venv"      # physical: one key however the path is spelled
  )
  key=$(printf '%s' "$key" | sha256sum | cut -c1-16)
  printf '%s/ros-interfaces/%s\n' "${WAM_DIFF2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wam-diff2}" "$key"
}
