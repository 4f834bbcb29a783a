"""The shipped demo models (models/) and the README's main job (scripts/demo.sh) on a short bag."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from test.support import REPO_ROOT as ROOT
from test.support.ros_helpers import unique_domain_id
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.policy import DrivingPolicy
from wam_diff2_core.sim import EpisodeSettings, simulate_episode
from wam_diff2_core.sim.protocol import DEMO_DRIVE_SEED

MODELS = {"ar": ROOT / "models" / "wam-diff2-demo-ar", "block32": ROOT / "models" / "wam-diff2-demo-b32"}
CI_ROUTE = 0              # closed-loop route 0 (DEFAULT_ROUTE_SEED), 60 m: starts at 6.2 m/s


@pytest.fixture(scope="module")
def held_out_frames():
    episode = simulate_episode(DEMO_DRIVE_SEED, 0, EpisodeSettings(frames=6, frame_stride=20))
    return list(episode.frames())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shipped_demo_model_loads_and_plans_from_what_it_sees(name, held_out_frames):
    """Held-out frames: every answer parses, and the first waypoint agrees with the ego's speed (a
    random model's does not). Quality against the baselines is the benchmark's (models/README.md)."""
    weights = MODELS[name] / "model.safetensors"
    assert weights.stat().st_size < 12e6          # bf16, a few million parameters
    policy = DrivingPolicy.from_checkpoint(MODELS[name], device="cpu")
    assert policy.settings.block_size == (1 if name == "ar" else 32)
    for frame in held_out_frames:
        t = frame.truth
        out = policy.step(frame.rgb, EgoMotion(velocity=t.velocity, acceleration=t.acceleration_estimated), t.command)
        assert out.plan.valid, out.plan.raw_text
        waypoints = np.asarray(out.plan.waypoints)
        assert abs(waypoints[0, 0] - 0.5 * t.velocity[0]) < 1.0 and abs(waypoints[0, 1]) < 1.0
        assert np.all(np.diff(waypoints[:, 0]) > -0.5)            # it drives forward
        if name == "block32":      # parallel decoding: well under one forward per token
            assert out.plan.stats.forwards <= 0.6 * out.plan.stats.tokens


def test_block32_answer_that_does_not_parse_is_recovered_by_the_parse_retry():
    """A held-out right turn (the demo drive's seed, episode 2, frame 18) where the Block-32 model's parallel
    digits come out malformed; decoded again left to right (``parse_retry``), the answer parses and
    turns right with the expert."""
    frame = list(simulate_episode(DEMO_DRIVE_SEED, 2, EpisodeSettings(frames=19, frame_stride=5)).frames())[18]
    t = frame.truth
    ego = EgoMotion(velocity=t.velocity, acceleration=t.acceleration_estimated)
    plain = DrivingPolicy.from_checkpoint(MODELS["block32"], device="cpu", parse_retry="none")
    first = plain.step(frame.rgb, ego, t.command).plan
    assert t.command == "right" and not first.valid and first.stats.retries == 0, first.raw_text

    plan = DrivingPolicy(plain.loaded, parse_retry="sequential").step(frame.rgb, ego, t.command).plan
    assert plan.valid and plan.stats.retries == 1, plan.raw_text
    assert plan.stats.forwards > first.stats.forwards        # both decodes are counted
    assert plan.waypoints[-1, 1] < -1.0 and t.waypoints[-1, 1] < -1.0
    constant_velocity = np.array([4.0 * t.velocity[0], 0.0])     # where the car would be at 4 s
    error = np.linalg.norm(plan.waypoints[-1] - t.waypoints[-1])
    assert error < 0.5 * np.linalg.norm(constant_velocity - t.waypoints[-1]), (error, plan.raw_text)


@pytest.mark.parametrize("name,detect_every", [("block32", None), ("ar", "0")])
def test_demo_script_drives_the_node_over_dds_and_scores_what_it_published(tmp_path, name, detect_every):
    """scripts/demo.sh (make demo, and MODEL=models/wam-diff2-demo-ar DETECT_EVERY=0 make demo) on a 12-frame
    held-out bag: planner node + replay + eval-bag --predictions; the node decodes with each checkpoint's own
    settings (config/planner.yaml leaves decoding.* unset), and publishes boxes unless DETECT_EVERY is 0."""
    env = dict(os.environ, OUT=str(tmp_path / "demo"), FRAMES="12", RATE="0.2",     # slow: a loaded CI machine
               MODEL=str(MODELS[name]), ROS_DOMAIN_ID=str(unique_domain_id(7)))
    env.pop("DETECT_EVERY", None)
    if detect_every is not None:
        env["DETECT_EVERY"] = detect_every
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "demo" / "eval" / "metrics.json").read_text())
    counts = metrics["counts"]
    assert counts["evaluated"] >= 3 and counts["valid"] == counts["evaluated"]
    assert "L2" in proc.stdout and str(tmp_path / "demo" / "eval") in proc.stdout
    # boxes on every 10th frame it answers (DETECT_EVERY), scored by COCO AP from what the node published; the
    # demo models were trained on planning only, so their detect answers do not parse (AP 0: docs/limits.md)
    detection = metrics["detection"]
    if detect_every == "0":                                   # plans only
        assert detection["counts"]["messages"] == 0
        assert ", tasks plan," in (tmp_path / "demo" / "planner.log").read_text()
    else:
        assert 1 <= detection["counts"]["messages"] == detection["counts"]["matched"]
        assert ", tasks plan+detect," in (tmp_path / "demo" / "planner.log").read_text()
        assert detection["scores"]["truth_boxes"] > 0 and detection["scores"]["ap"] is not None
        assert re.search(r"the node's boxes: \d+ frames scored of \d+ messages; COCO AP \d\.\d{3}",
                         proc.stdout), proc.stdout[-3000:]
    # the bag's other vehicles go out as derived_object_msgs (the planner's ~/input/objects is remapped to them)
    published = re.search(r"published \d+ messages \((.*?)\)", proc.stdout)
    assert published and re.search(r"/carla/ego_vehicle/objects [1-9]", published.group(1)), proc.stdout[-3000:]
    assert "not importable" not in proc.stdout + proc.stderr
    planner_log = (tmp_path / "demo" / "planner.log").read_text()
    expected = "block_size=32" if name == "block32" else "block_size=1"
    assert f"decoding settings: {expected}" in planner_log, planner_log[-2000:]


@pytest.mark.parametrize("value", ["x", "-1", "2.5"])
def test_demo_script_refuses_a_detect_every_that_is_not_a_whole_number(tmp_path, value):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OUT=str(tmp_path / "demo"), DETECT_EVERY=value))
    assert proc.returncode == 2 and f"DETECT_EVERY must be a whole number (0 = no boxes), got '{value}'" in proc.stderr
    assert not (tmp_path / "demo").exists()


def test_demo_model_completes_a_short_route_in_closed_loop():
    """The Block-32 demo model + the controller (the nodes' code, in one process) complete a short
    route of the demo world in their lane."""
    from wam_diff2_core.sim.direct_loop import demo_world_gains, drive_direct
    from wam_diff2_core.sim.route_planners import PolicyPlanner
    from wam_diff2_core.sim.route_runs import ClosedLoopSettings, RouteRun
    run = RouteRun(CI_ROUTE, ClosedLoopSettings(route_length_m=60.0))
    policy = DrivingPolicy.from_checkpoint(MODELS["block32"], device="cpu")
    result = drive_direct(run, PolicyPlanner(policy), demo_world_gains())
    assert result.termination == "completed", result
    assert result.lane_departures == 0 and result.collisions == []


def test_engine_cpu_threads_sets_torch_intra_op_threads(tiny_checkpoint):
    """In a child process: the thread count is process-wide and other tests' numerics depend on it. 0 (the
    default) takes OMP_NUM_THREADS when set (else the process's CPU affinity: config.default_cpu_threads)."""
    code = (
        "import sys, torch\n"
        "from wam_diff2_core.config import EngineSettings\n"
        "from wam_diff2_core.model.checkpoint import load_checkpoint\n"
        "from wam_diff2_core.policy import DrivingPolicy\n"
        "loaded = load_checkpoint(sys.argv[1], device='cpu')\n"
        "torch.set_num_threads(2); DrivingPolicy(loaded, engine=EngineSettings(cpu_threads=1))\n"
        "one = torch.get_num_threads()\n"
        "torch.set_num_threads(2); DrivingPolicy(loaded, engine=EngineSettings())\n"
        "print(one, torch.get_num_threads())\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_checkpoint)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "3"]
