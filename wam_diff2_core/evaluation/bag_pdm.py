"""A bag frame as a PDM-score scene (NAVSIM v1, :mod:`~wam_diff2_core.pdm.score`) from what a recording knows:
the recorded objects as non-reactive agents, a corridor around the route (or the recorded drive) as the
drivable area, the recorded drive as the reference planner ("PDM score" in this folder's README.md).

    inputs = bag_pdm_inputs(track, trajectory, route_xy, t_ns, velocity, acceleration, ground_truth, footprint)
    inputs.score(plan).pdms                       # inputs: None when no objects message lies near the frame
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..candidate_selection import DEFAULT_LANE_WIDTH_M, check_lane_width, corridor_line, ego_start
from ..geometry import EgoBox, world_to_ego, wrap_angle
from ..pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S, AgentTrack, Area, PdmScene, Vehicle
from ..pdm.score import PdmInputs, reference_progress
from .collision import EgoFootprint
from .derived_objects import ObjectTrack
from .ground_truth import EgoTrajectory

AREA_ROUTE, AREA_RECORDED_DRIVE = "route", "recorded_drive"     # where a frame's corridor came from


@dataclass(frozen=True)
class BagPdmInputs(PdmInputs):
    """A bag frame's PDM-score inputs and where its corridor came from."""

    area: str                  # AREA_ROUTE | AREA_RECORDED_DRIVE


def _agents(track: ObjectTrack, t_ns: int, origin: np.ndarray, yaw: float) -> list[AgentTrack] | None:
    """The objects at ``t_ns`` as non-reactive agents (module docstring); None: no objects message near it."""
    snapshots = [track.at(t_ns + round(k * SIM_DT_S * 1e9)) for k in range(OBSERVATION_SAMPLES)]
    if snapshots[0] is None:
        return None
    agents = []
    for oid, first in zip(snapshots[0].ids, snapshots[0].boxes):
        rows: list[np.ndarray | None] = []
        for snapshot in snapshots:
            hit = None if snapshot is None else np.flatnonzero(snapshot.ids == oid)
            rows.append(None if hit is None or not len(hit) else snapshot.boxes[hit[0], :3])
        velocity, last = np.zeros(2), None        # last: the latest recorded box before k
        for k in range(OBSERVATION_SAMPLES):
            if rows[k] is None:
                rows[k] = np.array([*(rows[last][:2] + velocity * (k - last) * SIM_DT_S), rows[last][2]])
                continue
            if last is not None:
                velocity = (rows[k][:2] - rows[last][:2]) / ((k - last) * SIM_DT_S)
            last = k
        boxes = np.array(rows)
        agents.append(AgentTrack(xy=world_to_ego(boxes[:, :2], origin, yaw), yaw=boxes[:, 2] - yaw,
                                 length_m=float(first[3]), width_m=float(first[4]), kind="vehicle",
                                 name=f"object {int(oid)}"))
    return agents


def bag_pdm_inputs(track: ObjectTrack, trajectory: EgoTrajectory, route_xy: np.ndarray | None, t_ns: int,
                   velocity, acceleration, ground_truth: np.ndarray, footprint: EgoFootprint,
                   lane_width_m: float = DEFAULT_LANE_WIDTH_M) -> BagPdmInputs | None:
    """The PDM-score inputs of the frame at ``t_ns`` (module docstring): ``route_xy`` [N, 2] the route in
    the odometry frame (None: none usable, the recorded drive is the corridor), ``velocity`` /
    ``acceleration`` the ego-frame motion the policy got, ``ground_truth`` [8, 2] the recorded future (the
    reference planner). None when no objects message lies near the frame (nothing known of the agents)."""
    width = check_lane_width(lane_width_m)
    origin, yaw = trajectory.pose_at(t_ns)
    agents = _agents(track, t_ns, origin, yaw)
    if agents is None:
        return None
    if route_xy is not None and len(route_xy):
        route = np.asarray(route_xy, dtype=np.float64)
        line, area = corridor_line(route, int(np.argmin(np.hypot(*(route - origin).T))), yaw), AREA_ROUTE
    else:
        anchor = min(int(np.searchsorted(trajectory.stamps_ns, t_ns)), len(trajectory.xy) - 1)
        line, area = corridor_line(trajectory.xy, anchor, yaw), AREA_RECORDED_DRIVE
    centreline = world_to_ego(line, origin, yaw)
    scene = PdmScene(centreline=centreline, drivable=Area.corridor(centreline, width), agents=agents)
    vehicle = Vehicle(EgoBox(footprint.length_m, footprint.width_m,
                                 footprint.length_m / 2 - footprint.centre_ahead_m))
    yaw_rate = wrap_angle(trajectory.pose_at(t_ns + round(SIM_DT_S * 1e9))[1] - yaw) / SIM_DT_S
    ego = ego_start(float(velocity[0]), float(acceleration[0]), yaw_rate, vehicle)
    return BagPdmInputs(scene, ego, vehicle, reference_progress(ground_truth, ego, scene, vehicle), area)
