"""Open-loop evaluation on rosbag2 recordings, without ROS; its pipeline, one module per step: README.md in
this folder.

    wam-diff2 eval-bag run.mcap --model CKPT --out eval_run/
"""
