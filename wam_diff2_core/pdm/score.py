"""The PDM score (PDMS) of a plan, NAVSIM v1's definition, ROS-free: one implementation for every caller.

A plan (8 waypoints at 0.5 ... 4.0 s, metres, in the ego frame: rear axle, x forward, y left) is
tracked for 4 s at 10 Hz by NAVSIM's controller and motion model (:mod:`.tracking`), against
non-reactive agents (oriented boxes over time), a drivable area and the route's centre line
(:mod:`.scene`); the tracked ego is scored:

| sub-score | range | rule (NAVSIM v1.1, ``pdm_scorer.py``) |
|---|---|---|
| ``nc``  no at-fault collision | {0, 0.5, 1} | an at-fault overlap of the ego box with an agent: 0 (a vehicle, pedestrian or cyclist), 0.5 (a static object) |
| ``dac`` drivable-area compliance | {0, 1} | 0 when a corner of the ego box leaves the drivable area at any step |
| ``ttc`` time to collision within bound | {0, 1} | 0 when the ego box, moved on at its speed for 0, 0.3, 0.6 or 0.9 s, hits an agent ahead (or not behind while the ego straddles lanes, is off the road or in an intersection) |
| ``ep``  ego progress | [0, 1] | progress of the box centre along the centre line x NC x DAC, over the larger of it and the rule-based reference planner's (1 when both are under 5 m) |
| ``c``   comfort | {0, 1} | longitudinal / lateral acceleration, jerk, longitudinal jerk, yaw rate and yaw acceleration within nuPlan's bounds |

    PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12

At-fault collisions (NAVSIM's ``get_collision_type``): none with the ego stopped (<= 0.05 m/s); with the agent
stopped (its speed at t = 0 <= 0.05 m/s), a front hit (the ego's front edge) or a lateral hit while the ego
straddles lanes or is off the drivable area, it is; a hit from behind (the agent's centre more than 150 deg off
the ego's heading) is not. An agent touched without fault, or overlapping the ego at t = 0, is ignored for NC
and TTC afterwards. TTC's "ahead" is the angle from the ego's pose now to the agent's centre 0 ... 0.9 s later
(NAVSIM's rule, kept: a car closing fast from behind can count as ahead once it would pass the rear axle).

Unlike NAVSIM, the reference is any rule-based planner's progress x NC x DAC (``reference_progress_m``;
:func:`reference_progress` scores a reference plan through this pipeline), and the lanes, intersections and
centre line are the scene's (none given: the ego never straddles lanes, is never in an intersection).

    result = pdm_score(plan, EgoStart(speed_mps=8.0), scene, reference_progress_m=32.0)
    result.pdms, result.nc, result.as_dict()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from ..geometry import boxes_overlap
from .comfort import comfort_checks
from .scene import SIM_DT_S, SIM_STEPS, TTC_PROJECTION_STEPS, AGENT_KINDS, EgoStart, PdmScene, Vehicle
from .tracking import EgoRollout, track_plan

# pdm_scorer.py PDMScorerConfig (the same defaults in default_scoring_parameters.yaml)
EP_WEIGHT, TTC_WEIGHT, COMFORT_WEIGHT = 5.0, 5.0, 2.0
PROGRESS_DISTANCE_THRESHOLD_M = 5.0          # below it for both plans, EP = 1
TTC_STOPPED_SPEED_MPS = 5e-3                 # a slower ego has no TTC infraction
STATIC_OBJECT_NC = 0.5                       # at fault against a non-agent object (AGENT_TYPES: 0)
# pdm_scorer_utils.get_collision_type and nuPlan's idm/utils.py (is_track_stopped, is_agent_ahead / _behind)
COLLISION_STOPPED_SPEED_MPS = 5e-2
AGENT_AHEAD_DEG = 30.0
AGENT_BEHIND_DEG = 150.0


@dataclass(frozen=True)
class PdmResult:
    """Sub-scores and the score of one plan; ``progress_m`` is the raw progress (before NC x DAC);
    ``collision_time_s`` / ``ttc_time_s``: the first at-fault collision / TTC infraction (None: none)."""

    nc: float
    dac: float
    ttc: float
    ep: float
    c: float
    pdms: float
    progress_m: float
    reference_progress_m: float
    collision_time_s: float | None
    ttc_time_s: float | None
    comfort: dict[str, bool]
    rollout: EgoRollout

    @property
    def weighted_progress_m(self) -> float:
        """Progress x NC x DAC: what this plan offers as another plan's reference (NAVSIM scores PDM-Closed's
        proposals so, EP against the best of them)."""
        return self.progress_m * self.nc * self.dac

    def with_reference(self, reference_progress_m: float) -> "PdmResult":
        """This plan's score with another reference progress (nothing is tracked again): EP against it, and
        PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12."""
        if not (math.isfinite(reference_progress_m) and reference_progress_m >= 0):
            raise ValueError(f"reference_progress_m must be finite and >= 0, got {reference_progress_m}")
        reference_progress_m = float(reference_progress_m)
        multiplier = self.nc * self.dac
        progress = self.progress_m * multiplier
        best = max(progress, reference_progress_m)
        if best > PROGRESS_DISTANCE_THRESHOLD_M:
            ep = progress / best
        else:
            ep = 1.0 if multiplier > 0 else 0.0
        weights = EP_WEIGHT + TTC_WEIGHT + COMFORT_WEIGHT
        weighted = (EP_WEIGHT * ep + TTC_WEIGHT * self.ttc + COMFORT_WEIGHT * self.c) / weights
        return replace(self, ep=ep, pdms=multiplier * weighted, reference_progress_m=reference_progress_m)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rollout"}


@dataclass(frozen=True)
class PdmInputs:
    """Everything :func:`pdm_score` needs of one frame besides the plan."""

    scene: PdmScene
    ego: EgoStart
    vehicle: Vehicle
    reference_progress_m: float

    def score(self, plan) -> PdmResult:
        """The PDM score of ``plan`` [8, 2] (ego frame) at this frame."""
        return pdm_score(plan, self.ego, self.scene, self.reference_progress_m, self.vehicle)


def _relative_angle(pose: tuple[float, float, float], point: np.ndarray) -> float:
    """Angle (rad) between the pose's heading and the direction to ``point``; NaN when they coincide
    (nuPlan divides by the distance: such an agent is neither ahead nor behind)."""
    d = np.asarray(point) - pose[:2]
    norm = float(np.hypot(*d))
    if norm < 1e-9:
        return float("nan")
    return math.acos(min(max((math.cos(pose[2]) * d[0] + math.sin(pose[2]) * d[1]) / norm, -1.0), 1.0))


def _ego_areas(corners: np.ndarray, scene: PdmScene) -> tuple[np.ndarray, np.ndarray]:
    """([T] off the drivable area: a corner outside it, [T] straddling lanes) for ego corners [T, 4, 2]."""
    steps = len(corners)
    flat = corners.reshape(-1, 2)
    off_road = ~scene.drivable.contains(flat).reshape(steps, 4).all(axis=1)
    if not scene.lanes:
        return off_road, np.zeros(steps, dtype=bool)
    in_lane = np.stack([lane.contains(flat).reshape(steps, 4) for lane in scene.lanes], axis=1)   # [T, L, 4]
    corners_per_lane = in_lane.sum(axis=2)                                     # [T, L]
    straddling = ((corners_per_lane > 0).sum(axis=1) > 1) & (corners_per_lane != 4).all(axis=1)
    return off_road, straddling


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two boxes [4, 2] overlap: their circles meet (a cheap test first), then the exact test."""
    ca, cb = a.mean(axis=0), b.mean(axis=0)
    ra, rb = np.hypot(*(a - ca).T).max(), np.hypot(*(b - cb).T).max()
    return float(np.hypot(*(ca - cb))) <= ra + rb and boxes_overlap(a, b)


