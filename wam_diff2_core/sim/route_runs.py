"""Closed loop in the demo world: a planner and the controller drive the ego along a route. ROS-free.

    settings = ClosedLoopSettings(route_length_m=200.0)
    run = RouteRun(index=0, settings=settings)                 # route (seed, index) of the demo world
    result = drive_direct(run, ExpertOracle(), demo_world_gains(), lockstep_n=10)
    result.driving_score, result.route_completion, result.termination
    plot_route(run, "route_000.png"); summarize([result])

:class:`RouteRun` owns one route's world (``wam_diff2_core.sim.World``), camera and scoring;
a loop feeds it one control per tick. Two loops use it: :func:`drive_direct` (this module: the
planner is called in-process on every N-th tick and the same ``WaypointController`` the
controller node runs turns its newest plan into control every tick; fast, for tests and
sweeps; ``wam-diff2 closed-loop``) and ``wam_diff2_ros.tools.dds_closed_loop`` (the same world behind
carla-ros-bridge topics, with the planner node and the controller node over DDS; ``wam-diff2-ros
closed-loop``).

**Routes.** Route ``i`` is the demo world ``World.generate(default_rng([seed, i]))`` (the
synth generator; evaluation seed 2000 by default, disjoint from ``wam-diff2 synth``'s 0 and
the demo bags' 1000), driven from the ego's start for ``route_length_m`` along the ego lane.
Traffic is off unless asked for. Tick k is stamped ``start_time_s + k x 50 ms``.

**Scoring** (leaderboard-like, documented here because the demo world is not CARLA):

- *Route completion* RC: progress along the route / route length, in [0, 1], where distance
  driven with a wheel outside the ego lane (``World.status().off_lane``) does not count (the
  leaderboard's off-road rule).
- *Infraction penalty* IP: 0.60 per collision with a vehicle (the leaderboard's factor; one
  event per vehicle touched), multiplied. Lane departures (entering ``off_lane``) are counted
  and reported; they cost through RC only.
- *Driving score* DS = RC x IP. *Success*: the route completed with no collision and no lane
  departure.
- A route ends when it is completed, when the ego is farther than ``max_lateral_offset_m``
  from the lane centre (off the road: "route_deviation"), when it made no progress for
  ``blocked_timeout_s`` ("agent_blocked"), or at ``timeout_s`` ("route_timeout", default
  route length / 2 m/s + 10 s).

**The oracle** (:class:`ExpertOracle`) is *not a planner*: it reads the simulator's state and
answers with the demo world's expert future (the ground truth the demo model is trained on).
It exists to test the control + simulation loop, and to bound what a perfect planner would
score with this controller.

**Controller gains**: :func:`demo_world_gains` scales TransFuser's steering gains for the demo
car's smaller maximum wheel angle (see there); the CLI uses it by default.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..evaluation.metrics import PDM_SUBSCORES, pdm_entry, pdm_means
from ..control import ControllerGains, Plan, Pose2D, VehicleControl, WaypointController
from ..geometry import AccelerationEstimator, EgoMotion
from ..frame_inputs import NS_PER_S
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from ..routes import RouteTracker, RouteTrackerSettings
from .camera import CameraSettings, Palette, Renderer
from .episode import EpisodeSettings, episode_rng
from .truth import CommandSettings, route_command
from .pdm_scenes import world_pdm_inputs
from .protocol import DEFAULT_ROUTE_SEED
from .world import World, WorldSettings

COLLISION_PENALTY = 0.60          # leaderboard: collision with a vehicle
CARLA_MAX_STEER_RAD = math.radians(70.0)   # CARLA wheel physics: default max_steer_angle of the front wheels
COMMAND_SOURCES = ("world", "route")
TERMINATIONS = ("completed", "route_timeout", "agent_blocked", "route_deviation")


@dataclass(frozen=True)
class ClosedLoopSettings:
    seed: int = DEFAULT_ROUTE_SEED         # routes are (seed, 0), (seed, 1), ...
    route_length_m: float = 200.0
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
                                           # a rollout of the world per plan, ~0.1 s on a CPU core)

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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ControlLike(Protocol):
    throttle: float
    steer: float
    brake: float
    reason: str


class RouteRun:
    """One route of the demo world: its world, camera, command, route messages and score."""

    def __init__(self, index: int, settings: ClosedLoopSettings = ClosedLoopSettings()):
        self.index, self.settings = index, settings
        world_settings = settings.world
        if not settings.traffic:
            world_settings = replace(world_settings, traffic=replace(world_settings.traffic, enabled=False))
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
        self.fallbacks: Counter[str] = Counter()
        self.max_throttle_on_fallback = 0.0
        self.trace: list[tuple[float, float, float, bool]] = []       # x, y, speed, fallback
        self.events: list[tuple[str, float, float]] = []              # (kind, x, y)
        self._wall0 = time.perf_counter()
        self.observe()

    # ------------------------------------------------------------------ what a sensor sees
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

    def route_xy(self, spacing_m: float = 2.0) -> np.ndarray:
        """The route as published (a Path): the ego lane every ``spacing_m``, to the route end + 60 m."""
        lane = self.world.road.lane
        end = min(lane.length, self.end_s + self.settings.command.crossing_distance_m)
        s = np.arange(0.0, end, spacing_m)
        return lane.interpolate(np.append(s, end))[0]

    def route_with_options(self, spacing_m: float = 2.0) -> tuple[np.ndarray, list[str]]:
        """The route as a CarlaRoute would carry it: points and a RoadOption each (LEFT / RIGHT /
        STRAIGHT from a crossing's entry to its exit, LANEFOLLOW elsewhere), the crossing entries
        and exits included as points."""
        lane = self.world.road.lane
        end = min(lane.length, self.end_s + self.settings.command.crossing_distance_m)
        stations = set(np.arange(0.0, end, spacing_m).tolist()) | {end}
        spans = [(c.lane_s_entry, c.lane_s_exit, c.turn.upper()) for c in self.world.road.crossings]
        stations |= {s for a, b, _ in spans for s in (a, b) if s < end}
        stations = np.array(sorted(stations))
        options = []
        for s in stations:
            inside = [turn for a, b, turn in spans if a <= s < b]
            options.append(inside[0] if inside else "LANEFOLLOW")
        return lane.interpolate(stations)[0], options

    # ------------------------------------------------------------------ one tick
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

    def route_completion(self) -> float:
        progress = min(self.world.lane_s, self.end_s) - self.start_s - self.off_lane_m
        return float(np.clip(progress / (self.end_s - self.start_s), 0.0, 1.0))

    def result(self, extra: dict[str, Any] | None = None) -> RouteResult:
        rc = self.route_completion()
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
            extra={**({"pdm": pdm_means(self.pdm)} if self.pdm else {}), **(extra or {})})


# ----------------------------------------------------------------------------- planners for the direct loop
class ExpertOracle:
    """An ORACLE, not a planner: the demo world's expert future from the simulator's state.

    For testing the control + simulation loop (and as the upper bound of a perfect planner
    with this controller); a real planner only ever sees the camera, the ego state and the
    command."""

    name = "oracle"

    def __call__(self, run: RouteRun) -> Plan:
        return Plan(run.stamp_s, run.world.expert_future(NUM_WAYPOINTS, WAYPOINT_DT_S), valid=True, ego_pose=run.pose)


class PolicyPlanner:
    """The driving policy (``wam_diff2_core.policy.DrivingPolicy``) as the planner node calls it."""

    name = "policy"

    def __init__(self, policy):
        self.policy = policy
        self.last_reason = ""

    def __call__(self, run: RouteRun) -> Plan:
        out = self.policy.step(run.render(), EgoMotion(velocity=(run.speed, 0.0), acceleration=run.acceleration),
                               run.command())
        plan = out.plan
        self.last_reason = plan.invalid_reason
        run.plans_retried += int(plan.stats.retries > 0)
        if plan.valid and plan.waypoints is not None:
            return Plan(run.stamp_s, np.asarray(plan.waypoints, dtype=np.float64), valid=True, ego_pose=run.pose)
        return Plan(run.stamp_s, np.zeros((0, 2)), valid=False, ego_pose=run.pose)


class ExpertLabels:
    """DAgger's data: wraps a planner and keeps every frame it is asked about, labelled with the demo
    world's expert drive from that state, i.e. the states the planner's own driving leads to (off the
    expert's path, slowed down, stopped), as planning samples in the authors' format under ``root``
    (images/rNNNN/TTTTTT.jpg, and train.json once :meth:`write` is called). Train on them to teach a
    model to recover from its own mistakes (Ross et al., DAgger); collect on routes other than the
    evaluation ones."""

    def __init__(self, planner: Callable[["RouteRun"], Plan], root: str | Path):
        from .dataset_export import ExportSettings
        self.planner, self.root = planner, Path(root)
        self.name = getattr(planner, "name", type(planner).__name__)
        self.image = ExportSettings()       # the synthetic datasets' image format
        self.samples: list[dict[str, Any]] = []

    def __call__(self, run: "RouteRun") -> Plan:
        from .dataset_export import encode_image, planning_sample
        image_path = f"images/r{run.index:04d}/{run.tick:06d}.{self.image.image_format}"
        (self.root / image_path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / image_path).write_bytes(encode_image(run.render(), self.image))
        expert = run.world.expert_future(NUM_WAYPOINTS, WAYPOINT_DT_S)
        self.samples.append(planning_sample(f"closed-loop-s{run.settings.seed}-r{run.index:04d}-t{run.tick:06d}",
                                            image_path, run.command(), (run.speed, 0.0), run.acceleration, expert))
        return self.planner(run)

    def write(self) -> Path:
        """``root``/train.json with the samples so far (the synthetic datasets' layout)."""
        from ..data.samples import dump_json_list
        self.root.mkdir(parents=True, exist_ok=True)
        dump_json_list(self.root / "train.json", self.samples)
        return self.root / "train.json"


def drive_direct(run: RouteRun, planner: Callable[[RouteRun], Plan], gains: ControllerGains | None = None,
                 lockstep_n: int = 10, on_tick: Callable[[RouteRun], None] | None = None) -> RouteResult:
    """The loop without ROS, ordered as the ROS loop in lockstep timing: at each tick the
    controller (the controller node's ``WaypointController``) answers with the newest plan so
    far; on every ``lockstep_n``-th tick the planner then plans on that tick's camera frame, and
    its plan is followed from the next tick on; the world integrates the control."""
    if lockstep_n < 1:
        raise ValueError(f"lockstep_n: must be >= 1, got {lockstep_n}")
    controller = WaypointController(gains)
    plan = None
    while not run.done:
        control = controller.step(plan, run.pose, run.speed, run.stamp_s)
        if run.tick % lockstep_n == 0:
            plan = planner(run)
            run.count_plan(plan)
        run.apply(control)
        if on_tick is not None:
            on_tick(run)
    return run.result({"loop": "direct", "planner": getattr(planner, "name", type(planner).__name__),
                       "lockstep_n": lockstep_n})


def demo_world_gains(gains: ControllerGains | None = None, steer_gain_scale: float | None = None) -> ControllerGains:
    """TransFuser's gains with the steering PID scaled for the demo world's vehicle.

    CARLA maps steer 1.0 to its vehicles' maximum front-wheel angle (the wheel physics'
    ``max_steer_angle``, 70 degrees by default); the demo world's bicycle maps it to
    ``BicycleParams.max_steer_rad`` (0.6 rad, 34 degrees). Scaling the three steering gains by
    the ratio (about 2.04) gives the PID the wheel-angle response it was tuned for; unscaled, it
    under-steers through the crossings' 9.25 m left turns (measured: 1.8 m off the lane centre).
    """
    from .vehicles import BicycleParams
    gains = gains or ControllerGains()
    scale = steer_gain_scale if steer_gain_scale is not None else CARLA_MAX_STEER_RAD / BicycleParams().max_steer_rad
    return replace(gains, turn_kp=gains.turn_kp * scale, turn_ki=gains.turn_ki * scale, turn_kd=gains.turn_kd * scale)


# ----------------------------------------------------------------------------- reports
def summarize(results: Sequence[RouteResult]) -> dict[str, Any]:
    """Means over routes (driving score, route completion, infraction penalty), success rate and totals."""
    n = len(results)
    if n == 0:
        return {"routes": 0}

    def mean(key: str) -> float:
        return float(np.mean([getattr(r, key) for r in results]))

    return {
        "routes": n,
        "driving_score": mean("driving_score"),
        "route_completion": mean("route_completion"),
        "infraction_penalty": mean("infraction_penalty"),
        "success_rate": mean("success"),
        "completed": sum(r.completed for r in results),
        "collisions": sum(len(r.collisions) for r in results),
        "lane_departures": sum(r.lane_departures for r in results),
        "off_lane_m": float(sum(r.off_lane_m for r in results)),
        "terminations": dict(Counter(r.termination for r in results)),
        "plans": sum(r.plans for r in results),
        "plan_valid_rate": (sum(r.plans_valid for r in results) / max(1, sum(r.plans for r in results))),
        "plans_retried": sum(r.plans_retried for r in results),
        "fallback_tick_rate": sum(r.controls_fallback for r in results) / max(1, sum(r.ticks for r in results)),
        "max_throttle_on_fallback": max(r.max_throttle_on_fallback for r in results),
        "mean_speed_mps": mean("mean_speed_mps"),
        "sim_time_s": float(sum(r.sim_time_s for r in results)),
        "wall_s": float(sum(r.wall_s for r in results)),
        "pdm": _pooled_pdm([r.extra.get("pdm") for r in results]),
    }


def _pooled_pdm(routes: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The routes' PDM means (``pdm_means``) pooled over all their plans; None when no plan was scored."""
    routes = [r for r in routes if r and r["pdm_samples"]]
    if not routes:
        return None
    samples, parsed = sum(r["pdm_samples"] for r in routes), sum(r["pdm_parsed"] for r in routes)
    out = {"pdm_samples": samples, "pdm_parsed": parsed,
           "pdms": sum(r["pdms"] * r["pdm_samples"] for r in routes) / samples}
    for key in PDM_SUBSCORES:
        out[key] = sum(r[key] * r["pdm_parsed"] for r in routes if r["pdm_parsed"]) / parsed if parsed else None
    return out


def summary_line(summary: dict[str, Any]) -> str:
    if not summary.get("routes"):
        return "no routes"
    return (f"{summary['routes']} routes: driving score {100 * summary['driving_score']:.1f}, route completion "
            f"{100 * summary['route_completion']:.1f} %, infraction penalty {summary['infraction_penalty']:.2f}, "
            f"success {100 * summary['success_rate']:.0f} %, {summary['collisions']} collisions, "
            f"{summary['lane_departures']} lane departures, valid plans {100 * summary['plan_valid_rate']:.0f} %"
            + (f" ({summary['plans_retried']} decoded again)" if summary.get("plans_retried") else "")
            + (f", PDMS {100 * summary['pdm']['pdms']:.1f} over {summary['pdm']['pdm_samples']} plans"
               if summary.get("pdm") else ""))


def plot_route(run: RouteRun, path: str | Path) -> None:
    """Bird's-eye view: the road, the route, the ego's track coloured by speed, fallback ticks,
    lane departures and collisions."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    road, result = run.world.road, run.result()
    w = road.settings.lane_width_m
    fig, ax = plt.subplots(figsize=(7, 7), dpi=110)
    for offset, style in ((w, "-"), (-w, "-"), (0.0, "--")):
        edge = road.centreline.offset(offset).points
        ax.plot(edge[:, 0], edge[:, 1], style, color="0.55", lw=0.8)
    for stub in road.stubs:
        for offset in (w, -w):
            edge = stub.offset(offset).points
            ax.plot(edge[:, 0], edge[:, 1], "-", color="0.75", lw=0.6)
    route = road.lane.interpolate(np.linspace(run.start_s, run.end_s, 200))[0]
    ax.plot(route[:, 0], route[:, 1], color="tab:blue", lw=6, alpha=0.15, label="route")
    if run.trace:
        trace = np.array([(x, y, v) for x, y, v, _ in run.trace])
        sc = ax.scatter(trace[:, 0], trace[:, 1], c=trace[:, 2], s=2, cmap="viridis", label="ego (speed)")
        fig.colorbar(sc, ax=ax, shrink=0.6, label="speed (m/s)")
        fallback = np.array([(x, y) for x, y, _, f in run.trace if f])
        if len(fallback):
            ax.scatter(fallback[:, 0], fallback[:, 1], s=6, color="tab:red", marker="x", label="fallback brake")
    markers = {"lane departure": ("tab:orange", "o"), "collision": ("black", "X"), "left the road": ("tab:red", "*")}
    for kind, (colour, marker) in markers.items():
        pts = np.array([(x, y) for k, x, y in run.events if k == kind])
        if len(pts):
            ax.scatter(pts[:, 0], pts[:, 1], s=60, color=colour, marker=marker, label=kind, zorder=5)
    ax.plot(*route[0], "g^", ms=9, label="start")
    ax.plot(*route[-1], "rs", ms=8, label="route end")
    lo, hi = route.min(0) - 25.0, route.max(0) + 25.0
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal")
    ax.set_title(f"route {run.index} (seed {run.settings.seed}): {result.termination}, RC "
                 f"{100 * result.route_completion:.0f} %, DS {100 * result.driving_score:.0f}", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
