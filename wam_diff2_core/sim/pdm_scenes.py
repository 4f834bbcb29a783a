"""A demo-world frame as a PDM-score scene: the road, the traffic and the expert's drive as NAVSIM's inputs,
in the ego frame at the frame's tick (what goes in: sim/README.md, "PDM score of a frame's plan"). The
reference planner is the demo world's expert: its own drive from the frame, scored through the same tracker,
gives ``reference_progress_m``, as NAVSIM uses PDM-Closed's. Candidate selection scores against less
(:func:`frame_online_scene`, :func:`world_online_scene`): only what a planner on the ego knows.

    episode = simulate_episode(seed=0, index=3, settings=EpisodeSettings(frames=50))
    result = score_frame_plan(episode, frame=10, plan=waypoints)        # pdm.score.PdmResult
    result.pdms, result.nc, result.ep
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..candidate_selection import (CORRIDOR_AHEAD_M, CORRIDOR_BEHIND_M, DEFAULT_LANE_WIDTH_M, OnlineScene,
                                   TrackedObject, online_scene)
from ..geometry import EgoBox, world_to_ego
from ..pdm.scene import OBSERVATION_SAMPLES, SIM_DT_S, AgentTrack, Area, EgoStart, PdmScene, Vehicle
from ..pdm.score import PdmInputs, PdmResult, reference_progress
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .dataset_export import planning_sample_frame, settings_from_manifest
from .episode import Episode, simulate_episode
from .road import RoadMap
from .vehicles import BicycleParams
from .world import VehicleBox, World


def _samples_every(dt_s: float) -> int:
    """World ticks per score step (:data:`SIM_DT_S`); ValueError when the world's tick does not divide it."""
    every = round(SIM_DT_S / dt_s)
    if every < 1 or not math.isclose(every * dt_s, SIM_DT_S):
        raise ValueError(f"the world's tick ({dt_s} s) does not divide the score's {SIM_DT_S} s step")
    return every


def _agent_tracks(samples: list[list[VehicleBox]], origin: np.ndarray, yaw: float) -> list[AgentTrack]:
    """The traffic of ``samples[0]`` (the plan's stamp) as tracks: its box in each later sample (one every
    :data:`SIM_DT_S`); past the samples, or once a vehicle has left, its last box moves on at its last speed."""
    tracks = []
    for vehicle in samples[0]:
        xy, heading = [], []
        last, last_k = vehicle, 0
        for k in range(OBSERVATION_SAMPLES):
            box = next((b for b in samples[k] if b.id == vehicle.id), None) if k < len(samples) else None
            if box is not None:
                last, last_k = box, k
            ahead = (k - last_k) * SIM_DT_S * last.speed                    # 0 on a sample's own box
            xy.append((last.x + ahead * math.cos(last.yaw), last.y + ahead * math.sin(last.yaw)))
            heading.append(last.yaw)
        tracks.append(AgentTrack(xy=world_to_ego(np.array(xy), origin, yaw), yaw=np.array(heading) - yaw,
                                 length_m=vehicle.length_m, width_m=vehicle.width_m, kind="vehicle",
                                 name=f"{vehicle.label} {vehicle.id}"))
    return tracks


