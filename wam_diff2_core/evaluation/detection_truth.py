"""Detection ground truth from a bag's object boxes: what the camera sees of them, as 2-D boxes.

    projector = VehicleProjector(camera, mount)               # intrinsics (camera_info) and the camera's pose
    truth = pixel_truth(snapshot, ego_pose, projector)        # [PixelBox], left to right

The objects (``derived_object_msgs/ObjectArray``, read by ``derived_objects.objects_from_msg``) are
boxes standing on the ground plane of the map frame, drawn by the same code that draws the demo world's
vehicles and labels them (``vehicle_projection.VehicleProjector``: far to near, with an id buffer, so a
box is the part of a vehicle left visible by those in front of it). On a demo-world bag this gives back
the demo world's own labels (``test/core/evaluation/test_detection_truth.py``). The object's z and its height above the
ground are not used for placement (the world is flat); a box without a height is not drawn.
"""
from __future__ import annotations

import math

from ..vehicle_projection import PixelBox, VehicleBox, VehicleProjector
from .derived_objects import UNKNOWN_LABEL, ObjectSnapshot


def pixel_truth(snapshot: ObjectSnapshot, ego_pose: tuple[float, float, float],
                projector: VehicleProjector) -> list[PixelBox]:
    """The objects of ``snapshot`` the camera sees from ``ego_pose`` (x, y, yaw of the rear axle in the
    snapshot's frame), as the demo world labels its vehicles. ValueError when the snapshot has no heights."""
    if snapshot.heights is None:
        raise ValueError("pixel_truth: the object snapshot has no box heights (read it with objects_from_msg)")
    labels = snapshot.labels or (UNKNOWN_LABEL,) * len(snapshot.ids)
    objects = [VehicleBox(int(i), label, *(float(v) for v in box), float(h))
               for i, box, h, label in zip(snapshot.ids, snapshot.boxes, snapshot.heights, labels)
               if math.isfinite(h) and h > 0]
    return projector.boxes(ego_pose, objects)
