"""The ROS package's tools, not nodes (``wam-diff2-ros``, :mod:`.cli`): wam_diff2_ros/tools/README.md lists them."""
