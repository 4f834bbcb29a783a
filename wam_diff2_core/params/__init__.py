"""The nodes' parameters as ROS-free spec tables (the files: README.md in this folder).

    python -m wam_diff2_core.params --write            # regenerate config/*.yaml and the tables
    python -m wam_diff2_core.params --check            # exit 1 when a checked-in file differs
    python -m wam_diff2_core.params --markdown controller
"""
