"""Open-loop evaluation on rosbag2 recordings, without ROS.

The pipeline, one module per step:

- :mod:`.bag`          open a bag (sqlite3 / mcap, folder or file), its types, its messages;
- :mod:`.ground_truth` recorded odometry -> the future waypoints at +0.5 ... +4.0 s, ego frame;
- :mod:`.runner`       pick the frames, run ``DrivingPolicy.step`` on them, score them;
- :mod:`.metrics`      L2 (UniAD "at t" and ST-P3 / VAD "averaged to t"), ADE/FDE, per-waypoint curve,
                       parse failures, decode statistics, latency; per command and overall;
- :mod:`.report`       ``metrics.json``, ``report.md``, plots, ``--compare``; atomic;
- :mod:`.record`       predictions as the package's ``Trajectory`` messages into a bag;
- :mod:`.scenes`       small carla-like bags with exact ground truth and a scripted policy (tests, demos).

The inputs of a frame (ego state, command) come from :mod:`wam_diff2_core.frame_inputs`, the code the
planner node derives them with. See README.md in this folder.

    wam-diff2 eval-bag run.mcap --model CKPT --out eval_run/
"""
