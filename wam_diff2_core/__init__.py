"""WAM-Diff2: block-wise discrete diffusion driving VLA (the ROS-free library)."""
from wam_diff2_core._log_filters import drop_known_notices
from wam_diff2_core._openmp import passive_openmp_by_default

passive_openmp_by_default()
drop_known_notices()
