"""Ground-truth rules that are more than geometry: the route command (:func:`route_command`, the rule:
sim/README.md, "Command rule") and the question/answer pairs.

    >>> from .road import Straight, Crossing, RoadSettings, build_road
    >>> road = build_road([Straight(80.0), Crossing("right"), Straight(50.0)], RoadSettings())
    >>> route_command(road, 5.0, road.lane.pose_at(5.0), CommandSettings())
    ('straight', 'route')
    >>> route_command(road, 30.0, road.lane.pose_at(30.0), CommandSettings())
    ('right', 'crossing')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..geometry import RouteCommandSettings, command_from_route
from .road import RoadMap


@dataclass(frozen=True)
class CommandSettings:
    crossing_distance_m: float = 60.0
    route: RouteCommandSettings = field(default_factory=RouteCommandSettings)


def route_command(road: RoadMap, lane_s: float, pose: Sequence[float], settings: CommandSettings) -> tuple[str, str]:
    """(command, source): source ``crossing`` (the next intersection's turn) or ``route`` (geometry)."""
    crossing = road.next_crossing(lane_s)
    if crossing is not None and crossing.lane_s_entry - lane_s <= settings.crossing_distance_m:
        return crossing.turn, "crossing"
    lane = road.lane
    lo = int(np.searchsorted(lane.s, lane_s - 5.0))
    hi = int(np.searchsorted(lane.s, lane_s + settings.route.lookahead_m + 5.0)) + 1
    command = command_from_route(lane.points[lo:hi], pose[:2], pose[2], settings.route)
    return (command or "straight"), "route"


QUESTIONS = {
    "lead": "Is there a vehicle ahead in the ego lane?",
    "road": "What is the road ahead like?",
    "count": "How many vehicles are visible in the image?",
    "action": "What should the ego vehicle do next?",
}
LEAD_RANGE_M = 60.0
ROAD_RANGE_M = 60.0


def vqa_prompt(question_key: str, command: str) -> str:
    """The human turn of a question sample (ours; the paper publishes no VQA prompts)."""
    if question_key == "action":
        return f"<image>\nThe navigation information is: {command}\n{QUESTIONS['action']}"
    return f"<image>\n{QUESTIONS[question_key]}"


def answer_lead(leader_label: str | None, gap_m: float | None) -> str:
    if leader_label is None or gap_m is None or gap_m > LEAD_RANGE_M:
        return "No."
    return f"Yes, a {leader_label} about {max(1, int(round(gap_m)))} m ahead."


def answer_road(road: RoadMap, lane_s: float) -> str:
    crossing = road.next_crossing(lane_s)
    if crossing is not None and crossing.lane_s_entry <= lane_s:
        return "The ego vehicle is in an intersection."
    if crossing is not None and crossing.lane_s_entry - lane_s <= ROAD_RANGE_M:
        return f"An intersection in about {max(1, int(round(crossing.lane_s_entry - lane_s)))} m."
    for curve in road.curves:
        if curve.lane_s_end > lane_s and curve.lane_s_start - lane_s <= ROAD_RANGE_M:
            sharp = "sharply " if curve.radius_m < 60.0 else ""
            return f"The road curves {sharp}to the {curve.direction}."
    return "The road goes straight."


def answer_count(n: int) -> str:
    return "No vehicles." if n == 0 else ("1 vehicle." if n == 1 else f"{n} vehicles.")


def answer_action(speed_now: float, speed_in_2s: float, heading_change_4s_rad: float) -> str:
    """From the expert's own future: speed change over 2 s, heading change over 4 s."""
    if speed_now < 0.3 and speed_in_2s < 0.3:
        speed = "Stay stopped"
    elif speed_in_2s < 0.3:
        speed = "Stop"
    elif speed_in_2s - speed_now > 1.0:
        speed = "Accelerate"
    elif speed_in_2s - speed_now < -1.0:
        speed = "Slow down"
    else:
        speed = "Keep the current speed"
    turn = np.degrees(heading_change_4s_rad)
    direction = "turn left" if turn > 30 else ("turn right" if turn < -30 else "follow the lane")
    return f"{speed} and {direction}."
