"""Route progress and route -> command (wam_diff2_core.routes) on constructed routes."""
from __future__ import annotations

import enum
import math

import numpy as np
import pytest

from wam_diff2_core.geometry import RouteCommandSettings, command_from_route
from wam_diff2_core.routes import RouteTracker, RouteTrackerSettings, road_option_name, route_from_msg
from wam_diff2_core.sim.truth import CommandSettings

LF, LEFT, RIGHT, STRAIGHT, CLL, CLR, VOID = 4, 1, 2, 3, 5, 6, -1


def straight_points(length_m: float, spacing_m: float = 2.0, y: float = 0.0) -> np.ndarray:
    x = np.arange(0.0, length_m + 1e-9, spacing_m)
    return np.stack([x, np.full_like(x, y)], axis=1)


def drive(tracker: RouteTracker, points: np.ndarray, step_m: float = 0.5, dt_s: float = 0.05,
          lateral_m: np.ndarray | None = None) -> tuple[np.ndarray, list]:
    """Move the ego along ``points`` (a dense polyline) in ``step_m`` steps; (progress, commands) per step."""
    seg = np.diff(points, axis=0)
    s = np.concatenate([[0.0], np.cumsum(np.hypot(*seg.T))])
    stations = np.arange(0.0, s[-1], step_m)
    progress, commands = [], []
    for i, station in enumerate(stations):
        x, y = np.interp(station, s, points[:, 0]), np.interp(station, s, points[:, 1])
        k = min(int(np.searchsorted(s, station, "right")) - 1, len(seg) - 1)
        yaw = math.atan2(seg[k, 1], seg[k, 0])
        if lateral_m is not None:
            x, y = x - math.sin(yaw) * lateral_m[i], y + math.cos(yaw) * lateral_m[i]
        commands.append(tracker.update((x, y), yaw, i * dt_s))
        progress.append(tracker.progress_m)
    return stations, commands


def runs(commands: list) -> list:
    """The distinct values in order: ['straight', 'left', 'straight'] for s..s l..l s..s."""
    return [c for i, c in enumerate(commands) if i == 0 or c != commands[i - 1]]


def first_index(commands: list, value: str) -> int:
    return commands.index(value)


# ----------------------------------------------------------------------------- RoadOptions
class RoadOption(enum.IntEnum):       # agents.navigation.local_planner.RoadOption's values
    VOID = -1
    LEFT = 1
    RIGHT = 2
    STRAIGHT = 3
    LANEFOLLOW = 4
    CHANGELANELEFT = 5
    CHANGELANERIGHT = 6


@pytest.mark.parametrize("value,name", [
    (4, "LANEFOLLOW"), (-1, "VOID"), (255, "VOID"), (np.uint8(1), "LEFT"), ("RIGHT", "RIGHT"),
    ("RoadOption.STRAIGHT", "STRAIGHT"), ("changelaneleft", "CHANGELANELEFT"), (RoadOption.CHANGELANERIGHT,
                                                                                "CHANGELANERIGHT"),
])
def test_road_option_names(value, name):
    assert road_option_name(value) == name


@pytest.mark.parametrize("value", [0, 7, "UTURN", True])
def test_unknown_road_options_are_refused_with_the_accepted_forms(value):
    with pytest.raises(ValueError, match="LANEFOLLOW"):
        road_option_name(value)


def junction_route(turn_option: int, entry_m: float = 100.0) -> tuple[np.ndarray, list[int]]:
    """Downsampled like the leaderboard's route: a point where each option stretch begins.

    Lane follow to the junction entry at ``entry_m``, a 15 m quarter-circle (left or right) or
    straight through, lane follow for 100 m after."""
    sign = {LEFT: 1.0, RIGHT: -1.0, STRAIGHT: 0.0}[turn_option]
    points, options = [[0.0, 0.0], [entry_m / 2, 0.0]], [LF, LF]      # a mid point, as the 200 m resampling adds
    if sign == 0.0:
        inside = [[entry_m + d, 0.0] for d in (0.0, 7.5, 15.0)]
        exit_xy, heading = np.array([entry_m + 15.0, 0.0]), 0.0
    else:
        r = 9.5
        phi = np.linspace(0.0, math.pi / 2, 6)
        inside = [[entry_m + r * math.sin(p), sign * r * (1 - math.cos(p))] for p in phi]
        exit_xy, heading = np.array(inside[-1]), sign * math.pi / 2
    points += inside
    options += [turn_option] * (len(inside) - 1) + [LF]     # the exit point starts the next lane-follow stretch
    after = exit_xy + np.array([math.cos(heading), math.sin(heading)]) * 100.0
    points.append(after.tolist())
    options.append(LF)
    return np.array(points), options


