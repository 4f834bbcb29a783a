"""The demo world: a road, traffic on its lanes and an ego, stepped at CARLA's 20 Hz.

    >>> import numpy as np
    >>> world = World.generate(np.random.default_rng(0), WorldSettings(), duration_s=5.0)
    >>> world.step()                                      # the expert drives
    >>> world.step(VehicleControl(throttle=0.5))          # or a controller, CARLA style
    >>> world.step(actuation=Actuation(0.0, 0.0))         # or an acceleration + steering angle
    >>> world.tick, round(world.time_s, 2)
    (3, 0.15)

Everything random is drawn in :meth:`World.generate` from the generator passed in; stepping is
deterministic. Traffic moves on rails (IDM, sim/README.md) and sees the ego only as a vehicle ahead in its lane.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from ..geometry import boxes_overlap, world_to_ego
from ..vehicle_projection import VehicleBox
from .expert import ExpertDriver, ExpertSettings, Leader
from .road import Path2D, RoadMap, RoadSettings, RouteSettings, generate_road
from .vehicles import (VEHICLE_SHAPES, TRAFFIC_MIX, Actuation, BicycleParams, EgoState, IdmParams,
                       KinematicBicycle, SpeedEvent, TrafficVehicle, VehicleControl,
                       anticipated_speed_limit, idm_acceleration, speed_step)

EGO_ID = 0
CAR_COLOURS = ((200, 30, 30), (30, 60, 170), (235, 235, 235), (25, 25, 28), (150, 150, 155),
               (200, 170, 30), (40, 120, 60), (120, 30, 110), (230, 110, 20), (90, 60, 40),
               (60, 170, 200), (170, 190, 200))


@dataclass(frozen=True)
class TrafficSettings:
    enabled: bool = True
    lead_probability: float = 0.75        # chance that vehicles drive ahead in the ego lane
    max_leads: int = 3
    first_lead_gap_m: tuple[float, float] = (10.0, 70.0)
    lead_spacing_m: tuple[float, float] = (20.0, 90.0)
    cruise_factor: tuple[float, float] = (0.45, 1.05)   # traffic cruise speed / the ego's
    stop_event_probability: float = 0.5   # per lead vehicle: one slow-down or stop during the episode
    oncoming_spacing_m: tuple[float, float] = (30.0, 130.0)
    waiting_probability: float = 0.6      # per side road: a queue of 1-2 vehicles at its stop line
    lateral_accel_mps2: float = 2.5
    idm: IdmParams = field(default_factory=IdmParams)


@dataclass(frozen=True)
class WorldSettings:
    dt_s: float = 0.05                                   # CARLA synchronous mode: 20 Hz
    road: RoadSettings = field(default_factory=RoadSettings)
    route: RouteSettings = field(default_factory=RouteSettings)
    ego: BicycleParams = field(default_factory=BicycleParams)
    cruise_speed_mps: tuple[float, float] = (6.0, 13.0)
    standing_start_probability: float = 0.15
    start_lane_s_m: float = 8.0
    view_margin_m: float = 160.0          # road beyond the last position the ego reaches
    traffic: TrafficSettings = field(default_factory=TrafficSettings)

    def with_traffic(self, enabled: bool) -> "WorldSettings":
        return self if enabled else replace(self, traffic=replace(self.traffic, enabled=False))


@dataclass(frozen=True)
class EgoStatus:
    """How the ego is doing on its route (for closed-loop scoring)."""
    lane_s_m: float               # progress along the route lane
    route_completion: float       # lane_s / route length
    lateral_offset_m: float       # from the lane centre, + left
    heading_error_rad: float      # ego yaw - lane heading
    off_lane: bool                # a wheel is outside the ego lane
    collision_with: int | None    # id of a vehicle the ego box overlaps


class World:
    def __init__(self, road: RoadMap, ego: EgoState, traffic: Sequence[TrafficVehicle], settings: WorldSettings,
                 expert_settings: ExpertSettings):
        self.road = road
        self.settings = settings
        self.lanes: dict[str, Path2D] = {"lane": road.lane, "oncoming": road.oncoming}
        for i, (towards, away) in enumerate(road.stub_lanes):
            self.lanes[f"side{i}_in"] = towards
            self.lanes[f"side{i}_out"] = away
        self.model = KinematicBicycle(settings.ego)
        self.expert = ExpertDriver(road.lane, settings.ego, expert_settings)
        self.ego = ego
        self.lane_s = road.lane.project((ego.x, ego.y))[0]
        self.traffic = list(traffic)
        self.tick = 0
        self.time_s = 0.0

    def expert_future(self, num_waypoints: int, interval_s: float, ego: EgoState | None = None) -> np.ndarray:
        """[num_waypoints, 2] the expert's positions every ``interval_s`` from now (from ``ego`` when given: a
        recovery), in the ego frame now; the world is unchanged (:meth:`expert_rollout`)."""
        every = int(round(interval_s / self.settings.dt_s))
        points = []

        def visit(k: int) -> None:
            if k % every == 0:
                points.append((self.ego.x, self.ego.y))

        start = self.expert_rollout(num_waypoints * every, visit, ego)
        return world_to_ego(np.array(points), (start.x, start.y), start.yaw)

    def expert_rollout(self, ticks: int, visit: Callable[[int], None], ego: EgoState | None = None) -> EgoState:
        """Step a copy of the moving state ``ticks`` times with the expert driving (from ``ego`` when given),
        calling ``visit(k)`` after step k, then put the state back (traffic too); returns the start ego."""
        saved = (self.ego, self.lane_s, self.tick, self.time_s, self.traffic)
        self.traffic = [replace(v) for v in self.traffic]
        if ego is not None:
            self.ego, self.lane_s = ego, self.road.lane.project((ego.x, ego.y))[0]
        start = self.ego
        try:
            for k in range(1, ticks + 1):
                self.step()
                visit(k)
        finally:
            self.ego, self.lane_s, self.tick, self.time_s, self.traffic = saved
        return start

    @classmethod
    def generate(cls, rng: np.random.Generator, settings: WorldSettings, duration_s: float,
                 horizon_s: float = 4.0) -> "World":
        """A random world whose route is long enough to drive ``duration_s + horizon_s``."""
        cruise = float(rng.uniform(*settings.cruise_speed_mps))
        distance = settings.start_lane_s_m + cruise * (duration_s + horizon_s) + settings.view_margin_m
        start_yaw = float(rng.uniform(-math.pi, math.pi))
        twin_rng = copy.deepcopy(rng)
        road = generate_road(rng, distance, settings.road, replace(settings.route, mirror_turns=False),
                             start_yaw=start_yaw)
        if settings.route.mirror_turns:
            # the same draws with each crossing turned the other way; everything drawn after the road
            # (speeds, traffic, colours) comes from the unmirrored world's stream, so the two worlds are
            # the same up to the first crossing: the same approach under the opposite command
            road = generate_road(twin_rng, distance, settings.road, settings.route, start_yaw=start_yaw)
        expert = ExpertSettings(cruise_speed_mps=cruise)
        x, y, yaw = road.lane.pose_at(settings.start_lane_s_m)
        standing = rng.random() < settings.standing_start_probability
        speed = 0.0 if standing else float(rng.uniform(0.4, 1.0)) * cruise
        speed = min(speed, anticipated_speed_limit(road.lane, settings.start_lane_s_m, cruise,
                                                   expert.lateral_accel_mps2, expert.planning_decel_mps2))
        ego = EgoState(x, y, yaw, speed)
        traffic = _spawn_traffic(rng, road, settings, cruise, duration_s) if settings.traffic.enabled else []
        return cls(road, ego, traffic, settings, expert)

    def ego_box(self) -> VehicleBox:
        p = self.settings.ego
        c = p.centre_from_axle_m
        return VehicleBox(EGO_ID, "car", self.ego.x + c * math.cos(self.ego.yaw), self.ego.y + c * math.sin(self.ego.yaw),
                          self.ego.yaw, p.length_m, p.width_m, p.height_m, (255, 255, 255),
                          self.ego.acceleration < -0.5, "")

    def vehicle_boxes(self) -> list[VehicleBox]:
        """Every traffic vehicle as a box (the ego excluded)."""
        return [VehicleBox(v.id, v.shape.label, *self.lanes[v.path_name].pose_at(v.s), v.shape.length_m,
                           v.shape.width_m, v.shape.height_m, v.colour, v.braking, v.path_name, v.speed)
                for v in self.traffic]

    def leader(self) -> Leader | None:
        """The nearest traffic vehicle ahead of the ego in the ego lane."""
        front = self.lane_s + self.settings.ego.front_from_axle_m
        ahead = [Leader(v.id, v.s - v.shape.length_m / 2 - front, v.speed) for v in self.traffic
                 if v.path_name == "lane" and v.s > self.lane_s]
        return min(ahead, key=lambda leader: leader.gap_m, default=None)

    def status(self) -> EgoStatus:
        lane = self.road.lane
        s, lateral = lane.project((self.ego.x, self.ego.y), self.lane_s)
        heading = float(lane.interpolate(s)[1])
        heading_error = math.remainder(self.ego.yaw - heading, 2 * math.pi)
        half_lane = self.road.settings.lane_width_m / 2
        off_lane = abs(lateral) + self.settings.ego.width_m / 2 > half_lane + 0.3
        ego_corners = self.ego_box().corners()
        hit = next((b.id for b in self.vehicle_boxes() if boxes_overlap(ego_corners, b.corners())), None)
        return EgoStatus(s, s / lane.length, lateral, heading_error, off_lane, hit)

    def step(self, control: VehicleControl | None = None, *, actuation: Actuation | None = None,
             ego_override: EgoState | None = None) -> None:
        """Advance one tick: the ego takes a ``control``, an ``actuation`` or an ``ego_override`` (its next state),
        at most one; with none the expert drives. Traffic decides on the state at the start of the tick."""
        if sum(c is not None for c in (control, actuation, ego_override)) > 1:
            raise ValueError("World.step takes at most one of control, actuation, ego_override")
        dt = self.settings.dt_s
        traffic_accel = self._traffic_accelerations()
        if ego_override is not None:
            self.ego = ego_override
        else:
            if control is not None:
                actuation = self.model.actuation_from_control(control, self.ego.speed)
            elif actuation is None:
                actuation = self.expert.act(self.ego, self.lane_s, self.leader(), dt)
            self.ego = self.model.step(self.ego, actuation, dt)
        self.lane_s = self.road.lane.project((self.ego.x, self.ego.y), self.lane_s)[0]
        self._move_traffic(traffic_accel, dt)
        self.tick += 1
        self.time_s = self.tick * dt

    def _traffic_accelerations(self) -> list[float]:
        st = self.settings.traffic
        # lane occupants sorted by position; the ego takes part in its own lane as a leader
        occupants: dict[str, list[tuple[float, float, float, int]]] = {}
        for i, v in enumerate(self.traffic):
            occupants.setdefault(v.path_name, []).append((v.s, v.shape.length_m, v.speed, i))
        p = self.settings.ego
        occupants.setdefault("lane", []).append((self.lane_s + p.centre_from_axle_m, p.length_m, self.ego.speed, -1))
        accel = [0.0] * len(self.traffic)
        for name, items in occupants.items():
            items.sort()
            path = self.lanes[name]
            for k, (s, length, speed, i) in enumerate(items):
                if i < 0 or self.traffic[i].parked:
                    continue
                v = self.traffic[i]
                desired = anticipated_speed_limit(path, s, v.desired_speed(self.time_s), st.lateral_accel_mps2,
                                                  st.idm.comfort_decel_mps2)
                if k + 1 < len(items):
                    lead_s, lead_len, lead_speed, _ = items[k + 1]
                    gap, lead_v = lead_s - lead_len / 2 - (s + length / 2), lead_speed
                else:   # the end of the lane acts as a standing obstacle
                    gap, lead_v = path.length - (s + length / 2) + 2.0, 0.0
                a = idm_acceleration(speed, desired, gap, lead_v, st.idm)
                accel[i] = min(max(a, -8.0), st.idm.max_accel_mps2)
        return accel

    def _move_traffic(self, accel: list[float], dt: float) -> None:
        kept = []
        for v, a in zip(self.traffic, accel):
            if not v.parked:
                distance, speed = speed_step(v.speed, a, dt)
                v.s, v.acceleration, v.speed = v.s + distance, (speed - v.speed) / dt, speed
                if v.path_name == "oncoming" and v.s > self.lanes["oncoming"].length:
                    continue    # drove past the route start: leaves the world
            kept.append(v)
        self.traffic = kept


def _random_shape(rng: np.random.Generator):
    return VEHICLE_SHAPES[rng.choice(list(TRAFFIC_MIX), p=np.array(list(TRAFFIC_MIX.values())))]


def _spawn_traffic(rng: np.random.Generator, road: RoadMap, settings: WorldSettings, ego_cruise: float,
                   duration_s: float) -> list[TrafficVehicle]:
    st = settings.traffic
    vehicles: list[TrafficVehicle] = []

    def add(**kw) -> None:          # a colour drawn for each vehicle as it is added
        colour = CAR_COLOURS[int(rng.integers(len(CAR_COLOURS)))]
        vehicles.append(TrafficVehicle(id=len(vehicles) + 1, colour=colour, **kw))

    # vehicles ahead in the ego lane
    ego_front = settings.start_lane_s_m + settings.ego.front_from_axle_m
    if rng.random() < st.lead_probability:
        s_rear = ego_front + float(rng.uniform(*st.first_lead_gap_m))
        for _ in range(int(rng.integers(1, st.max_leads + 1))):
            shape = _random_shape(rng)
            s = s_rear + shape.length_m / 2
            if s > road.lane.length - 20.0:
                break
            cruise = ego_cruise * float(rng.uniform(*st.cruise_factor))
            events = ()
            if rng.random() < st.stop_event_probability:
                start = float(rng.uniform(0.5, max(1.0, duration_s)))
                factor = float(rng.choice([0.0, 0.0, 0.3, 0.6]))
                events = (SpeedEvent(start, start + float(rng.uniform(2.0, 7.0)), factor),)
            speed = anticipated_speed_limit(road.lane, s, cruise, st.lateral_accel_mps2, st.idm.comfort_decel_mps2)
            add(shape=shape, path_name="lane", s=s, speed=speed, cruise_mps=cruise, events=events)
            s_rear = s + shape.length_m / 2 + float(rng.uniform(*st.lead_spacing_m))

    # oncoming traffic along the whole route
    oncoming = road.oncoming
    s = float(rng.uniform(0.0, st.oncoming_spacing_m[1]))
    while s < oncoming.length - 10.0:
        shape = _random_shape(rng)
        cruise = ego_cruise * float(rng.uniform(0.7, 1.1))
        speed = anticipated_speed_limit(oncoming, s, cruise, st.lateral_accel_mps2, st.idm.comfort_decel_mps2)
        add(shape=shape, path_name="oncoming", s=s, speed=speed, cruise_mps=cruise)
        s += shape.length_m + float(rng.uniform(*st.oncoming_spacing_m))

    # queues waiting at the stop lines of side roads
    for i, (towards, _) in enumerate(road.stub_lanes):
        if rng.random() >= st.waiting_probability:
            continue
        s_front = towards.length - 1.5
        for _ in range(int(rng.integers(1, 3))):
            shape = _random_shape(rng)
            add(shape=shape, path_name=f"side{i}_in", s=s_front - shape.length_m / 2, speed=0.0, cruise_mps=0.0,
                parked=True)
            s_front -= shape.length_m + float(rng.uniform(1.5, 4.0))
    return vehicles
