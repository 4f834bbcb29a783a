"""Odometry from GNSS + IMU + speedometer (the leaderboard's SENSORS track gives no odometry); ROS-free. The
modules: README.md in this folder.
"""