def dense(points: np.ndarray, spacing_m: float = 0.25) -> np.ndarray:
    out = [points[0]]
    for a, b in zip(points[:-1], points[1:]):
        n = max(1, int(math.ceil(np.hypot(*(b - a)) / spacing_m)))
        out += [a + (b - a) * k / n for k in range(1, n + 1)]
    return np.array(out)


@pytest.mark.parametrize("turn,command", [(LEFT, "left"), (RIGHT, "right")])
def test_a_turn_is_announced_within_the_lookahead_and_held_through_the_junction(turn, command):
    points, options = junction_route(turn)
    settings = RouteTrackerSettings()
    tracker = RouteTracker(settings)
    tracker.set_route(points, options)
    stations, commands = drive(tracker, dense(points))
    assert runs(commands) == ["straight", command, "straight"]
    announced = stations[first_index(commands, command)]
    # the candidate appears 60 m before the entry; the switch follows after hysteresis_m (2 m) of progress
    assert 100.0 - settings.option_lookahead_m <= announced <= 100.0 - settings.option_lookahead_m + \
        settings.hysteresis_m + 0.5
    back = stations[len(commands) - 1 - commands[::-1].index(command)]
    junction_exit = 100.0 + 9.5 * math.pi / 2
    assert junction_exit <= back <= junction_exit + settings.hysteresis_m + 0.5     # straight only after the exit


def test_a_straight_crossing_ahead_hides_a_later_turn():
    points, options = junction_route(STRAIGHT, entry_m=100.0)
    # a left turn 30 m after the straight crossing (within 60 m of the approach)
    points = np.vstack([points[:-1], [[145.0, 0.0], [160.0, 10.0], [160.0, 100.0]]])
    options = options[:-1] + [LEFT, LF, LF]
    tracker = RouteTracker()
    tracker.set_route(points, options)
    stations, commands = drive(tracker, dense(points))
    at = {float(s): c for s, c in zip(stations, commands)}
    assert at[80.0] == "straight" and at[110.0] == "straight"        # approaching and inside the crossing
    assert at[130.0] == "left"                                       # past it: the left turn 15 m ahead


def test_lane_change_holds_only_its_length_then_lane_following_is_straight():
    # downsampled: LF start, two CHANGELANELEFT points, then no point until a RIGHT turn 150 m later
    points = np.array([[0.0, 0.0], [100.0, 0.0], [104.0, 1.75], [108.0, 3.5], [258.0, 3.5], [270.0, -8.5],
                       [270.0, -100.0]])
    options = [LF, CLL, CLL, CLL, RIGHT, LF, LF]
    settings = RouteTrackerSettings()
    tracker = RouteTracker(settings)
    tracker.set_route(points, options)
    stations, commands = drive(tracker, dense(points))
    at = {float(s): c for s, c in zip(stations, commands)}
    assert at[30.0] == "straight" and at[50.0] == "left" and at[105.0] == "left"
    lane_change_end = 100.0 + np.hypot(4.0, 1.75) * 2 + settings.lane_change_length_m
    assert at[float(np.ceil(lane_change_end + settings.hysteresis_m + 1.0))] == "straight"
    assert at[205.0] == "right"                                      # the turn 53 m ahead
    assert runs(commands) == ["straight", "left", "straight", "right", "straight"]


