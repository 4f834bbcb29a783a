"""Episodes: drive the expert through a generated world, then render frames with their ground truth.

    >>> settings = EpisodeSettings(frames=3, camera=CameraSettings(width=160, height=90))
    >>> episode = simulate_episode(seed=0, index=0, settings=settings)
    >>> frames = list(episode.frames())
    >>> len(frames), frames[0].rgb.shape, frames[0].truth.waypoints.shape
    (3, (90, 160, 3), (8, 2))

Two passes: :func:`simulate_episode` steps the world from tick 0 to the last frame plus the 4 s horizon,
storing the ego and the traffic at every tick; :meth:`Episode.frames` then renders each frame and derives its
ground truth, so the future waypoints are the expert's simulated future (the timeline: sim/README.md). All is
drawn from ``numpy.random.default_rng([seed, index])`` in a fixed order: an episode is a pure function of
(seed, index, settings).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from ..frame_inputs import InputSettings
from ..geometry import AccelerationEstimator, world_to_ego
from ..outputs.parsing import BOX_SCALE
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .camera import CameraSettings, Palette, PixelBox, Renderer
from .expert import Leader
from .road import RoadMap
from .truth import (QUESTIONS, CommandSettings, answer_action, answer_count, answer_lead, answer_road,
                    route_command)
from .world import VehicleBox, World, WorldSettings


@dataclass(frozen=True)
class RecoverySettings:
    """Recovery samples (sim/README.md): a ``fraction`` of the frames also gets a copy seen from a displaced
    ego (offset and heading error uniform within the limits; a separate random stream), answered with the
    expert's drive back from there; its speed changed to zero (``standstill_probability``) or to a uniform
    share (``slow_probability``), its prompt then carries that speed and zero acceleration."""
    fraction: float = 0.0
    max_offset_m: float = 1.0
    max_yaw_deg: float = 10.0
    standstill_probability: float = 0.0
    slow_probability: float = 0.0

    def __post_init__(self):
        for name in ("fraction", "standstill_probability", "slow_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"recovery {name} must be in [0, 1], got {getattr(self, name)}")
        if self.standstill_probability + self.slow_probability > 1.0:
            raise ValueError("recovery standstill_probability + slow_probability must be <= 1")
        if self.max_offset_m < 0 or self.max_yaw_deg < 0:
            raise ValueError(f"recovery limits must be >= 0, got {self.max_offset_m} m, {self.max_yaw_deg} deg")


@dataclass(frozen=True)
class Recovery:
    pose: tuple[float, float, float]   # the displaced rear axle x, y, yaw in the map frame
    offset_m: float                    # sideways, + left
    yaw_deg: float                     # + left
    speed: float                       # m/s: the frame's own, or the changed one
    speed_changed: bool                # then the prompt's acceleration is zero
    waypoints: np.ndarray              # [8, 2] the expert's drive from the displaced pose, in its ego frame


@dataclass(frozen=True)
class EpisodeSettings:
    frames: int = 200
    frame_stride: int = 1                 # ticks between camera frames (1: 20 Hz)
    warmup_ticks: int = 20
    start_time_s: float = 1.0             # stamp of tick 0 (a zero stamp reads as "unset" in ROS)
    traffic: bool = True
    world: WorldSettings = field(default_factory=WorldSettings)
    camera: CameraSettings = field(default_factory=CameraSettings)
    command: CommandSettings = field(default_factory=CommandSettings)
    estimator_time_constant_s: float = InputSettings().acceleration_time_constant_s   # as the planner node's
    recovery: RecoverySettings = field(default_factory=RecoverySettings)

    def __post_init__(self):
        for name, low in (("frames", 1), ("frame_stride", 1), ("warmup_ticks", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")

    @property
    def dt_s(self) -> float:
        return self.world.dt_s

    @property
    def horizon_ticks(self) -> int:
        return int(round(NUM_WAYPOINTS * WAYPOINT_DT_S / self.dt_s))

    def frame_tick(self, frame: int) -> int:
        return self.warmup_ticks + frame * self.frame_stride

    @property
    def total_ticks(self) -> int:
        """Ticks stored: 0 .. last frame + horizon, inclusive."""
        return self.frame_tick(self.frames - 1) + self.horizon_ticks + 1


@dataclass
class EgoTrack:
    """The ego at every tick (arrays of length total_ticks)."""
    stamp_s: np.ndarray
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray            # continuous (not wrapped)
    speed: np.ndarray
    acceleration: np.ndarray   # longitudinal, over the step into this tick
    yaw_rate: np.ndarray
    steer_angle: np.ndarray
    lane_s: np.ndarray
    accel_estimated: np.ndarray   # [T, 2] AccelerationEstimator on the odometry twist

    def pose(self, tick: int) -> tuple[float, float, float]:
        return float(self.x[tick]), float(self.y[tick]), float(self.yaw[tick])


@dataclass
class FrameTruth:
    episode: int
    frame: int
    tick: int
    stamp_s: float
    pose: tuple[float, float, float]             # rear axle x, y, yaw in the map frame
    velocity: tuple[float, float]                # ego frame, m/s
    acceleration: tuple[float, float]            # ego frame, m/s^2, true (dv/dt, v * yaw rate)
    acceleration_estimated: tuple[float, float]  # what the planner node estimates from odometry
    yaw_rate: float
    steer_angle: float
    lane_s: float
    command: str
    command_source: str
    waypoints: np.ndarray                        # [8, 2] ego frame, +0.5 s ... +4.0 s
    boxes: list[PixelBox]
    box_lanes: dict[int, str]                    # vehicle id -> lane name
    leader: Leader | None
    leader_label: str | None
    qa: dict[str, str]                           # question key -> answer

    def qwen_boxes(self, width: int, height: int) -> list[dict]:
        """Grounding answers: ``bbox_2d`` on the 0..1000 scale, left to right."""
        scale = int(BOX_SCALE)
        return [{"bbox_2d": [min(max(int(round(v / size * scale)), 0), scale)
                             for v, size in zip(b.box, (width, height, width, height))], "label": b.label}
                for b in self.boxes]

    def record(self, width: int, height: int) -> dict:
        """JSON-ready ground truth."""
        return {
            "episode": self.episode, "frame": self.frame, "tick": self.tick,
            "stamp_s": round(self.stamp_s, 6),
            "pose": {"x": self.pose[0], "y": self.pose[1], "yaw": math.remainder(self.pose[2], 2 * math.pi)},
            "velocity": list(self.velocity), "acceleration": list(self.acceleration),
            "acceleration_estimated": list(self.acceleration_estimated),
            "yaw_rate": self.yaw_rate, "steer_angle": self.steer_angle, "lane_s": self.lane_s,
            "command": self.command, "command_source": self.command_source,
            "waypoints": self.waypoints.tolist(),
            "boxes": [{"id": b.id, "label": b.label, "box": list(b.box), "amodal_box": list(b.amodal_box),
                       "visible_pixels": b.visible_pixels, "visible_fraction": round(b.visible_fraction, 4),
                       "distance_m": round(b.distance_m, 3), "lane": self.box_lanes.get(b.id, "")}
                      for b in self.boxes],
            "boxes_qwen": self.qwen_boxes(width, height),
            "leader": None if self.leader is None else {"id": self.leader.vehicle_id, "gap_m": self.leader.gap_m,
                                                        "speed": self.leader.speed, "label": self.leader_label},
            "qa": dict(self.qa),
        }


@dataclass
class Frame:
    rgb: np.ndarray            # [H, W, 3] uint8
    vehicle_ids: np.ndarray    # [H, W] int32, -1 where no vehicle
    truth: FrameTruth


@dataclass
class Episode:
    seed: int
    index: int
    settings: EpisodeSettings
    road: RoadMap
    track: EgoTrack
    snapshots: list[list[VehicleBox]]      # per frame: the traffic
    leaders: list[Leader | None]           # per frame
    renderer: Renderer
    recoveries: dict[int, Recovery] = field(default_factory=dict)   # frame -> its displaced copy
    traffic: list[list[VehicleBox]] = field(default_factory=list)   # per tick: the traffic (bags' objects)

    def future_waypoints(self, tick: int) -> np.ndarray:
        """[8, 2] the ego's positions at +0.5 ... +4.0 s, in the ego frame at ``tick``."""
        step = int(round(WAYPOINT_DT_S / self.settings.dt_s))
        future = np.arange(1, NUM_WAYPOINTS + 1) * step + tick
        points = np.stack([self.track.x[future], self.track.y[future]], 1)
        return world_to_ego(points, self.track.pose(tick)[:2], self.track.yaw[tick])

    def truth(self, frame: int, boxes: list[PixelBox]) -> FrameTruth:
        st, tr = self.settings, self.track
        tick = st.frame_tick(frame)
        pose = tr.pose(tick)
        command, source = route_command(self.road, float(tr.lane_s[tick]), pose, st.command)
        leader = self.leaders[frame]
        lanes = {v.id: v.lane for v in self.snapshots[frame]}
        labels = {v.id: v.label for v in self.snapshots[frame]}
        leader_label = labels.get(leader.vehicle_id) if leader is not None else None
        visible_leader = leader is not None and leader.vehicle_id in {b.id for b in boxes}
        qa = {
            "lead": answer_lead(leader_label if visible_leader else None, leader.gap_m if visible_leader else None),
            "road": answer_road(self.road, float(tr.lane_s[tick])),
            "count": answer_count(len(boxes)),
            "action": answer_action(float(tr.speed[tick]), float(tr.speed[tick + int(round(2.0 / st.dt_s))]),
                                    float(tr.yaw[tick + st.horizon_ticks] - tr.yaw[tick])),
        }
        assert set(qa) == set(QUESTIONS)
        return FrameTruth(
            episode=self.index, frame=frame, tick=tick, stamp_s=float(tr.stamp_s[tick]), pose=pose,
            velocity=(float(tr.speed[tick]), 0.0),
            acceleration=(float(tr.acceleration[tick]), float(tr.speed[tick] * tr.yaw_rate[tick])),
            acceleration_estimated=(float(tr.accel_estimated[tick, 0]), float(tr.accel_estimated[tick, 1])),
            yaw_rate=float(tr.yaw_rate[tick]), steer_angle=float(tr.steer_angle[tick]),
            lane_s=float(tr.lane_s[tick]), command=command, command_source=source,
            waypoints=self.future_waypoints(tick), boxes=boxes, box_lanes=lanes, leader=leader,
            leader_label=leader_label, qa=qa)

    def render(self, frame: int):
        tick = self.settings.frame_tick(frame)
        return self.renderer.render(self.track.pose(tick), self.snapshots[frame])

    def render_recovery(self, frame: int):
        return self.renderer.render(self.recoveries[frame].pose, self.snapshots[frame])

    def frames(self) -> Iterator[Frame]:
        for i in range(self.settings.frames):
            rendering = self.render(i)
            yield Frame(rendering.rgb, rendering.vehicle_ids, self.truth(i, rendering.boxes))


