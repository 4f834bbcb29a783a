"""One closed-loop route of the demo world: its world, camera, command, route messages and score. ROS-free.

    run = RouteRun(index=0, settings=ClosedLoopSettings(route_length_m=200.0))
    while not run.done:
        run.apply(control)                                     # one control per tick (CARLA's fields)
    run.result().driving_score

A loop feeds it one control per tick: ``sim.direct_loop.drive_direct`` (the planner in-process) or
``wam_diff2_ros.tools`` (the nodes over DDS). Route ``i`` is the demo world ``World.generate(default_rng([seed,
i]))`` driven from the ego's start for ``route_length_m`` along the ego lane, traffic off unless asked for.
The score is leaderboard-like, and ``RouteResult.termination`` says how the route ended (docs/carla.md,
"Score"): route completion without the distance driven off the ego lane, x 0.60 per vehicle collision.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..evaluation.metrics import pdm_entry, pdm_means
from ..control import Plan, Pose2D, VehicleControl
from ..geometry import AccelerationEstimator
from ..frame_inputs import NS_PER_S
from ..routes import RouteTracker, RouteTrackerSettings
from .camera import CameraSettings, Palette, Renderer
from .episode import EpisodeSettings, episode_rng
from .truth import CommandSettings, route_command
from .pdm_scenes import world_pdm_inputs
from .protocol import DEFAULT_ROUTE_SEED, ROUTE_LENGTH_M
from .road import PUBLISHED_ROUTE_SPACING_M
from .world import World, WorldSettings

COLLISION_PENALTY = 0.60          # leaderboard: collision with a vehicle
COMMAND_SOURCES = ("world", "route")


@dataclass(frozen=True)
class ClosedLoopSettings:
    seed: int = DEFAULT_ROUTE_SEED         # routes are (seed, 0), (seed, 1), ...
    route_length_m: float = ROUTE_LENGTH_M
    traffic: bool = False
    command_source: str = "world"          # world: the demo world's command rule (its training labels);
                                           # route: a RouteTracker on the route with RoadOptions
    timeout_s: float | None = None         # None: route_length_m / 2 m/s + 10 s
    blocked_timeout_s: float = 20.0        # no progress (0.1 m) for this long ends the route
    max_lateral_offset_m: float = 6.0      # farther from the lane centre: off the road, the route ends
    start_time_s: float = EpisodeSettings().start_time_s
    world: WorldSettings = field(default_factory=WorldSettings)
    camera: CameraSettings = field(default_factory=CameraSettings)
    command: CommandSettings = field(default_factory=CommandSettings)
    acceleration_time_constant_s: float = EpisodeSettings().estimator_time_constant_s   # as the planner node
    pdm_score: bool = True                 # PDM-score every plan on the state it was made on (world_pdm_inputs:
                                           # a rollout of a copy of the world per plan)

    def __post_init__(self):
        if self.command_source not in COMMAND_SOURCES:
            raise ValueError(f"command_source: {self.command_source!r} is not one of {', '.join(COMMAND_SOURCES)}")
        if not self.route_length_m > 0:
            raise ValueError(f"route_length_m: must be > 0, got {self.route_length_m}")

    @property
    def route_timeout_s(self) -> float:
        return self.timeout_s if self.timeout_s is not None else self.route_length_m / 2.0 + 10.0


@dataclass
class RouteResult:
    index: int
    seed: int
    route_length_m: float
    termination: str
    completed: bool
    route_completion: float
    infraction_penalty: float
    driving_score: float
    success: bool
    collisions: list[int]                 # ids of the vehicles hit, one entry per event
    lane_departures: int
    off_lane_m: float
    max_lateral_offset_m: float
    sim_time_s: float
    ticks: int
    mean_speed_mps: float
    plans: int                            # planning ticks
    plans_valid: int
    plans_retried: int                    # answers decoded again because they did not parse (parse_retry)
    controls_fallback: int                # ticks braking on a fallback (no / invalid / stale plan ...)
    fallback_reasons: dict[str, int]
    max_throttle_on_fallback: float       # must be 0: the controller never accelerates without a plan
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)   # loop-specific statistics (e.g. ROS timing)


class ControlLike(Protocol):
    throttle: float
    steer: float
    brake: float
    reason: str


class RouteRun:
    """One route of the demo world: its world, camera, command, route messages and score."""

    def __init__(self, index: int, settings: ClosedLoopSettings = ClosedLoopSettings()):
        self.index, self.settings = index, settings
        world_settings = settings.world.with_traffic(settings.traffic)
        rng = episode_rng(settings.seed, index)
        slowest = world_settings.cruise_speed_mps[0]
        # a road long enough for the route at any cruise speed (plus the world's view margin)
        self.world = World.generate(rng, world_settings, duration_s=settings.route_length_m / slowest, horizon_s=0.0)
        self.renderer = Renderer(self.world.road, settings.camera, Palette.random(rng), rng)
        self.start_s = self.world.lane_s
        self.end_s = min(self.start_s + settings.route_length_m, self.world.road.lane.length)
        self.dt_ns = int(round(world_settings.dt_s * NS_PER_S))
        self.start_ns = int(round(settings.start_time_s * NS_PER_S))
        self._estimator = AccelerationEstimator(settings.acceleration_time_constant_s)
        self.acceleration = (0.0, 0.0)
        self.tracker: RouteTracker | None = None
        if settings.command_source == "route":
            # the demo world's labels read sharp lane-follow curves from the geometry
            self.tracker = RouteTracker(RouteTrackerSettings(lanefollow_geometry=True,
                                                             option_lookahead_m=settings.command.crossing_distance_m,
                                                             geometry=settings.command.route))
            self.tracker.set_route(*self.route_with_options())
        # scoring state
        self.termination: str | None = None
        self.collisions: list[int] = []
        self._touching: int | None = None
        self.lane_departures, self.off_lane_m, self.max_lateral = 0, 0.0, 0.0
        self._off_lane, self._last_s = False, self.start_s
        self._progress_s, self._progress_t = self.start_s, 0.0           # last real progress (blocked check)
        self.plans = self.plans_valid = self.plans_retried = 0
        self.pdm: list[dict[str, Any]] = []                           # pdm_entry per plan scored
        self.valid_candidates: list[int] = []                         # per plan: candidates parsed (selection on)
        self.fallbacks: Counter[str] = Counter()
        self.max_throttle_on_fallback = 0.0
        self.trace: list[tuple[float, float, float, bool]] = []       # x, y, speed, fallback
        self.events: list[tuple[str, float, float]] = []              # (kind, x, y)
        self._wall0 = time.perf_counter()
        self.observe()

    @property
    def tick(self) -> int:
        return self.world.tick

    @property
    def stamp_ns(self) -> int:
        return self.start_ns + self.world.tick * self.dt_ns

    @property
    def stamp_s(self) -> float:
        return self.stamp_ns / NS_PER_S

    @property
    def pose(self) -> Pose2D:
        ego = self.world.ego
        return Pose2D(ego.x, ego.y, ego.yaw)

    @property
    def speed(self) -> float:
        return self.world.ego.speed

    def observe(self) -> None:
        """Once per tick, before planning: the acceleration estimate the planner node derives from odometry."""
        ego = self.world.ego
        self.acceleration = self._estimator.update(self.stamp_s, ego.speed, 0.0, ego.yaw_rate)
        if self.tracker is not None:
            self._route_command = self.tracker.update((ego.x, ego.y), ego.yaw, self.stamp_s)

    def render(self) -> np.ndarray:
        """[H, W, 3] RGB of the front camera now."""
        return self.renderer.render((self.world.ego.x, self.world.ego.y, self.world.ego.yaw),
                                    self.world.vehicle_boxes()).rgb

    def command(self) -> str:
        """The navigation command for the planner now (``command_source``)."""
        if self.tracker is not None:
            return self._route_command or "straight"
        ego = self.world.ego
        return route_command(self.world.road, self.world.lane_s, (ego.x, ego.y, ego.yaw), self.settings.command)[0]

    def route_xy(self) -> np.ndarray:
        """The route as published (a Path): the ego lane every PUBLISHED_ROUTE_SPACING_M, to the route end + 60 m."""
        lane = self.world.road.lane
        end = min(lane.length, self.end_s + self.settings.command.crossing_distance_m)
        s = np.arange(0.0, end, PUBLISHED_ROUTE_SPACING_M)
        return lane.interpolate(np.append(s, end))[0]

    def route_with_options(self) -> tuple[np.ndarray, list[str]]:
        """The route as a CarlaRoute carries it: points (the crossings' entries and exits among them), a RoadOption
        each (the turn from a crossing's entry to its exit, LANEFOLLOW elsewhere)."""
        lane = self.world.road.lane
        end = min(lane.length, self.end_s + self.settings.command.crossing_distance_m)
        stations = set(np.arange(0.0, end, PUBLISHED_ROUTE_SPACING_M).tolist()) | {end}
        spans = [(c.lane_s_entry, c.lane_s_exit, c.turn.upper()) for c in self.world.road.crossings]
        stations |= {s for a, b, _ in spans for s in (a, b) if s < end}
        stations = np.array(sorted(stations))
        options = [next((turn for a, b, turn in spans if a <= s < b), "LANEFOLLOW") for s in stations]
        return lane.interpolate(stations)[0], options

    def apply(self, control: ControlLike) -> None:
        """Integrate one control (CARLA convention) and score the tick."""
        if self.done:
            raise RuntimeError("the route has ended")
        fallback = bool(control.reason)
        if fallback:
            self.fallbacks[control.reason.split(" (")[0]] += 1
            self.max_throttle_on_fallback = max(self.max_throttle_on_fallback, float(control.throttle))
        ego = self.world.ego
        self.trace.append((ego.x, ego.y, ego.speed, fallback))
        # Any object with CARLA's fields (the core's VehicleControl or a ROS message), clipped as CARLA does.
        self.world.step(VehicleControl(throttle=float(np.clip(control.throttle, 0.0, 1.0)),
                                       steer=float(np.clip(control.steer, -1.0, 1.0)),
                                       brake=float(np.clip(control.brake, 0.0, 1.0))))
        self._score()
        self.observe()

    def count_plan(self, plan: Plan | None) -> None:
        """A plan made on this tick's state (before the world moves on): counted and PDM-scored."""
        self.plans += 1
        valid = plan is not None and plan.valid
        self.plans_valid += int(valid)
        self.score_plan(plan.waypoints if valid else None)

    def score_plan(self, waypoints) -> None:
        """The PDM score (NAVSIM v1, ``pdm_score``) of a plan made on this tick's state, against the world's
        traffic and expert from here (``world_pdm_inputs``); None: no valid plan (PDMS 0)."""
        if self.settings.pdm_score:
            self.pdm.append(pdm_entry(None if waypoints is None else world_pdm_inputs(self.world).score(waypoints)))

    def _score(self) -> None:
        st, world = self.settings, self.world
        status = world.status()
        t = self.stamp_s - self.settings.start_time_s
        ds = max(0.0, status.lane_s_m - self._last_s)
        self._last_s = max(self._last_s, status.lane_s_m)
        x, y = world.ego.x, world.ego.y
        if status.off_lane:
            self.off_lane_m += ds
            if not self._off_lane:
                self.lane_departures += 1
                self.events.append(("lane departure", x, y))
        self._off_lane = status.off_lane
        if status.collision_with is not None and status.collision_with != self._touching:
            self.collisions.append(int(status.collision_with))
            self.events.append(("collision", x, y))
        self._touching = status.collision_with
        self.max_lateral = max(self.max_lateral, abs(status.lateral_offset_m))
        if status.lane_s_m > self._progress_s + 0.1:
            self._progress_s, self._progress_t = status.lane_s_m, t
        if status.lane_s_m >= self.end_s:
            self.termination = "completed"
        elif abs(status.lateral_offset_m) > st.max_lateral_offset_m:
            self.termination = "route_deviation"
            self.events.append(("left the road", x, y))
        elif t - self._progress_t > st.blocked_timeout_s:
            self.termination = "agent_blocked"
        elif t >= st.route_timeout_s:
            self.termination = "route_timeout"

    @property
    def done(self) -> bool:
        return self.termination is not None

    def result(self, extra: dict[str, Any] | None = None) -> RouteResult:
        progress = min(self.world.lane_s, self.end_s) - self.start_s - self.off_lane_m   # no credit off the lane
        rc = float(np.clip(progress / (self.end_s - self.start_s), 0.0, 1.0))
        ip = COLLISION_PENALTY ** len(self.collisions)
        speeds = [s for _, _, s, _ in self.trace]
        completed = self.termination == "completed"
        return RouteResult(
            index=self.index, seed=self.settings.seed, route_length_m=self.end_s - self.start_s,
            termination=self.termination or "running", completed=completed, route_completion=rc,
            infraction_penalty=ip, driving_score=rc * ip,
            success=completed and not self.collisions and self.lane_departures == 0,
            collisions=list(self.collisions), lane_departures=self.lane_departures, off_lane_m=self.off_lane_m,
            max_lateral_offset_m=self.max_lateral, sim_time_s=self.world.tick * self.dt_ns / NS_PER_S,
            ticks=self.world.tick, mean_speed_mps=float(np.mean(speeds)) if speeds else 0.0, plans=self.plans,
            plans_valid=self.plans_valid, plans_retried=self.plans_retried,
            controls_fallback=sum(self.fallbacks.values()),
            fallback_reasons=dict(self.fallbacks), max_throttle_on_fallback=self.max_throttle_on_fallback,
            wall_s=time.perf_counter() - self._wall0,
            extra={**({"pdm": pdm_means(self.pdm)} if self.pdm else {}),
                   **({"valid_candidates_mean": float(np.mean(self.valid_candidates))} if self.valid_candidates else {}),
                   **(extra or {})})