@pytest.mark.parametrize("void", [VOID, 255, "VOID"])
def test_void_and_lanefollow_drive_straight(void):
    points = straight_points(100.0)
    tracker = RouteTracker()
    tracker.set_route(points, [void] * (len(points) // 2) + [LF] * (len(points) - len(points) // 2))
    _, commands = drive(tracker, points)
    assert set(commands) == {"straight"}


def test_lanefollow_geometry_reads_a_sharp_lane_follow_curve_like_the_demo_world():
    # a 90-degree lane-follow curve of radius 25 m: straight by the option rule, left by geometry
    phi = np.linspace(0.0, math.pi / 2, 40)
    curve = np.stack([60.0 + 25.0 * np.sin(phi), 25.0 * (1 - np.cos(phi))], axis=1)
    points = np.vstack([straight_points(58.0), curve, [[85.0, 100.0]]])
    options = [LF] * len(points)
    plain, geometric = RouteTracker(), RouteTracker(RouteTrackerSettings(lanefollow_geometry=True))
    plain.set_route(points, options)
    geometric.set_route(points, options)
    assert set(drive(plain, dense(points))[1]) == {"straight"}
    assert "left" in drive(geometric, dense(points))[1]


def test_option_lookahead_is_the_demo_worlds_crossing_distance():
    assert RouteTrackerSettings().option_lookahead_m == CommandSettings().crossing_distance_m


# ----------------------------------------------------------------------------- progress
def test_progress_never_jumps_to_a_stretch_of_the_route_passing_nearby():
    # a hairpin: out along y=0, back along y=6 (within max_distance_m of the outbound leg)
    out = straight_points(100.0)
    back = straight_points(100.0, y=6.0)[::-1]
    points = np.vstack([out, [[104.0, 3.0]], back])
    tracker = RouteTracker()
    tracker.set_route(points)
    for i, x in enumerate(np.arange(0.0, 60.0, 0.5)):
        tracker.update((x, 3.5), 0.0, i * 0.05)       # drifting towards the return leg: closer to it
        assert tracker.progress_m == pytest.approx(x, abs=1e-6)
    assert tracker.distance_m == pytest.approx(3.5)


def test_progress_is_monotonic_and_relocalises_after_a_teleport():
    points = straight_points(300.0)
    tracker = RouteTracker()
    tracker.set_route(points)
    tracker.update((50.0, 0.0), 0.0, 0.0)
    tracker.update((48.0, 0.0), 0.0, 0.05)            # pose jitter backwards: progress stays
    assert tracker.progress_m == 50.0
    tracker.update((200.0, 0.0), 0.0, 0.1)            # far beyond the window: a respawn
    assert tracker.progress_m == 200.0
    assert tracker.update((200.0, 40.0), 0.0, 0.15) is None       # off the route: no command
    assert tracker.completion == pytest.approx(200.0 / 300.0)


def test_noisy_route_geometry_flickers_per_frame_but_not_through_the_tracker():
    # a Path route (no options) with 0.15 m waypoint noise and a 32-degree bend: the per-frame
    # geometric rule (what a stateless node computes) flips constantly; the tracker switches
    # straight -> left -> straight once each
    rng = np.random.default_rng(0)
    heading, xy, truth = 0.0, np.zeros(2), []
    for i in range(400):
        if 200 <= i < 280:
            heading += math.radians(32.0) / 80
        xy = xy + 0.5 * np.array([math.cos(heading), math.sin(heading)])
        truth.append(xy)
    truth = np.array(truth)
    noisy = truth + rng.normal(0.0, 0.15, truth.shape)
    tracker = RouteTracker()
    tracker.set_route(noisy)
    raw, tracked = [], []
    for i in range(380):
        d = truth[i + 1] - truth[i]
        yaw = math.atan2(d[1], d[0])
        raw.append(command_from_route(noisy, truth[i], yaw, RouteCommandSettings()))
        tracked.append(tracker.update(truth[i], yaw, i * 0.05))
    assert len(runs(raw)) > 20
    assert runs(tracked) == ["straight", "left", "straight"]


def test_waiting_at_a_junction_with_a_jittering_pose_keeps_the_command():
    points, options = junction_route(LEFT)
    tracker = RouteTracker()
    tracker.set_route(points, options)
    tracker.update((39.0, 0.0), 0.0, 0.0)             # 61 m before the entry: straight
    commands = [tracker.update((39.0 + 1.2 * (i % 2), 0.3 * (-1) ** i), 0.0, 0.05 * i) for i in range(1, 200)]
    # progress reaches 40.2 m (59.8 m before the left): the candidate is left from then on, once
    assert runs(commands) == ["straight", "left"]
    assert all(c == "left" for c in commands[30:])


def test_bad_routes_are_refused():
    tracker = RouteTracker()
    with pytest.raises(ValueError, match="non-finite"):
        tracker.set_route([[0.0, 0.0], [math.nan, 1.0]])
    with pytest.raises(ValueError, match="2 distinct"):
        tracker.set_route([[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="road options"):
        tracker.set_route([[0.0, 0.0], [1.0, 0.0]], [LF])
    assert tracker.update((0.0, 0.0), 0.0, 0.0) is None   # no route yet


def test_the_real_route_messages_are_read():
    """The leaderboard's carla_msgs/CarlaRoute (int8 road options: VOID is -1) and nav_msgs/Path."""
    from geometry_msgs.msg import Pose, PoseStamped
    from nav_msgs.msg import Path
    from test.support.ros_packages import interface_module

    carla_msgs = interface_module("carla_msgs")
    poses = [Pose(), Pose()]
    poses[1].position.x = 10.0
    carla_route = carla_msgs.CarlaRoute(poses=poses, road_options=[carla_msgs.CarlaRoute.LANEFOLLOW,
                                                                   carla_msgs.CarlaRoute.VOID])
    points, options = route_from_msg(carla_route)
    assert points.tolist() == [[0.0, 0.0], [10.0, 0.0]] and options == ["LANEFOLLOW", "VOID"]
    path = Path(poses=[PoseStamped(), PoseStamped()])
    path.poses[0].pose.position.x, path.poses[0].pose.position.y = 1.0, 2.0
    path.poses[1].pose.position.x, path.poses[1].pose.position.y = 3.0, 4.0
    points, options = route_from_msg(path)
    assert points.tolist() == [[1.0, 2.0], [3.0, 4.0]] and options is None
