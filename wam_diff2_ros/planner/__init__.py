"""The planner node (:mod:`.node`) and its pieces (README.md); nothing imported here, so launch files need no rclpy."""
