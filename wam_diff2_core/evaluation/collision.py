"""Open-loop collision check: the planned ego box along the plan against the other agents' recorded boxes at
each waypoint time, exact polygons in the ego frame at the frame time; a step where the recorded ego itself
overlaps an agent is not counted ("Collision check" in this folder's README.md).

    obstacles = obstacles_along(track, trajectory, frame_stamp_ns)  # per waypoint [N, 4, 2] or None
    collision_flags(waypoints, obstacles, EgoFootprint())           # [8] True / False / None (no objects then)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..geometry import DEMO_EGO_BOX, box_corners, boxes_overlap, path_headings, world_to_ego
from .derived_objects import ObjectTrack
from .ground_truth import WAYPOINT_OFFSETS_NS, EgoTrajectory

@dataclass(frozen=True)
class EgoFootprint:
    """The ego's box relative to the odometry origin (defaults: the demo world's ego, whose
    odometry frame is the rear axle; a CARLA bag's odometry is the vehicle's centre: ``centre_ahead_m``
    0, and the leaderboard's Lincoln MKZ 2020 is 4.89 x 2.12 m)."""

    length_m: float = DEMO_EGO_BOX.length_m
    width_m: float = DEMO_EGO_BOX.width_m
    centre_ahead_m: float = DEMO_EGO_BOX.centre_from_axle_m

    def __post_init__(self):
        if not (self.length_m > 0 and self.width_m > 0):
            raise ValueError(f"ego footprint: length_m and width_m must be > 0, got {self.length_m}, {self.width_m}")

    def boxes(self, waypoints: np.ndarray) -> np.ndarray:
        """[K, 4, 2] the ego box at each of ``waypoints`` [K, 2] (ego frame), heading along the path."""
        points = np.asarray(waypoints, dtype=np.float64).reshape(-1, 2)
        headings = path_headings(points)
        return np.stack([box_corners(x + self.centre_ahead_m * np.cos(h), y + self.centre_ahead_m * np.sin(h), h,
                                     self.length_m, self.width_m) for (x, y), h in zip(points, headings)])


def obstacles_along(track: ObjectTrack, trajectory: EgoTrajectory, t_ns: int) -> list[np.ndarray | None]:
    """Per waypoint time: the recorded object boxes [N, 4, 2] in the ego frame at ``t_ns``, or
    None when no objects message lies within the track's offset of that time."""
    origin, yaw = trajectory.pose_at(t_ns)
    out: list[np.ndarray | None] = []
    for dt in WAYPOINT_OFFSETS_NS:
        snapshot = track.at(t_ns + int(dt))
        if snapshot is None:
            out.append(None)
            continue
        boxes = [world_to_ego(box_corners(x, y, a, length, width), origin, yaw)
                 for x, y, a, length, width in snapshot.boxes]
        out.append(np.asarray(boxes, dtype=np.float64).reshape(-1, 4, 2))
    return out


def collision_flags(waypoints: np.ndarray, obstacles: Sequence[np.ndarray | None],
                    footprint: EgoFootprint) -> list[bool | None]:
    """[K] whether the ego box at waypoint k overlaps any obstacle box of that time (None: no objects known)."""
    ego = footprint.boxes(waypoints)
    return [None if boxes is None else any(boxes_overlap(ego[k], b) for b in boxes)
            for k, boxes in enumerate(obstacles)]


def counted(planned: Sequence[bool | None], recorded: Sequence[bool | None]) -> list[bool | None]:
    """A planned collision counts only where the recorded ego is clear (ST-P3 / UniAD / VAD)."""
    return [None if p is None else bool(p and not r) for p, r in zip(planned, recorded)]
