"""The planner node (:mod:`.node`) and its pieces; wam_diff2_ros/planner/README.md lists them.

Nothing is imported here: the launch helpers (:mod:`.launching`) and the entry point's ``--help``
load this package without rclpy or the model.
"""
