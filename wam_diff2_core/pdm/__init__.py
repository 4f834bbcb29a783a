"""NAVSIM v1's PDM score of a plan, ROS-free, below the policy so the planner can score its own candidates too
(the modules: README.md in this folder).

    result = pdm_score(plan, EgoStart(speed_mps=8.0), scene, reference_progress_m=32.0)    # pdm.score, pdm.scene
"""