def _inputs(road: RoadMap, pose: tuple[float, float, float], lane_s: float, samples: list[list[VehicleBox]],
            ego: EgoStart, ego_params: BicycleParams, expert_future: np.ndarray) -> PdmInputs:
    """The PDM-score inputs at a pose of the ego on ``road`` (module docstring): ``samples`` the traffic
    every :data:`SIM_DT_S` from now, ``expert_future`` [8, 2] the reference planner's drive (ego frame)."""
    x, y, yaw = pose
    origin = np.array([x, y])

    def local(points: np.ndarray) -> np.ndarray:
        return world_to_ego(points, origin, yaw)

    window = (road.lane.s >= lane_s - CORRIDOR_BEHIND_M) & (road.lane.s <= lane_s + CORRIDOR_AHEAD_M)   # [N]
    width = road.settings.lane_width_m
    route = local(road.lane.points[window])
    oncoming = local(road.oncoming.points[::-1][window])      # oncoming is the offset centreline, reversed
    lanes = [Area.corridor(route, width), Area.corridor(oncoming, width)]
    drivable = Area.corridor(local(road.centreline.points[window]), 2 * width)
    reach = CORRIDOR_AHEAD_M + road.settings.stub_length_m
    for stub, (towards, away) in zip(road.stubs, road.stub_lanes):
        if np.hypot(*(stub.points[0] - origin)) <= reach:
            drivable = drivable | Area.corridor(local(stub.points), 2 * width)
            lanes += [Area.corridor(local(towards.points), width), Area.corridor(local(away.points), width)]
    crossings = Area(polygons=tuple(local(c.corners()) for c in road.crossings
                                    if np.hypot(*(c.centre - origin)) <= reach))
    scene = PdmScene(centreline=route, drivable=drivable | crossings, agents=_agent_tracks(samples, origin, yaw),
                     lanes=lanes, intersections=crossings)
    vehicle = Vehicle(EgoBox(ego_params.length_m, ego_params.width_m, ego_params.rear_overhang_m),
                      ego_params.wheelbase_m)
    reference = reference_progress(expert_future, ego, scene, vehicle)
    return PdmInputs(scene, ego, vehicle, reference)


def _frame_tick(episode: Episode, frame: int) -> int:
    if not 0 <= frame < episode.settings.frames:
        raise ValueError(f"frame {frame} is not in the episode (0 ... {episode.settings.frames - 1})")
    return episode.settings.frame_tick(frame)


def frame_pdm_inputs(episode: Episode, frame: int) -> PdmInputs:
    """The PDM-score inputs of a recorded ``frame`` (module docstring); ValueError for a frame the episode lacks."""
    tick = _frame_tick(episode, frame)
    every = _samples_every(episode.settings.dt_s)
    track = episode.track
    samples = [episode.traffic[t] for t in range(tick, min(len(episode.traffic), tick + OBSERVATION_SAMPLES * every),
                                                 every)]
    ego = EgoStart(float(track.speed[tick]), float(track.acceleration[tick]), float(track.steer_angle[tick]))
    return _inputs(episode.road, track.pose(tick), float(track.lane_s[tick]), samples, ego,
                   episode.settings.world.ego, episode.future_waypoints(tick))


ROUTE_SPACING_M = 1.0      # the online route: the ego lane's centre line, a point every this many metres


def frame_online_scene(episode: Episode, frame: int, lane_width_m: float = DEFAULT_LANE_WIDTH_M) -> OnlineScene:
    """What candidate selection scores ``frame``'s plans against (``candidate_selection.online_scene``): the ego,
    the ego lane as route, the traffic as tracked objects; nothing of the recorded future (as the node has it)."""
    tick, track = _frame_tick(episode, frame), episode.track
    x, y, yaw = track.pose(tick)
    return online_scene((x, y), yaw, float(track.speed[tick]), float(track.accel_estimated[tick, 0]),
                        float(track.yaw_rate[tick]), episode.road.lane.resampled(ROUTE_SPACING_M),
                        tracked_objects(episode.snapshots[frame]), lane_width_m)


def world_online_scene(run, lane_width_m: float = DEFAULT_LANE_WIDTH_M) -> OnlineScene:
    """:func:`frame_online_scene` of a live route ``run`` (``sim.route_runs.RouteRun``, read by attribute: it
    imports this module) now: the route as published (``run.route_xy()``), the world's vehicles now."""
    ego = run.world.ego
    return online_scene((ego.x, ego.y), ego.yaw, float(ego.speed), float(run.acceleration[0]), float(ego.yaw_rate),
                        run.route_xy(), tracked_objects(run.world.vehicle_boxes()), lane_width_m)


def tracked_objects(boxes: list[VehicleBox]) -> list[TrackedObject]:
    """The demo world's vehicles (map frame) as tracked objects, measured now, moving along their heading."""
    return [TrackedObject(v.x, v.y, v.yaw, v.speed * math.cos(v.yaw), v.speed * math.sin(v.yaw), v.length_m,
                          v.width_m, name=f"{v.label} {v.id}") for v in boxes]


