"""Candidate selection in the direct closed loop: ``wam-diff2 closed-loop --candidates N`` and the online
scene of a live route (``sim.pdm_scenes.world_online_scene``)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from wam_diff2_core.geometry import world_to_ego
from wam_diff2_core.sim.pdm_scenes import world_online_scene
from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun


def _route_with_traffic(settings: ClosedLoopSettings) -> RouteRun:
    """The first route of ``settings`` whose world has vehicles at the start."""
    for index in range(10):
        run = RouteRun(index, settings)
        if run.world.vehicle_boxes():
            return run
    raise AssertionError("no route of the first 10 has traffic at its start")


def test_world_online_scene_has_the_worlds_vehicles_and_the_route():
    run = _route_with_traffic(ClosedLoopSettings(traffic=True))
    ego = run.world.ego
    boxes = run.world.vehicle_boxes()
    scene = world_online_scene(run, lane_width_m=3.0)
    agents = scene.scene.agents
    assert [a.name for a in agents] == [f"{b.label} {b.id}" for b in boxes]
    for agent, box in zip(agents, boxes):
        # now: the box where the world has it (ego frame); 1 s later: moved on at its speed along its heading
        now = world_to_ego(np.array([[box.x, box.y]]), np.array([ego.x, ego.y]), ego.yaw)[0]
        np.testing.assert_allclose(agent.xy[0], now, atol=1e-9)
        assert np.hypot(*(agent.xy[10] - agent.xy[0])) == pytest.approx(box.speed * 1.0, abs=1e-6)
        assert (agent.length_m, agent.width_m) == (box.length_m, box.width_m)
    # the route as published, a 3 m corridor around it: the ego stands on it, 10 m ahead along it is drivable,
    # 3 m to the side is not
    route = world_to_ego(run.route_xy(), np.array([ego.x, ego.y]), ego.yaw)
    assert np.hypot(*scene.scene.centreline.T).min() < 0.5
    forward = route[route[:, 0] > 0]
    ahead = forward[np.argmin(np.abs(np.hypot(*forward.T) - 10.0))]
    assert scene.scene.drivable.contains(np.array([[0.0, 0.0], ahead])).all()
    assert not scene.scene.drivable.contains(np.array([[0.0, 3.0], [0.0, -3.0]])).any()
    assert scene.ego.speed_mps == pytest.approx(ego.speed) and scene.ego.acceleration_mps2 == run.acceleration[0]
    with pytest.raises(ValueError, match="lane_width_m"):
        world_online_scene(run, lane_width_m=0.0)


def test_closed_loop_with_candidates_drives_a_route_and_records_the_setting(tiny_checkpoint, tmp_path, monkeypatch):
    """The random tiny model with 2 candidates: each planning tick decodes both rows against the route's online
    scene (the world's vehicles among its agents); none parses, so the valid-candidate mean is 0."""
    from wam_diff2_core.cli import main
    from wam_diff2_core.policy import DrivingPolicy

    settings = ClosedLoopSettings(traffic=True, route_length_m=5.0)      # the command's routes below
    index = _route_with_traffic(settings).index
    scenes = []
    step = DrivingPolicy.step

    def recording_step(self, *args, **kwargs):
        scenes.append(kwargs.get("scene"))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(DrivingPolicy, "step", recording_step)
    out = tmp_path / "cl"
    assert main(["closed-loop", "--model", str(tiny_checkpoint), "--device", "cpu", "--max-new-tokens", "32",
                 "--parse-retry", "none", "--traffic", "--first-route", str(index), "--routes", "1", "--route-length-m", "5", "--no-plots",
                 "--no-pdm", "--candidates", "2", "--candidate-top-p", "0.9", "--lane-width-m", "3.0",
                 "--out", str(out)]) == 0
    record = json.loads((out / "summary.json").read_text())
    assert record["settings"]["candidates"] == {"count": 2, "temperature": 1.0, "top_p": 0.9, "seed": 0,
                                                "lane_width_m": 3.0, "progress_reference": "best"}
    result = record["results"][0]
    assert result["plans"] == len(scenes) > 0 and result["plans_valid"] == 0
    assert result["extra"]["valid_candidates_mean"] == 0.0
    assert all(s is not None and math.isfinite(s.ego.speed_mps) for s in scenes)
    assert len(scenes[0].scene.agents) == len(RouteRun(index, settings).world.vehicle_boxes()) > 0


def test_closed_loop_without_candidates_records_one_and_passes_no_scene(tiny_checkpoint, tmp_path, monkeypatch):
    from wam_diff2_core.cli import main
    from wam_diff2_core.policy import DrivingPolicy

    scenes = []
    step = DrivingPolicy.step
    monkeypatch.setattr(DrivingPolicy, "step",
                        lambda self, *a, **k: (scenes.append(k.get("scene")), step(self, *a, **k))[1])
    out = tmp_path / "cl"
    assert main(["closed-loop", "--model", str(tiny_checkpoint), "--device", "cpu", "--max-new-tokens", "32",
                 "--parse-retry", "none", "--routes", "1", "--route-length-m", "5", "--no-plots", "--no-pdm",
                 "--out", str(out)]) == 0
    record = json.loads((out / "summary.json").read_text())
    assert record["settings"]["candidates"]["count"] == 1 and "valid_candidates_mean" not in record["results"][0]["extra"]
    assert scenes and all(s is None for s in scenes)


@pytest.mark.parametrize("flags, message", [
    (["--candidates", "0"], "candidates: must be an integer from 1 to 16, got 0"),
    (["--candidates", "17"], "candidates: must be an integer from 1 to 16, got 17"),
    (["--candidates", "2", "--candidate-top-p", "0"], "candidate top_p: must be in (0, 1], got 0.0"),
    (["--candidates", "2", "--lane-width-m", "-1"], "lane_width_m (--lane-width-m): must be a finite width > 0"),
])
def test_bad_candidate_options_are_refused_by_name(flags, message, tmp_path, capsys):
    from wam_diff2_core.cli import main

    out = tmp_path / "cl"
    assert main(["closed-loop", "--model", str(tmp_path / "no_model"), *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "wam-diff2 closed-loop: error: --candidates / --candidate-*: " in err and message in err
    assert not out.exists()


def test_the_oracle_takes_no_candidates(tmp_path, capsys):
    from wam_diff2_core.cli import main

    assert main(["closed-loop", "--oracle", "--candidates", "2", "--out", str(tmp_path / "cl")]) == 2
    assert "--candidates 2: candidate selection needs --model" in capsys.readouterr().err
    assert not (tmp_path / "cl").exists()
