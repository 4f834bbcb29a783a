"""The nodes' parameters as ROS-free spec tables: one parameter system for the planner, the
controller and the localization node, read by the nodes (``wam_diff2_ros.parameters`` declares them
with descriptors), the evaluator (``wam-diff2 eval-bag --params-file`` names the planner's), the
generated YAML files in config/ and the README / docs tables.

    python -m wam_diff2_core.params --write            # regenerate config/*.yaml and the tables
    python -m wam_diff2_core.params --check            # exit 1 when a checked-in file differs
    python -m wam_diff2_core.params --markdown controller

``spec.py``: the spec type, the one validator, the table and YAML writers; ``planner.py``,
``controller.py``, ``localization.py``: the tables; ``generated.py``: which file holds which.
"""