def world_pdm_inputs(world: World) -> PdmInputs:
    """The PDM-score inputs of a live world now: the traffic and the expert's drive from a rollout of a copy of
    the world (:meth:`World.expert_rollout`, non-reactive to the plan scored)."""
    every = _samples_every(world.settings.dt_s)
    waypoint_every = round(WAYPOINT_DT_S / world.settings.dt_s)
    samples, expert = [world.vehicle_boxes()], []

    def visit(k: int) -> None:
        if k % every == 0:
            samples.append(world.vehicle_boxes())
        if k % waypoint_every == 0 and len(expert) < NUM_WAYPOINTS:
            expert.append((world.ego.x, world.ego.y))

    start = world.expert_rollout((OBSERVATION_SAMPLES - 1) * every, visit)
    pose = (start.x, start.y, start.yaw)
    ego = EgoStart(float(start.speed), float(start.acceleration), float(start.steer_angle))
    return _inputs(world.road, pose, float(world.lane_s), samples, ego, world.settings.ego,
                   world_to_ego(np.array(expert), pose[:2], pose[2]))


def score_frame_plan(episode: Episode, frame: int, plan, inputs: PdmInputs | None = None) -> PdmResult:
    """The PDM score of ``plan`` [8, 2] (ego frame) at ``frame``; ``inputs`` reuses a frame's inputs
    (several plans of one frame: the scene and the reference are built once)."""
    return (inputs or frame_pdm_inputs(episode, frame)).score(plan)


class DataSetPdm:
    """PDM scores of a ``wam-diff2 synth`` folder's planning samples, each frame's episode simulated again.

        pdm = DataSetPdm.for_data("data/synth/val.json")       # None: not a synth data set
        pdm.score("synth0-e0007-f00040-plan", waypoints)        # PdmResult, or None (not such a sample)
    """

    def __init__(self, root: str | Path, keep_episodes: int = 2):
        path = Path(root) / "manifest.json"
        try:
            self.settings = settings_from_manifest(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        self.keep_episodes = keep_episodes
        self._episodes: dict[int, Episode] = {}                     # the latest few, by episode index
        self._inputs: dict[str, PdmInputs | None] = {}

    @classmethod
    def for_data(cls, data: str | Path) -> "DataSetPdm | None":
        """The scorer of the data set ``data`` (a samples file) belongs to; None without a manifest beside it."""
        root = Path(data).parent
        return cls(root) if (root / "manifest.json").is_file() else None

    def _frame_of(self, sample_id: str) -> tuple[Episode, int] | None:
        """(episode, frame) of a planning sample of this data set; None for an id it did not write."""
        where = planning_sample_frame(sample_id)
        if where is None or where[0] != self.settings.seed or where[1] >= self.settings.episodes \
                or where[2] >= self.settings.episode.frames:
            return None
        return self._episode(where[1]), where[2]

    def inputs(self, sample_id: str) -> PdmInputs | None:
        """The frame's inputs of a planning sample of this data set (None: an id it did not write)."""
        if sample_id not in self._inputs:
            where = self._frame_of(sample_id)
            self._inputs[sample_id] = None if where is None else frame_pdm_inputs(*where)
        return self._inputs[sample_id]

    def _episode(self, index: int) -> Episode:
        """Episode ``index`` of this data set, simulated again (the latest ``keep_episodes`` are kept)."""
        if index not in self._episodes:
            while len(self._episodes) >= self.keep_episodes:
                self._episodes.pop(next(iter(self._episodes)))
            self._episodes[index] = simulate_episode(self.settings.seed, index, self.settings.episode)
        return self._episodes[index]

    def online_scene(self, sample_id: str, lane_width_m: float = DEFAULT_LANE_WIDTH_M) -> OnlineScene | None:
        """:func:`frame_online_scene` of a planning sample's frame; None for an id this data set did not write."""
        where = self._frame_of(sample_id)
        return None if where is None else frame_online_scene(*where, lane_width_m)

    def score(self, sample_id: str, plan) -> PdmResult | None:
        inputs = self.inputs(sample_id)
        return None if inputs is None else inputs.score(plan)
