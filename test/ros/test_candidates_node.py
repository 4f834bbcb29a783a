"""Candidate selection in the planner node over real DDS (rclpy + Fast DDS, the real derived_object_msgs).

A held-out demo-world frame goes to a planner running the demo Block-32 model with ``candidates.count`` 8
(row 1 greedy, rows 2..8 sampled). The same frame is first decoded here by the core policy with the
same settings, which gives the eight candidates the node will see; a parked vehicle is then placed on
the greedy plan's path, just past where it ends, and sent on ``~/input/objects`` as carla-ros-bridge's
``ObjectArray``. The scorer confirms that the greedy plan hits it and that at least one candidate does
not; the node must then publish a candidate that does not (not the greedy one), and its diagnostics
must carry the selection (candidates, valid candidates, the selected candidate and its PDMS).
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wam_diff2_core.candidate_selection import CandidateSettings, TrackedObject, online_scene  # noqa: E402
from wam_diff2_core.geometry import EgoMotion  # noqa: E402
from wam_diff2_core.model.checkpoint import load_checkpoint  # noqa: E402
from wam_diff2_core.policy import DrivingPolicy  # noqa: E402
from wam_diff2_ros import conversions as conv  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.planner.interface import INPUT_TOPICS  # noqa: E402
from wam_diff2_ros.planner.node import PlannerNode  # noqa: E402
from test.support.ros_helpers import planner_and_probe, route_msg, ros_context  # noqa: E402
from test.support.ros_packages import interface_module  # noqa: E402

pytestmark = pytest.mark.ros
DEMO_B32 = ROOT / "models" / "wam-diff2-demo-b32"
NODE = "candidates_planner"
SPEED = 5.0                      # the probe's odometry: straight along +x of map at 5 m/s, no acceleration
CANDIDATES = CandidateSettings(count=8, temperature=2.0, top_p=1.0, seed=0)
ROUTE = np.stack([np.linspace(-50.0, 300.0, 351), np.zeros(351)], axis=1)
CAR = dict(length_m=4.5, width_m=1.85, height_m=1.5)
READY_S, ANSWER_S = 180.0, 180.0


@pytest.fixture(scope="module")
def frame():
    from wam_diff2_core.sim.episode import EpisodeSettings, simulate_episode
    episode = simulate_episode(seed=1000, index=0, settings=EpisodeSettings(frames=10))   # held out: never trained on
    return list(episode.frames())[8].rgb


@pytest.fixture(scope="module")
def candidates(frame):
    """The eight candidates of this frame as the node decodes them (same model, settings, prompt, one thread)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = DrivingPolicy(load_checkpoint(DEMO_B32, device="cpu", dtype="float32"), candidates=CANDIDATES)
        out = policy.step(frame, EgoMotion(velocity=(SPEED, 0.0), acceleration=(0.0, 0.0)), "straight")
    finally:
        torch.set_num_threads(threads)
    return [c.waypoints if c.valid else None for c in out.plan_candidates]


def _object_array(derived_object_msgs, stamp_ns: int, x: float, y: float, yaw: float):
    msg = derived_object_msgs.ObjectArray(header=Header(stamp=conv.ns_to_stamp(stamp_ns), frame_id="map"))
    obj = derived_object_msgs.Object(header=msg.header, id=7)
    obj.pose.position.x, obj.pose.position.y, obj.pose.position.z = x, y, CAR["height_m"] / 2
    obj.pose.orientation.z, obj.pose.orientation.w = math.sin(yaw / 2), math.cos(yaw / 2)
    obj.shape.type = 1                                                       # BOX: [length, width, height]
    obj.shape.dimensions = [CAR["length_m"], CAR["width_m"], CAR["height_m"]]
    msg.objects.append(obj)
    return msg


