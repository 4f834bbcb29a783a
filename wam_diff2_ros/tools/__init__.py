"""The ROS package's tools, not nodes: a bag player and the demo world's closed loop over DDS.

``wam-diff2-ros replay|closed-loop`` (:mod:`.cli`, also ``python -m wam_diff2_ros.tools``);
wam_diff2_ros/tools/README.md lists the modules. Tools may import the nodes and the core; nothing
imports the tools.
"""
