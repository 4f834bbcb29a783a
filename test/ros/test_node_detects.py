"""The planner node over real DDS with checkpoints that really answer with boxes (test/support/detector.py), AR
and Block-32: one camera frame in, and its own Detection2DArray and vision_msgs' carry the sample's truth
boxes in source-image pixels, scored by the decoder's confidence exactly as the Python API scores them."""
from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from rclpy.parameter import Parameter  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wam_diff2_core.geometry import EgoMotion  # noqa: E402
from wam_diff2_core.policy import DrivingPolicy  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.planner.node import PlannerNode  # noqa: E402
from wam_diff2_ros.conversions import ns_to_stamp, rgb_image_msg  # noqa: E402
from test.support.detector import memorized_sample  # noqa: E402
from test.support.ros_helpers import planner_and_probe, ros_context  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]      # the memorizers train for ~25 s
NAME = "wam_diff2_planner"
READY_S = 120.0          # generous: other jobs may load these 2 cores
ANSWER_S = 60.0
TOLERANCE = 1e-6         # of a score: the node and the API decode the same frame on the same float32 model


@pytest.fixture(scope="module", params=["box_memorizer", "block32_box_memorizer"])
def sample(request):
    """(checkpoint, the sample's RGB frame, its truth boxes, the API's boxes for that frame): AR, then Block-32."""
    checkpoint, samples = request.getfixturevalue(request.param)
    _, rgb, truth = memorized_sample(samples)
    policy = DrivingPolicy.from_checkpoint(checkpoint, device="cpu", dtype="float32", tasks=("detect",))
    api = policy.step(rgb, EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0)), "straight").detections
    assert api.valid and len(api.boxes) == len(truth)
    return checkpoint, rgb, truth, api.boxes


@pytest.fixture(scope="module")
def probe(sample):
    checkpoint = sample[0]
    with ros_context(0) as context:
        node = PlannerNode(NAME, context=context, parameter_overrides=[
            Parameter("model_path", value=str(checkpoint)), Parameter("tasks", value="detect"),
            Parameter("device", value="cpu"), Parameter("dtype", value="float32"),    # as the API's reference
            Parameter("image_timeout_s", value=10.0)])
        with planner_and_probe(context, node) as (_, probe):
            assert probe.wait_for(lambda: probe.with_status(PlannerStatus.READY), READY_S), probe.messages("status")
            assert probe.wait_for(lambda: probe.count_subscribers(probe.topic("~/input/image")) > 0, 10.0)
            yield probe


def test_the_node_publishes_the_boxes_the_model_wrote_with_their_confidence(sample, probe):
    _, rgb, truth, api = sample
    stamp = probe.now_ns()
    time.sleep(0.06)                       # the probe's 20 Hz odometry now holds a sample at or after the stamp
    frame = rgb_image_msg(rgb, Header(stamp=ns_to_stamp(stamp), frame_id="camera"))
    found = None
    for _ in range(3):                     # a frame on best effort may be lost on a loaded machine: send again
        probe.image_pub.publish(frame)
        found = probe.wait_for(lambda: probe.with_stamp("detections", stamp), ANSWER_S / 3)
        if found:
            break
    assert found, "no detections for the frame"
    dets = found[-1]
    assert dets.valid and dets.header.frame_id == "camera"
    assert [d.label for d in dets.detections] == [b.label for b in truth]
    corners = ("x_min", "y_min", "x_max", "y_max")
    assert [getattr(d, k) for d in dets.detections for k in corners] == \
        pytest.approx([getattr(b, k) for b in truth for k in corners], abs=1e-3)        # float32 on the wire
    scores = [d.score for d in dets.detections]
    assert scores == pytest.approx([b.score for b in api], abs=TOLERANCE) and all(s < 1.0 for s in scores)

    if "vision_detections" not in probe.received:
        pytest.skip("vision_msgs is not built here (scripts/build_ros_interfaces.sh)")
    vision = probe.wait_for(lambda: probe.with_stamp("vision_detections", stamp), 5.0)
    assert vision, "no vision_msgs detections for the frame"
    boxes = vision[-1].detections
    assert [d.results[0].hypothesis.class_id for d in boxes] == [b.label for b in truth]
    assert [d.results[0].hypothesis.score for d in boxes] == pytest.approx([b.score for b in api], abs=TOLERANCE)
    assert [v for d in boxes for v in (d.bbox.center.position.x, d.bbox.size_x)] == pytest.approx(
        [v for b in truth for v in ((b.x_min + b.x_max) / 2, b.x_max - b.x_min)], abs=1e-3)
