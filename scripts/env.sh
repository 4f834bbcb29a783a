# Source this to use the set-up environment in a shell:  . scripts/env.sh
_wd2_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
export VIRTUAL_ENV=$_wd2_root/.venv
export PATH=$VIRTUAL_ENV/bin:$PATH
export AMENT_PREFIX_PATH=$_wd2_root/install:$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}
export LD_LIBRARY_PATH=$_wd2_root/install/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RMW_IMPLEMENTATION=${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}
# The upstream interface packages (carla_msgs, derived_object_msgs) built by
# scripts/build_ros_interfaces.sh: added by hand rather than by colcon's setup.bash, whose
# ros_environment hooks would reset ROS_DISTRO and widen the discovery range.
. "$_wd2_root/scripts/ros_interfaces.sh"
_wd2_ifaces=$(wd2_ros_interfaces_dir)/install
if [ -d "$_wd2_ifaces" ]; then
  export AMENT_PREFIX_PATH=$AMENT_PREFIX_PATH:$_wd2_ifaces
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$_wd2_ifaces/lib
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$_wd2_ifaces/lib/python3.11/site-packages
fi
# DDS discovery on this machine only (tests talk over loopback; ROS 2's default is the subnet).
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
unset _wd2_root _wd2_ifaces WD2_ROS_INTERFACE_PACKAGES
unset -f wd2_ros_interfaces_dir
