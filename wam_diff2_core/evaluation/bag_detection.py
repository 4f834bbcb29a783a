"""``eval-bag --predictions``: the boxes a planner node published (``Detection2DArray``), scored with COCO AP
(:mod:`.detection`) against what the camera saw of the bag's objects at their stamp (:func:`pixel_truth`),
every bag together, in stamp order; an invalid message scores no box.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..geometry import CameraMount, PinholeCamera, yaw_from_quaternion
from ..outputs.parsing import Box, BoxParse, ParseError
from ..vehicle_projection import PixelBox, VehicleBox, VehicleProjector
from .bags import Bag, BagError, Undecodable
from .derived_objects import UNKNOWN_LABEL, ObjectSnapshot
from .detection import DetectionImage, detection_scores
from .ground_truth import NoFuture

DETECTIONS_TYPE = "wam_diff2_ros/msg/Detection2DArray"
DEFAULT_DETECTIONS_TOPIC = "/wam_diff2_planner/output/detections"     # the planner node's ~/output/detections
TF_TYPE = "tf2_msgs/msg/TFMessage"
COUNTS = ("messages", "matched", "no_objects", "no_pose", "unmatched_stamp", "duplicate", "undecodable")
NOT_ANSWERED = "not_parsed"                     # the node's invalid answer, as a parse error here


def mount_from_quaternion(translation: Sequence[float], q: Sequence[float]) -> CameraMount:
    """A camera pose on the ego from a transform (translation, quaternion x y z w): R = Rz(yaw) Ry(pitch) Rx(roll)."""
    x, y, z, w = (float(v) for v in q)
    roll = math.atan2(2.0 * (w * x + y * z), 1.0 - 2.0 * (x * x + y * y))
    pitch = math.asin(max(-1.0, min(1.0, 2.0 * (w * y - z * x))))
    yaw = yaw_from_quaternion(x, y, z, w)
    return CameraMount(*(float(v) for v in translation), *(math.degrees(a) for a in (roll, pitch, yaw)))


def pixel_truth(snapshot: ObjectSnapshot, ego_pose: tuple[float, float, float],
                projector: VehicleProjector) -> list[PixelBox]:
    """The objects of ``snapshot`` the camera sees from ``ego_pose`` (x, y, yaw of the rear axle in the
    snapshot's frame), drawn and labelled as the demo world draws its vehicles, left to right; the world is
    taken flat. ValueError when the snapshot has no heights."""
    if snapshot.heights is None:
        raise ValueError("pixel_truth: the object snapshot has no box heights (read it with objects_from_msg)")
    labels = snapshot.labels or (UNKNOWN_LABEL,) * len(snapshot.ids)
    objects = [VehicleBox(int(i), label, *(float(v) for v in box), float(h))
               for i, box, h, label in zip(snapshot.ids, snapshot.boxes, snapshot.heights, labels)
               if math.isfinite(h) and h > 0]
    return projector.boxes(ego_pose, objects)


def camera_projector(bag: Bag, plan) -> VehicleProjector:
    """The source bag's camera: intrinsics from its camera_info (``plan.camera``), its pose on the ego from the
    first ``/tf`` transform whose child is the camera_info frame. BagError naming what is missing."""
    if plan.camera is None:
        raise BagError(f"{bag.path}: no camera_info: the camera's intrinsics are needed to score boxes")
    k, frame = plan.camera["k"], plan.camera["frame_id"]
    camera = PinholeCamera(k[0], k[4], k[2], k[5], int(plan.camera["width"]), int(plan.camera["height"]))
    tf_topics = sorted((t for t, m in bag.topic_types.items() if m == TF_TYPE), key=lambda t: (not t.endswith("tf_static"), t))
    for _, _, msg in bag.messages(tf_topics):
        if isinstance(msg, Undecodable):
            continue
        for t in msg.transforms:
            if t.child_frame_id == frame:
                tr, q = t.transform.translation, t.transform.rotation
                return VehicleProjector(camera, mount_from_quaternion((tr.x, tr.y, tr.z), (q.x, q.y, q.z, q.w)))
    searched = ", ".join(tf_topics) or "no tf2_msgs/TFMessage topic"
    raise BagError(f"{bag.path}: no /tf transform to the camera frame {frame!r} ({searched}): the camera's pose on "
                   "the ego is needed to score boxes")


def bag_detection_images(source: str | Path, plan, predictions: str | Path,
                         counts: Counter) -> tuple[str | None, list[DetectionImage]]:
    """(topic, the scored images) of one bag's recorded detections; (None, []) when it has none. ``plan``: the
    source bag's ``bag_plan.BagPlan`` (its camera, image stamps, odometry and objects)."""
    with Bag(predictions) as pb:
        topic = pb.topic_of_type(DETECTIONS_TYPE, DEFAULT_DETECTIONS_TOPIC)
        if topic is None:
            return None, []
        answers = pb.by_stamp(topic, counts)
    images, objects = [], plan.objects
    with Bag(source) as bag:
        projector = camera_projector(bag, plan)
    for t_ns, msg in sorted(answers.items()):
        if t_ns not in plan.image_stamps:
            counts["unmatched_stamp"] += 1
            continue
        snapshot = objects.at(t_ns) if objects is not None else None
        if snapshot is None:
            counts["no_objects"] += 1
            continue
        try:
            xy, yaw = plan.trajectory.pose_at(t_ns)
        except NoFuture:
            counts["no_pose"] += 1
            continue
        truth = [Box(b.label, 1.0, *b.box) for b in pixel_truth(snapshot, (float(xy[0]), float(xy[1]), yaw),
                                                                 projector)]
        answer = BoxParse([Box(d.label, float(d.score), d.x_min, d.y_min, d.x_max, d.y_max) for d in msg.detections]) \
            if msg.valid else BoxParse(error=ParseError(NOT_ANSWERED, msg.invalid_reason or "invalid"))
        images.append(DetectionImage(f"{Path(str(source)).name}@{t_ns}", truth, answer))
        counts["matched"] += 1
    return topic, images


def score_recorded_detections(sources: Sequence[str | Path], plans: Sequence,
                              predictions: Sequence[str | Path]) -> dict[str, Any] | None:
    """COCO AP of the boxes recorded in ``predictions[i]`` for ``sources[i]``, all bags together, with the
    counts; None when no predictions bag has a Detection2DArray topic."""
    counts: Counter = Counter({k: 0 for k in COUNTS})
    images, topics = [], []
    for source, plan, pred in zip(sources, plans, predictions):
        topic, found = bag_detection_images(source, plan, pred, counts)
        if topic is not None:
            topics.append(topic)
            images += found
    if not topics:
        return None
    scores = detection_scores(images) if images else None
    return {"topics": sorted(set(topics)), "counts": dict(counts), "images": len(images),
            "truth_boxes": int(sum(len(i.truth) for i in images)), "scores": scores,
            "truth_boxes_per_image": float(np.mean([len(i.truth) for i in images])) if images else None}
