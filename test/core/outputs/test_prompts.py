"""Prompt builders: the NAVSIM planning prompt character for character, and the detection template.

    python -m pytest test/core/outputs/test_prompts.py -q
"""
from __future__ import annotations

import doctest

import pytest

from wam_diff2_core.outputs import prompts
from wam_diff2_core.outputs.prompts import (DEFAULT_DETECTION_CLASSES, IMAGE_PLACEHOLDER, format_detection_prompt,
                                            format_planning_prompt)

# The human turn of the authors' README example, verbatim.
README_HUMAN_TURN = "Here is a front-view images from a driving vehicle: <image>\nThe navigation information is: right\nThe current position is (0.00,0.00)\nThe current velocity is: (4.66,-0.09) and current accelerate is: (0.17,-1.53)\nInstruction: Based on the visual motion cues from the image (such as the relative speed of other vehicles and the changing distance to the intersection) and the provided telemetry, predict the optimal driving action for the next 4 seconds with 8 new waypoints."  # noqa: E501


def test_module_docstring_examples_hold():
    assert doctest.testmod(prompts).failed == 0


def test_planning_prompt_matches_the_readme_example():
    assert format_planning_prompt("right", (4.66, -0.09), (0.17, -1.53)) == README_HUMAN_TURN


def test_planning_prompt_rounds_to_two_decimals_without_negative_zero():
    text = format_planning_prompt("left", (-0.001, 12.345678), (0.004, -0.0))
    assert "The navigation information is: left\n" in text
    assert "The current velocity is: (0.00,12.35) and current accelerate is: (0.00,0.00)\n" in text


@pytest.mark.parametrize("command", ["Right", "u-turn", "", "straight "])
def test_planning_prompt_rejects_unknown_commands(command):
    with pytest.raises(ValueError, match="command"):
        format_planning_prompt(command, (1.0, 0.0), (0.0, 0.0))


@pytest.mark.parametrize("velocity, acceleration", [
    ((float("nan"), 0.0), (0.0, 0.0)),
    ((1.0, 0.0), (float("inf"), 0.0)),
    ((1.0, 0.0, 0.0), (0.0, 0.0)),
    ((1.0,), (0.0, 0.0)),
])
def test_planning_prompt_rejects_bad_telemetry(velocity, acceleration):
    with pytest.raises(ValueError):
        format_planning_prompt("straight", velocity, acceleration)


def test_detection_prompt_names_the_classes_and_the_image():
    text = format_detection_prompt()
    assert IMAGE_PLACEHOLDER in text and "bbox_2d" in text
    assert all(name in text for name in DEFAULT_DETECTION_CLASSES)
    assert "traffic cone" in format_detection_prompt(["traffic cone"])


def test_detection_template_must_hold_the_image():
    assert format_detection_prompt(["car"], "<image> find {classes}") == "<image> find car"
    with pytest.raises(ValueError, match="<image>"):
        format_detection_prompt(["car"], "find {classes}")


def test_planning_prompt_parses_back():
    from wam_diff2_core.outputs.prompts import parse_planning_prompt
    text = format_planning_prompt("left", (12.345, -0.004), (-1.5, 0.25))
    assert parse_planning_prompt(text) == ("left", (12.35, 0.0), (-1.5, 0.25))
    assert parse_planning_prompt(format_detection_prompt()) is None
    assert parse_planning_prompt(text.replace("left", "backwards")) is None