def episode_rng(seed: int, index: int) -> np.random.Generator:
    if seed < 0 or index < 0:
        raise ValueError(f"seed and episode index must be >= 0, got {seed}, {index}")
    return np.random.default_rng([seed, index])


def make_world(seed: int, index: int, settings: EpisodeSettings) -> tuple[World, np.random.Generator]:
    """The episode's world at tick 0 and the generator positioned after it (for the palette)."""
    rng = episode_rng(seed, index)
    world_settings = settings.world.with_traffic(settings.traffic)
    return World.generate(rng, world_settings, duration_s=settings.total_ticks * settings.dt_s, horizon_s=0.0), rng


def simulate_episode(seed: int, index: int, settings: EpisodeSettings = EpisodeSettings()) -> Episode:
    world, rng = make_world(seed, index, settings)
    renderer = Renderer(world.road, settings.camera, Palette.random(rng), rng)
    n = settings.total_ticks
    frame_ticks = {settings.frame_tick(i) for i in range(settings.frames)}
    egos, lane_s, accel_est, traffic, leaders = [], [], [], [], []
    estimator = AccelerationEstimator(time_constant_s=settings.estimator_time_constant_s)
    stamps = settings.start_time_s + np.arange(n) * settings.dt_s
    recovery_rng = np.random.default_rng([seed, index, 2])
    recoveries: dict[int, Recovery] = {}
    for tick in range(n):
        if tick > 0:
            world.step()
        egos.append(world.ego)
        lane_s.append(world.lane_s)
        accel_est.append(estimator.update(float(stamps[tick]), world.ego.speed, 0.0, world.ego.yaw_rate))
        traffic.append(world.vehicle_boxes())
        if tick in frame_ticks:                 # the frames come in tick order
            leaders.append(world.leader())
            if recovery_rng.random() < settings.recovery.fraction:
                recoveries[len(leaders) - 1] = _recovery(world, recovery_rng, settings.recovery)
    track = EgoTrack(stamp_s=stamps, accel_estimated=np.array(accel_est), lane_s=np.array(lane_s),
                     **{k: np.array([getattr(e, k) for e in egos], dtype=np.float64)
                        for k in ("x", "y", "yaw", "speed", "acceleration", "yaw_rate", "steer_angle")})
    snapshots = [traffic[settings.frame_tick(i)] for i in range(settings.frames)]
    return Episode(seed, index, settings, world.road, track, snapshots, leaders, renderer, recoveries, traffic)


def _recovery(world: World, rng: np.random.Generator, settings: RecoverySettings) -> Recovery:
    ego = world.ego
    offset = float(rng.uniform(-settings.max_offset_m, settings.max_offset_m))
    yaw_deg = float(rng.uniform(-settings.max_yaw_deg, settings.max_yaw_deg))
    u, share = float(rng.random()), float(rng.random())
    displaced = replace(ego, x=ego.x - math.sin(ego.yaw) * offset, y=ego.y + math.cos(ego.yaw) * offset,
                        yaw=ego.yaw + math.radians(yaw_deg))
    changed = u < settings.standstill_probability + settings.slow_probability
    if changed:
        speed = 0.0 if u < settings.standstill_probability else share * ego.speed
        displaced = replace(displaced, speed=speed, acceleration=0.0, yaw_rate=0.0)
    waypoints = world.expert_future(NUM_WAYPOINTS, WAYPOINT_DT_S, ego=displaced)
    return Recovery((displaced.x, displaced.y, displaced.yaw), offset, yaw_deg, displaced.speed, changed, waypoints)
