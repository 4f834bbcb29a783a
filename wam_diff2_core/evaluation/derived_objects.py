"""Other agents in bags: carla-ros-bridge's ``derived_object_msgs/msg/ObjectArray`` (no wheel on PyPI: the
definitions come from the installed package, for writing; a recorded bag carries its own).

    snapshot = objects_from_msg(msg)          # ObjectSnapshot: ids [N], boxes [N, 5] (x, y, yaw, length, width)
    ObjectTrack([snapshot, ...]).at(t_ns)     # the snapshot nearest to t (within max_offset_ns) or None
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..candidate_selection import BOX, object_ground_box
from ..frame_inputs import stamp_ns
from . import bag_messages as msg

OBJECT_TYPE = "derived_object_msgs/msg/Object"
OBJECT_ARRAY_TYPE = "derived_object_msgs/msg/ObjectArray"

CLASSIFICATION = {"car": 6, "truck": 7, "bus": 9}        # demo-world labels -> Object.CLASSIFICATION_*
LABELS = {code: label for label, code in CLASSIFICATION.items()}   # Object.CLASSIFICATION_* -> label
UNKNOWN_LABEL = "unknown"                                  # another classification


def installed_msg_dirs(package: str) -> list[Path]:
    """``share/<package>/msg`` under every prefix on ``AMENT_PREFIX_PATH``, in its order (they need not exist)."""
    return [Path(prefix) / "share" / package / "msg" for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)
            if prefix]


@lru_cache(maxsize=1)
def object_types() -> dict[str, Any]:
    """``Object`` and ``ObjectArray`` from the installed package's ``.msg`` files, as a rosbags types dict
    (register into a typestore). Raises LookupError naming what to install when the package is absent."""
    from rosbags.typesys import get_types_from_msg

    folder = next((d for d in installed_msg_dirs("derived_object_msgs") if d.is_dir()), None)
    if folder is None:
        raise LookupError("derived_object_msgs is not on AMENT_PREFIX_PATH (no share/derived_object_msgs/msg): "
                          "source scripts/env.sh after scripts/build_ros_interfaces.sh, or on a ROS 2 "
                          "distribution install ros-<distro>-derived-object-msgs")
    types: dict[str, Any] = {}
    for name in (OBJECT_TYPE, OBJECT_ARRAY_TYPE):
        types.update(get_types_from_msg((folder / f"{name.rsplit('/', 1)[1]}.msg").read_text(), name))
    return types


@dataclass(frozen=True)
class ObjectSnapshot:
    """The objects of one message, as ground boxes in ``frame_id``."""

    stamp_ns: int
    frame_id: str
    ids: np.ndarray          # [N] int
    boxes: np.ndarray        # [N, 5] centre x, y, yaw, length, width
    unsupported: int = 0     # objects whose shape is neither a box nor a cylinder (not used)
    heights: np.ndarray | None = None   # [N] box heights (m); None: not known
    labels: tuple[str, ...] = ()        # [N] demo-world labels from the classification (LABELS); (): not known


def objects_from_msg(msg) -> ObjectSnapshot:
    """An ``ObjectArray`` -> boxes on the ground (``candidate_selection.object_ground_box``: BOX or CYLINDER);
    the objects without a finite box of either shape are counted as ``unsupported`` and left out."""
    shaped = [(obj, object_ground_box(obj)) for obj in msg.objects]
    kept = [(obj, box) for obj, box in shaped if box is not None]      # box: x, y, yaw, length, width, height
    return ObjectSnapshot(stamp_ns(msg.header.stamp), str(msg.header.frame_id),
                          np.asarray([int(obj.id) for obj, _ in kept], dtype=np.int64),
                          np.asarray([box[:5] for _, box in kept], dtype=np.float64).reshape(-1, 5),
                          len(shaped) - len(kept), np.asarray([box[5] for _, box in kept], dtype=np.float64),
                          tuple(LABELS.get(int(obj.classification), UNKNOWN_LABEL) for obj, _ in kept))


class ObjectTrack:
    """Snapshots by stamp; :meth:`at` gives the one nearest to a time."""

    def __init__(self, snapshots: Sequence[ObjectSnapshot], max_offset_ns: int = 50_000_000):
        self.snapshots = sorted(snapshots, key=lambda s: s.stamp_ns)
        self.stamps_ns = np.asarray([s.stamp_ns for s in self.snapshots], dtype=np.int64)
        self.max_offset_ns = int(max_offset_ns)

    def at(self, t_ns: int) -> ObjectSnapshot | None:
        """The snapshot nearest to ``t_ns`` when one is within ``max_offset_ns``, else None."""
        if not len(self.snapshots):
            return None
        i = int(np.searchsorted(self.stamps_ns, t_ns))
        best = min((j for j in (i - 1, i) if 0 <= j < len(self.snapshots)),
                   key=lambda j: abs(int(self.stamps_ns[j]) - t_ns))
        return self.snapshots[best] if abs(int(self.stamps_ns[best]) - t_ns) <= self.max_offset_ns else None


def object_array_msg(t: dict[str, type], header, objects: Sequence[dict[str, Any]]):
    """An ``ObjectArray`` of ``objects`` (dicts: id, label, x, y, z, yaw, length_m, width_m,
    height_m, vx, vy in the header's frame) from a typestore's classes ``t``."""
    zero = msg.vector(t, 0.0, 0.0, 0.0)
    no_polygon = t["geometry_msgs/msg/Polygon"](points=[])
    return t[OBJECT_ARRAY_TYPE](header=header, objects=[t[OBJECT_TYPE](
        header=header, id=int(o["id"]), detection_level=1, object_classified=True,
        pose=msg.pose(t, o["x"], o["y"], o["yaw"], o["z"]),
        twist=t["geometry_msgs/msg/Twist"](linear=msg.vector(t, o["vx"], o["vy"], 0.0), angular=zero),
        accel=t["geometry_msgs/msg/Accel"](linear=zero, angular=zero), polygon=no_polygon,
        shape=t["shape_msgs/msg/SolidPrimitive"](
            type=BOX, dimensions=np.array([o["length_m"], o["width_m"], o["height_m"]], dtype=np.float64),
            polygon=no_polygon),
        classification=CLASSIFICATION.get(o["label"], 0), classification_certainty=255, classification_age=1)
        for o in objects])
