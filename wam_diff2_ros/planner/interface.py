"""The planner node's interface: its topics (private names, remapped by launch files), their types and
QoS. Light to import (no model code), for the node, launch helpers and tests."""
from __future__ import annotations

from nav_msgs.msg import Odometry, Path
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import Float64, String
from visualization_msgs.msg import MarkerArray

from wam_diff2_core.frame_inputs import is_compressed

from ..msg import Detection2DArray, StageTimes, Trajectory
from ..optional_msgs import derived_object_msgs
from ..qos import KEEP_ALL_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS

try:  # the common interop type, published too where the package exists
    import vision_msgs.msg as vision_msgs
except ImportError:
    vision_msgs = None
try:  # Autoware's trajectory, published too where the package exists
    import autoware_planning_msgs.msg as autoware_msgs
except ImportError:
    autoware_msgs = None

# On best effort, Fast DDS's default transports lose most frames larger than about this (measured on one
# host, where its shared-memory segment is 512 KiB: 0.518 MB frames all arrive, 0.524 MB ones 1 in 6;
# scripts/image_qos.py, README: image QoS).
LARGE_RAW_FRAME_BYTES = 500_000
# reliable keeps all: lockstep counts images, so none may be lost on the wire or overwritten in a
# reader queue while the callbacks wait for the GIL (the callback only hands the newest to the worker)
IMAGE_QOS = {"best_effort": qos_profile_sensor_data, "reliable": KEEP_ALL_QOS}
# the objects input only where derived_object_msgs imports
INPUT_TOPICS = {"image": "~/input/image", "image_compressed": "~/input/image/compressed",
                "camera_info": "~/input/camera_info", "odometry": "~/input/odometry", "route": "~/input/route",
                "command": "~/input/command", "objects": "~/input/objects"}
INPUT_TYPES = {"image": Image, "image_compressed": CompressedImage, "camera_info": CameraInfo, "odometry": Odometry,
               "route": Path, "command": String,
               **({"objects": derived_object_msgs.ObjectArray} if derived_object_msgs is not None else {})}
OUTPUT_TOPICS = {"path": "~/output/path", "path_odom": "~/output/path_odom", "trajectory": "~/output/trajectory",
                 "autoware_trajectory": "~/output/autoware_trajectory",
                 "detections": "~/output/detections", "vision_detections": "~/output/detections_vision",
                 "debug_image": "~/debug/image", "markers": "~/debug/markers",
                 "processing_ms": "~/debug/processing_time_ms", "latency_ms": "~/debug/pipeline_latency_ms",
                 "stage_times": "~/debug/stage_times",
                 "status": "~/status", "diagnostics": "/diagnostics"}
# output name -> message type; the optional packages' outputs only where they import
OUTPUT_TYPES = {"path": Path, "path_odom": Path, "trajectory": Trajectory, "detections": Detection2DArray,
                "debug_image": Image, "markers": MarkerArray, "processing_ms": Float64, "latency_ms": Float64,
                "stage_times": StageTimes,
                **({"vision_detections": vision_msgs.Detection2DArray} if vision_msgs is not None else {}),
                **({"autoware_trajectory": autoware_msgs.Trajectory} if autoware_msgs is not None else {})}


def input_qos(name: str, image_reliability: str) -> QoSProfile:
    """The QoS of the input ``name`` (an INPUT_TOPICS key): streams sensor data (best effort, keep last 5),
    images by the ``image_reliability`` parameter, the route latched; commands are few and must not be lost."""
    if name in ("image", "image_compressed"):
        return IMAGE_QOS[image_reliability]
    return {"route": LATCHED_QOS, "command": LATEST_RELIABLE_QOS}.get(name, qos_profile_sensor_data)


def raw_image_qos_warning(msg, image_reliability: str) -> str | None:
    """Why ``msg``, a received image, says frames are being lost on the wire (None: it does not): a large raw
    frame on best effort (README.md, image QoS)."""
    if image_reliability != "best_effort" or is_compressed(msg) or len(msg.data) <= LARGE_RAW_FRAME_BYTES:
        return None
    return (f"raw {msg.width}x{msg.height} frames ({len(msg.data)} bytes) on best-effort image QoS: over Fast DDS "
            f"most frames above about {LARGE_RAW_FRAME_BYTES} bytes never arrive (wam_diff2_ros/README.md, image "
            "QoS); with a reliable camera publisher (carla-ros-bridge) set image_reliability: reliable")
