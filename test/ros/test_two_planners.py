"""launch/two_planners.launch.py's A/B test over real DDS: a Block-32 and an AR planner on one camera.

``ros2 launch`` is not installable here, so the two nodes start in this process with what the launch
file gives them, taken from the same data (``wam_diff2_ros.planner.launching.two_planners``): each in its
namespace, the package's config/planner.yaml as the params file, the launch arguments' defaults for
``device`` and ``image_reliability``, both inputs remapped onto one camera and one odometry topic, as
``--ros-args`` rules (what launch_ros passes). Only the model paths differ from the launch defaults:
tiny random checkpoints (B = 32 and AR) instead of the installed demo models. One frame and its
odometry go out once; each planner must answer on its own namespaced trajectory topic with its own
block size.
"""
from __future__ import annotations

import threading
import time

import pytest

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from wam_diff2_ros.planner.launching import argument_defaults, two_planners  # noqa: E402
from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.planner.node import PlannerNode  # noqa: E402
from test.support.ros_helpers import Probe, image_msg, odometry_msg, ros_context  # noqa: E402

pytestmark = pytest.mark.ros
CAMERA, ODOMETRY = "/camera/front/image", "/camera/front/odometry"
READY_S = 120.0          # generous: other jobs may load these 2 cores
ANSWER_S = 60.0


@pytest.fixture(scope="module")
def context():
    with ros_context(0) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def launched(context, tiny_checkpoint, tiny_ar_checkpoint):
    """The launch file's planners, spinning: {namespace: (node, probe)}."""
    defaults = argument_defaults(str(ROOT))         # the launch arguments' defaults, params_file from this checkout
    arguments = {**defaults, "block32_model_path": str(tiny_checkpoint), "ar_model_path": str(tiny_ar_checkpoint),
                 "image_topic": CAMERA, "odometry_topic": ODOMETRY}
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    started = {}
    for namespace, parameters, remappings in two_planners(arguments.__getitem__):
        rules = [arg for source, target in remappings for arg in ("-r", f"{source}:={target}")]
        node = PlannerNode(context=context, namespace=namespace,
                           cli_args=["--ros-args", "--params-file", defaults["params_file"], *rules],
                           parameter_overrides=[Parameter(k, value=v) for k, v in parameters.items()])
        executor.add_node(node)
        started[namespace] = node
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    probes = {ns: Probe(node.get_fully_qualified_name(), name=f"probe_{ns}", context=context).start()
              for ns, node in started.items()}
    yield {ns: (started[ns], probes[ns]) for ns in started}
    for probe in probes.values():
        probe.stop()
    for node in started.values():
        node.stop_worker()
    executor.shutdown()
    thread.join(10.0)
    for node in started.values():
        node.destroy_node()


def test_both_planners_answer_one_frame_on_their_own_topics_with_their_own_block_size(launched):
    assert set(launched) == {"block32", "ar"}
    for namespace, (node, probe) in launched.items():
        assert node.get_fully_qualified_name() == f"/{namespace}/wam_diff2_planner"
        assert probe.wait_for(lambda p=probe: p.with_status(PlannerStatus.READY), READY_S), probe.messages("status")
    camera = next(iter(launched.values()))[1]         # one publisher of the shared camera and odometry
    image_pub = camera.create_publisher(Image, CAMERA, qos_profile_sensor_data)
    odometry_pub = camera.create_publisher(Odometry, ODOMETRY, qos_profile_sensor_data)
    assert camera.wait_for(lambda: camera.count_subscribers(CAMERA) == 2
                           and camera.count_subscribers(ODOMETRY) == 2, 10.0)
    stamp = camera.now_ns()
    odometry_pub.publish(odometry_msg(stamp))
    time.sleep(0.06)
    odometry_pub.publish(odometry_msg(camera.now_ns()))     # odometry at and after the image stamp
    image_pub.publish(image_msg(stamp))
    block_sizes = {}
    for namespace, (_, probe) in launched.items():
        found = probe.wait_for(lambda p=probe: p.with_stamp("trajectory", stamp), ANSWER_S)
        assert found, f"/{namespace}: no trajectory; status: {probe.messages('status')[-1:]}"
        block_sizes[namespace] = found[-1].stats.block_size
        assert found[-1].stats.forwards > 0
    assert block_sizes == {"block32": 32, "ar": 1}
