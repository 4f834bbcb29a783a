# Source this to use the set-up environment in a shell:  . scripts/env.sh
_wd2_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
export VIRTUAL_ENV=$_wd2_root/.venv
export PATH=$VIRTUAL_ENV/bin:$PATH
export AMENT_PREFIX_PATH=$_wd2_root/install:$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}
export LD_LIBRARY_PATH=$_wd2_root/install/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RMW_IMPLEMENTATION=${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}
unset _wd2_root
