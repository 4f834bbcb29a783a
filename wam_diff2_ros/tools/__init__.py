"""The ROS package's tools, not nodes: a bag player and the demo world's closed loop over DDS.

``wam-diff2-ros replay|closed-loop`` (:mod:`.cli`, also ``python -m wam_diff2_ros.tools``);
:mod:`.bag_player` publishes a rosbag2 bag over DDS (and records what comes back);
:mod:`.dds_closed_loop` puts the demo world behind carla-ros-bridge topics and drives it with the
planner and controller nodes. Tools may import the nodes and the core; nothing imports the tools.
"""
