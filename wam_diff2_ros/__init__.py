"""ROS 2 nodes around wam_diff2_core. Messages: ``wam_diff2_ros.msg`` (built from msg/)."""
# Without colcon the generated message package is installed into its own prefix; extending
# __path__ lets ``wam_diff2_ros.msg`` resolve there (in a colcon install both share a folder).
from pkgutil import extend_path

import wam_diff2_core  # noqa: F401  (before torch: the OpenMP wait policy, wam_diff2_core/_openmp.py)

__path__ = extend_path(__path__, __name__)