@pytest.fixture(scope="module")
def planner():
    with ros_context(7) as context:
        node = PlannerNode(node_name=NODE, context=context,
                           cli_args=["--ros-args", "--params-file", str(ROOT / "config" / "planner.yaml")],
                           parameter_overrides=[Parameter(k, value=v) for k, v in {
                               "model_path": str(DEMO_B32), "device": "cpu", "dtype": "float32", "warmup": False,
                               "engine.cpu_threads": 1, "image_timeout_s": 3600.0, "debug.publish_image": False,
                               "debug.publish_markers": False, "candidates.count": CANDIDATES.count,
                               "candidates.temperature": CANDIDATES.temperature, "candidates.top_p": CANDIDATES.top_p,
                               "candidates.seed": CANDIDATES.seed, "diagnostics_period_s": 0.2}.items()])
        with planner_and_probe(context, node, "candidates_probe") as (node, probe):
            probe.odometry_pose.update(vx=SPEED)
            yield node, probe


def test_a_frame_whose_greedy_plan_hits_a_recorded_vehicle_gets_a_candidate_that_does_not(candidates, frame, planner):
    derived_object_msgs = interface_module("derived_object_msgs")
    greedy = candidates[0]
    assert greedy is not None, "the demo model's greedy plan of this frame must parse"
    # a parked car centred 2 m past the greedy plan's last waypoint, along its last heading
    heading = math.atan2(*(greedy[-1] - greedy[-2])[::-1])
    car_x, car_y = greedy[-1] + 2.0 * np.array([math.cos(heading), math.sin(heading)])
    scene = online_scene((0.0, 0.0), 0.0, SPEED, route_xy=ROUTE, lane_width_m=CANDIDATES.lane_width_m,
                         objects=[TrackedObject(car_x, car_y, heading, length_m=CAR["length_m"],
                                                width_m=CAR["width_m"])])
    scores = scene.score_all(candidates)
    clear = [i for i, r in enumerate(scores) if r is not None and r.nc == 1.0]
    assert scores[0].nc == 0.0, "the greedy plan must hit the placed car"
    assert clear, f"no candidate misses the car here: {[None if r is None else r.nc for r in scores]}"

    node, probe = planner
    assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), READY_S), probe.messages("status")
    objects_pub = probe.create_publisher(derived_object_msgs.ObjectArray, probe.topic(INPUT_TOPICS["objects"]),
                                         qos_profile_sensor_data)
    probe.route_pub.publish(route_msg(ROUTE))
    assert probe.wait_for(lambda: probe.count_subscribers(objects_pub.topic_name) == 1, 10.0)
    stamp = probe.now_ns()
    for _ in range(5):                                  # best effort: more than once
        objects_pub.publish(_object_array(derived_object_msgs, stamp, float(car_x), float(car_y), heading))
        time.sleep(0.05)
    probe.image_pub.publish(conv.rgb_image_msg(frame, Header(stamp=conv.ns_to_stamp(stamp), frame_id="camera")))
    found = probe.wait_for(lambda: probe.with_stamp("trajectory", stamp), ANSWER_S)
    assert found, f"no trajectory; status: {probe.messages('status')[-1:]}"
    trajectory = found[-1]
    assert trajectory.valid and trajectory.command == "straight"
    published = np.array([[p.x, p.y] for p in trajectory.points])
    same = [i for i, c in enumerate(candidates) if c is not None and np.allclose(published, c, atol=1e-6)]
    assert same, "the node's plan is none of the candidates decoded here"
    assert set(same) <= set(clear) and 0 not in same                 # not the greedy plan: one that misses the car
    assert scene.score_all([published])[0].nc == 1.0

    best = max(clear, key=lambda i: scores[i].pdms)
    values = probe.wait_for(lambda: (v := probe.diagnostic_values(f"{NODE}: planner")) and
                            v.get("last_candidates") == "8" and v, 10.0)
    assert values, probe.diagnostic_values(f"{NODE}: planner")
    assert values["last_valid_candidates"] == str(sum(c is not None for c in candidates))
    assert values["last_objects_used"] == "True"
    assert int(values["last_selected_candidate"]) - 1 in same
    assert float(values["last_selected_nc"]) == 1.0
    assert float(values["last_selected_pdms"]) == pytest.approx(scores[best].pdms, abs=1e-4)
    # the selection travels with the plan: its score and the candidates that parsed
    assert trajectory.candidates == 8 and trajectory.valid_candidates == sum(c is not None for c in candidates)
    assert trajectory.selected_candidate - 1 in same
    assert trajectory.pdms == pytest.approx(scores[best].pdms, abs=1e-4)
