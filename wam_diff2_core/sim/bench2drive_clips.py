"""Demo-world episodes as Bench2Drive clips (``wam-diff2 synth --formats b2d --frame-stride 2``): one folder
per episode, ``OUT/b2d/WamDiff2Synth_seed<S>_e<NNNN>/``, laid out as Bench2Drive's public dataset (10 Hz)::

    camera/rgb_front/00000.jpg    the frame's JPEG (the very bytes of the JSON export's image)
    anno/00000.json.gz            gzip JSON (mtime 0: the export stays byte-identical per seed)

The annotation holds the keys :mod:`wam_diff2_core.data.bench2drive` reads, in CARLA's left-handed world
frame, and how they differ from a CARLA clip's: sim/README.md, "Bench2Drive clips".
"""
from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

from ..data.bench2drive import CAMERA, anno_acceleration, anno_pose

ROAD_OPTION = {"left": 1, "right": 2}
STRAIGHT_AT_CROSSING, LANE_FOLLOW = 3, 4


def _carla_box(box, ego_xy, class_name: str) -> dict:
    pose = anno_pose(box.x, box.y, box.yaw)
    z = box.height_m / 2
    return {"class": class_name, "id": int(box.id), "type_id": f"vehicle.wamdiff2synth.{box.label}",
            "base_type": box.label, "location": [pose["x"], pose["y"], 0.0], "center": [pose["x"], pose["y"], z],
            "rotation": [0.0, 0.0, math.degrees(-box.yaw)],
            "extent": [box.length_m / 2, box.width_m / 2, box.height_m / 2], "speed": float(box.speed),
            "distance": float(math.hypot(box.x - ego_xy[0], box.y - ego_xy[1])),
            "state": "dynamic" if box.speed > 0 else "static", "brake": bool(box.braking)}


class B2DClipWriter:
    """Writes one episode's frames as a Bench2Drive clip folder."""

    def __init__(self, root: Path, episode, settings):
        self.root, self.episode, self.settings = Path(root), episode, settings
        (self.root / "camera" / CAMERA).mkdir(parents=True, exist_ok=True)
        (self.root / "anno").mkdir(parents=True, exist_ok=True)

    def annotation(self, truth) -> dict:
        x, y, yaw = truth.pose
        forward, left = self.settings.prompt_acceleration_of(truth)
        code = ROAD_OPTION.get(truth.command, STRAIGHT_AT_CROSSING if truth.command_source == "crossing"
                               else LANE_FOLLOW)
        others = self.episode.traffic[truth.tick]
        pose = anno_pose(x, y, yaw)
        ego_box = {"class": "ego_vehicle", "id": 0, "type_id": "vehicle.wamdiff2synth.ego",
                   "location": [pose["x"], pose["y"], 0.0], "rotation": [0.0, 0.0, math.degrees(-yaw)],
                   "speed": float(truth.velocity[0])}
        return {**pose, "speed": float(truth.velocity[0]),
                "acceleration": anno_acceleration(forward, left, yaw),
                "angular_velocity": [0.0, 0.0, -math.degrees(truth.yaw_rate)],
                "command_near": code, "command_far": code, "is_junction": truth.command_source == "crossing",
                "bounding_boxes": [ego_box, *(_carla_box(b, (x, y), "vehicle") for b in others)]}

    def write_frame(self, truth, jpeg: bytes) -> None:
        name = f"{truth.frame:05d}"
        (self.root / "camera" / CAMERA / f"{name}.jpg").write_bytes(jpeg)
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as f:
            f.write(json.dumps(self.annotation(truth)).encode())
        (self.root / "anno" / f"{name}.json.gz").write_bytes(buffer.getvalue())
