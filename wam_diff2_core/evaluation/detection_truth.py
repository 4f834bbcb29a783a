"""Detection ground truth from a bag's object boxes: what the camera sees of them, drawn as the demo world draws
and labels its vehicles (``vehicle_projection.VehicleProjector``); the world is taken flat.

    truth = pixel_truth(snapshot, ego_pose, VehicleProjector(camera, mount))   # [PixelBox], left to right
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
