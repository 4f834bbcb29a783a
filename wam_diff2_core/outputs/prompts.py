"""Prompt builders: the NAVSIM planning prompt (exact) and the detection template (ours).

    >>> format_planning_prompt("right", (4.66, -0.09), (0.17, -1.53))[:44]
    'Here is a front-view images from a driving v'
"""
from __future__ import annotations

import math
import re
from typing import Sequence

COMMANDS = ("left", "straight", "right")
IMAGE_PLACEHOLDER = "<image>"
# What the planning prompt asks for: 8 waypoints over the next 4 s, one every 0.5 s (ego frame).
NUM_WAYPOINTS = 8
WAYPOINT_DT_S = 0.5

# The NAVSIM planning prompt as the authors trained it, including its grammar.
PLANNING_TEMPLATE = (
    "Here is a front-view images from a driving vehicle: <image>\n"
    "The navigation information is: {command}\n"
    "The current position is (0.00,0.00)\n"
    "The current velocity is: ({vx:.2f},{vy:.2f}) and current accelerate is: ({ax:.2f},{ay:.2f})\n"
    "Instruction: Based on the visual motion cues from the image (such as the relative speed of other "
    "vehicles and the changing distance to the intersection) and the provided telemetry, predict the "
    "optimal driving action for the next 4 seconds with 8 new waypoints."
)

# Ours (the paper publishes no detection prompt): Qwen3-VL grounding style.
DEFAULT_DETECTION_CLASSES = ("car", "truck", "bus", "pedestrian", "bicycle", "motorcycle", "traffic light")
DETECTION_TEMPLATE = (
    "<image>\nLocate every object of these classes in the image: {classes}. "
    'Report each one as a JSON object with "bbox_2d" [x1, y1, x2, y2] and "label", as a JSON list.'
)


GROUNDING_KEY = "bbox_2d"   # what a grounding prompt asks for (DETECTION_TEMPLATE, Qwen3-VL grounding)

TASKS = ("plan", "detect")   # a policy's prompts per frame
# With both tasks, the boxes are decoded on frames 1, N+1, 2N+1, ... (batched with that frame's plan); 1: every frame.
DEFAULT_DETECTION_EVERY_N_FRAMES = 1


def check_detection_every(every_n_frames: int, tasks: Sequence[str]) -> None:
    """ValueError unless ``every_n_frames`` is a whole number >= 1, and 1 unless ``tasks`` are both (a frame
    without boxes still has its plan)."""
    if isinstance(every_n_frames, bool) or not isinstance(every_n_frames, int) or every_n_frames < 1:
        raise ValueError(f"detection_every_n_frames: {every_n_frames!r} must be a whole number >= 1")
    if every_n_frames > 1 and set(tasks) != set(TASKS):
        raise ValueError(f"detection_every_n_frames: {every_n_frames} needs both tasks (plan and detect), tasks "
                         f"are {list(tasks)}")


def is_grounding_prompt(text: str) -> bool:
    """Whether a prompt asks for 2-D boxes (names ``bbox_2d``, as Qwen3-VL's grounding prompts do)."""
    return GROUNDING_KEY in (text or "")


def round_2dp(value: float) -> float:
    # "-0.00" never appears in the authors' data: round first, then drop the sign of zero.
    value = round(float(value), 2)
    return 0.0 if value == 0 else value


def format_planning_prompt(command: str, velocity: Sequence[float], acceleration: Sequence[float]) -> str:
    """The exact NAVSIM prompt; velocity and acceleration in the ego frame (x forward, y left)."""
    if command not in COMMANDS:
        raise ValueError(f"command: {command!r} is not one of {', '.join(COMMANDS)}")
    values = [*velocity, *acceleration]
    if len(values) != 4 or not all(math.isfinite(float(v)) for v in values):
        raise ValueError(f"velocity/acceleration must be 2 finite numbers each, got {velocity!r}, {acceleration!r}")
    vx, vy, ax, ay = (round_2dp(v) for v in values)
    return PLANNING_TEMPLATE.format(command=command, vx=vx, vy=vy, ax=ax, ay=ay)


_TELEMETRY = re.compile(r"navigation information is: (\w+)\n.*?The current velocity is: \((-?[\d.]+),(-?[\d.]+)\) "
                        r"and current accelerate is: \((-?[\d.]+),(-?[\d.]+)\)", re.S)


def parse_planning_prompt(text: str) -> tuple[str, tuple[float, float], tuple[float, float]] | None:
    """(command, velocity, acceleration) from a planning prompt; None when ``text`` is not one."""
    m = _TELEMETRY.search(text or "")
    if m is None or m.group(1) not in COMMANDS:
        return None
    vx, vy, ax, ay = (float(m.group(i)) for i in range(2, 6))
    return m.group(1), (vx, vy), (ax, ay)


def chat_content(text: str, max_images: int = -1) -> list[dict[str, str]]:
    """``text`` as processor chat content: an image entry at each ``<image>`` (the first ``max_images``; -1: at
    every one), the text around them as text entries (empty pieces left out)."""
    content = []
    for j, piece in enumerate(text.split(IMAGE_PLACEHOLDER, max_images)):
        if j > 0:
            content.append({"type": "image"})
        if piece:
            content.append({"type": "text", "text": piece})
    return content


def format_detection_prompt(classes: Sequence[str] = DEFAULT_DETECTION_CLASSES,
                            template: str = DETECTION_TEMPLATE) -> str:
    if IMAGE_PLACEHOLDER not in template:
        raise ValueError(f"detection template must contain {IMAGE_PLACEHOLDER}")
    return template.format(classes=", ".join(classes))
