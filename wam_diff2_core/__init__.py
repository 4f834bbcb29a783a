"""WAM-Diff2: block-wise discrete diffusion driving VLA (the ROS-free library)."""
from wam_diff2_core._openmp import passive_openmp_by_default

passive_openmp_by_default()