def _progress_along(line: np.ndarray, point: np.ndarray) -> float:
    """Arc length (m) of the point of ``line`` [M, 2] closest to ``point``."""
    start, seg = line[:-1], np.diff(line, axis=0)
    length = np.hypot(*seg.T)
    t = np.clip(((point - start) * seg).sum(axis=1) / np.maximum(length ** 2, 1e-12), 0.0, 1.0)
    i = int(np.argmin(np.hypot(*(start + t[:, None] * seg - point).T)))
    return float(np.concatenate([[0.0], np.cumsum(length)])[i] + t[i] * length[i])


def _score_rollout(rollout: EgoRollout, scene: PdmScene, vehicle: Vehicle) -> PdmResult:
    """The tracked ego's sub-scores (EP and PDMS against a reference of 0: :meth:`PdmResult.with_reference`)."""
    corners = vehicle.corners(rollout.x, rollout.y, rollout.heading)           # [41, 4, 2]
    off_road, straddling = _ego_areas(corners, scene)
    in_intersection = scene.intersections.contains(np.stack([rollout.x, rollout.y], axis=1))
    agents = scene.agents
    already = {i for i, agent in enumerate(agents) if _overlaps(corners[0], agent.corners(0))}

    # NC: at-fault collisions
    nc, collision_step = 1.0, None
    excused = set(already)
    for step in range(SIM_STEPS + 1):
        pose = (rollout.x[step], rollout.y[step], rollout.heading[step])
        for i, agent in enumerate(agents):
            if i in excused or not _overlaps(corners[step], agent.corners(step)):
                continue
            if abs(rollout.speed[step]) <= COLLISION_STOPPED_SPEED_MPS:
                at_fault = False                                               # the ego stood
            elif agent.initial_speed_mps <= COLLISION_STOPPED_SPEED_MPS:
                at_fault = True                                                # it stood
            elif _relative_angle(pose, agent.xy[step]) > math.radians(AGENT_BEHIND_DEG):
                at_fault = False                                               # hit from behind
            elif boxes_overlap(corners[step][[0, 3]], agent.corners(step)):
                at_fault = True                                                # the ego's front edge hit it
            else:                                                              # lateral
                at_fault = bool(straddling[step] or off_road[step])
            if at_fault:
                nc = min(nc, 0.0 if agent.kind in AGENT_KINDS else STATIC_OBJECT_NC)
                collision_step = step if collision_step is None else collision_step
            else:
                excused.add(i)

    # TTC: the ego box moved on at its speed for 0 ... 0.9 s against the agents then
    ttc, ttc_step = 1.0, None
    excused = set(already)
    for step in range(SIM_STEPS + 1):
        if abs(rollout.speed[step]) < TTC_STOPPED_SPEED_MPS or ttc_step is not None:
            continue
        pose = (rollout.x[step], rollout.y[step], rollout.heading[step])
        velocity = rollout.speed[step] * np.array([math.cos(pose[2]), math.sin(pose[2])])
        for ahead in TTC_PROJECTION_STEPS:
            moved = corners[step] + velocity * ahead * SIM_DT_S
            for i, agent in enumerate(agents):
                if i in excused or not _overlaps(moved, agent.corners(step + ahead)):
                    continue
                angle = _relative_angle(pose, agent.xy[step + ahead])
                exposed = straddling[step] or off_road[step] or in_intersection[step]
                if angle < math.radians(AGENT_AHEAD_DEG) or (exposed and not angle > math.radians(AGENT_BEHIND_DEG)):
                    ttc, ttc_step = 0.0, step
                else:
                    excused.add(i)

    dac = 0.0 if off_road.any() else 1.0
    centres = vehicle.centres(rollout.x, rollout.y, rollout.heading)
    progress = max(0.0, _progress_along(scene.centreline, centres[-1]) - _progress_along(scene.centreline, centres[0]))
    comfort = comfort_checks(rollout)
    return PdmResult(nc, dac, ttc, ep=0.0, c=1.0 if all(comfort.values()) else 0.0, pdms=0.0, progress_m=progress,
                     reference_progress_m=0.0,
                     collision_time_s=None if collision_step is None else collision_step * SIM_DT_S,
                     ttc_time_s=None if ttc_step is None else ttc_step * SIM_DT_S, comfort=comfort,
                     rollout=rollout).with_reference(0.0)


def reference_progress(reference_plan, ego: EgoStart, scene: PdmScene, vehicle: Vehicle = Vehicle()) -> float:
    """A rule-based reference plan's progress (m) x NC x DAC (``reference_progress_m``), as NAVSIM's PDM-Closed's."""
    return _score_rollout(track_plan(reference_plan, ego, vehicle), scene, vehicle).weighted_progress_m


def pdm_score(plan, ego: EgoStart, scene: PdmScene, reference_progress_m: float,
              vehicle: Vehicle = Vehicle()) -> PdmResult:
    """Track ``plan`` [8, 2] for 4 s and score it against ``reference_progress_m`` (:func:`reference_progress`);
    ValueError on a plan that is not 8 finite waypoints or a reference progress not finite and >= 0."""
    return _score_rollout(track_plan(plan, ego, vehicle), scene, vehicle).with_reference(reference_progress_m)
