"""NAVSIM v1's PDM score of a plan, ROS-free: the scene a plan is scored against (``scene``), the ego
tracking it for 4 s (``tracking``), the comfort checks (``comfort``) and the sub-scores and their
aggregate (``score``). Below the policy, so the planner can score its own candidates too.

    from wam_diff2_core.pdm.scene import Area, AgentTrack, EgoStart, PdmScene
    from wam_diff2_core.pdm.score import pdm_score

    result = pdm_score(plan, EgoStart(speed_mps=8.0), scene, reference_progress_m=32.0)
"""
