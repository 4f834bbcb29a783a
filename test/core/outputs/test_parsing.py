"""Waypoint and box parsing: pinned examples, every error code, and hostile-input properties.

    python -m pytest test/core/outputs/test_parsing.py -q
"""
from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from wam_diff2_core.outputs import parsing
from wam_diff2_core.outputs.parsing import (BAD_BOX, EMPTY, INVALID_JSON, NON_FINITE, NOT_A_LIST, NOT_A_NUMBER,
                                            OUT_OF_RANGE, WRONG_COUNT, Box, char_confidences, format_waypoints,
                                            parse_boxes, parse_waypoints, token_char_confidences)

README_ANSWER = "2.26,-0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59"
README_WAYPOINTS = np.array([[2.26, -0.17], [4.43, -0.70], [6.52, -1.55], [8.48, -2.64],
                             [10.28, -3.88], [11.99, -5.25], [13.76, -6.83], [15.59, -8.59]])
SOURCE = (1920, 1080)   # (width, height) pixels

hostile_strings = st.one_of(
    st.text(),
    st.binary().map(lambda raw: raw.decode("utf-8", errors="replace")),
    st.binary().map(lambda raw: raw.decode("latin-1")),
    st.lists(st.sampled_from(["1", "-2.5", ",", " ", ".", "e", "nan", "inf", "1e999", "\n", "[", "{", "}", "]",
                              '"bbox_2d"', ":", "```json", "```", "\u0661", "1_0", "0x1f"]), max_size=40).map("".join),
)


def test_module_docstring_examples_hold():
    assert doctest.testmod(parsing).failed == 0


# --- waypoints ---------------------------------------------------------------------------

def test_readme_answer_parses_to_the_8x2_plan():
    parsed = parse_waypoints(README_ANSWER)
    assert parsed.ok and parsed.error is None
    assert parsed.waypoints.dtype == np.float64
    np.testing.assert_array_equal(parsed.waypoints, README_WAYPOINTS)


@pytest.mark.parametrize("text", [
    " 2.26 , -0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59 ",
    README_ANSWER + ".",
    README_ANSWER + ". \n",
    "\n" + README_ANSWER.replace(",", ",\n"),
    README_ANSWER.replace("2.26", "+2.26").replace("15.59", "1.559e1"),
])
def test_tolerated_layouts(text):
    parsed = parse_waypoints(text)
    assert parsed.ok, parsed.error
    np.testing.assert_allclose(parsed.waypoints, README_WAYPOINTS)


def test_result_is_read_only():
    with pytest.raises(ValueError):
        parse_waypoints(README_ANSWER).waypoints[0, 0] = 1.0


def _with_field(index: int, token: str) -> str:
    fields = README_ANSWER.split(",")
    fields[index] = token
    return ",".join(fields)


@pytest.mark.parametrize("text, code, message", [
    ("", EMPTY, "no numbers"),
    (None, EMPTY, "no numbers"),
    (" \n\t. ", EMPTY, "no numbers"),
    (README_ANSWER + ",", NOT_A_NUMBER, "field 17 is not a number: ''"),
    (_with_field(3, "abc"), NOT_A_NUMBER, "field 4 is not a number: 'abc'"),
    (_with_field(0, ".5"), NOT_A_NUMBER, "field 1"),
    (_with_field(0, "5."), NOT_A_NUMBER, "field 1"),
    (_with_field(0, "1_000"), NOT_A_NUMBER, "field 1"),
    (_with_field(0, "\u0661"), NOT_A_NUMBER, "field 1"),   # ARABIC-INDIC DIGIT ONE: float() would take it
    (README_ANSWER.replace(",", " "), NOT_A_NUMBER, "field 1"),
    ("The car should turn right.", NOT_A_NUMBER, "field 1"),
    (README_ANSWER.rsplit(",", 1)[0], WRONG_COUNT, "expected 16 numbers, got 15"),
    (README_ANSWER + ",1.0", WRONG_COUNT, "expected 16 numbers, got 17"),
    ("1e999", WRONG_COUNT, "expected 16 numbers, got 1"),
    (_with_field(4, "nan"), NON_FINITE, "number 5 is not finite: nan"),
    (_with_field(5, "-Infinity"), NON_FINITE, "number 6 is not finite: -inf"),
    (_with_field(6, "1e999"), NON_FINITE, "number 7 is not finite: inf"),
    (_with_field(7, "-200.01"), OUT_OF_RANGE, "number 8 is -200.01 m, beyond +-200 m"),
])
def test_each_error_code(text, code, message):
    parsed = parse_waypoints(text)
    assert not parsed.ok and parsed.waypoints is None
    assert parsed.error.code == code
    assert message in parsed.error.message


def test_limits_are_arguments():
    assert parse_waypoints(_with_field(0, "200")).ok
    assert parse_waypoints(_with_field(0, "50"), max_abs_m=20.0).error.code == OUT_OF_RANGE
    assert parse_waypoints("1,2,3,4", num_waypoints=2).waypoints.shape == (2, 2)
    with pytest.raises(ValueError, match="num_waypoints"):
        parse_waypoints(README_ANSWER, num_waypoints=0)


def test_huge_answer_is_an_error_with_a_short_message():
    parsed = parse_waypoints("9" * 100_000 + "x," * 1000)
    assert parsed.error.code == NOT_A_NUMBER
    assert len(parsed.error.message) < 200


def _assert_well_formed(parsed, num_waypoints=8, max_abs_m=200.0):
    if parsed.ok:
        assert parsed.waypoints.shape == (num_waypoints, 2) and parsed.waypoints.dtype == np.float64
        assert np.isfinite(parsed.waypoints).all() and (np.abs(parsed.waypoints) <= max_abs_m).all()
    else:
        assert parsed.waypoints is None
        assert parsed.error.code in {EMPTY, NOT_A_NUMBER, WRONG_COUNT, NON_FINITE, OUT_OF_RANGE}
        assert parsed.error.message


@settings(max_examples=300, deadline=None)
@given(hostile_strings)
def test_hostile_text_never_raises(text):
    _assert_well_formed(parse_waypoints(text))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20),
       st.sampled_from([",", ", ", " ,", ",\n"]))
def test_lists_of_floats_follow_the_check_order(values, separator):
    parsed = parse_waypoints(separator.join(repr(v) for v in values))
    _assert_well_formed(parsed)
    if not values:
        expected = EMPTY
    elif len(values) != 16:
        expected = WRONG_COUNT
    elif not all(math.isfinite(v) for v in values):
        expected = NON_FINITE
    elif any(abs(v) > 200.0 for v in values):
        expected = OUT_OF_RANGE
    else:
        expected = None
        np.testing.assert_array_equal(parsed.waypoints.ravel(), values)   # repr round-trips exactly
    assert (parsed.error.code if parsed.error else None) == expected


finite_plans = st.lists(st.floats(-199.0, 199.0, allow_nan=False), min_size=16, max_size=16).map(
    lambda values: np.array(values).reshape(8, 2))


@settings(max_examples=200, deadline=None)
@given(finite_plans)
def test_format_parse_round_trip(plan):
    text = format_waypoints(plan)
    parsed = parse_waypoints(text)
    assert parsed.ok, parsed.error
    assert np.abs(parsed.waypoints - plan).max() <= 0.005 + 1e-9
    assert format_waypoints(parsed.waypoints) == text
    assert "-0.00" not in text.split(",")


def test_format_matches_the_training_answer():
    assert format_waypoints(README_WAYPOINTS) == README_ANSWER
    assert format_waypoints(np.array([[-0.001, 0.004], [-0.0, 1.005]])).startswith("0.00,0.00,0.00,")


@pytest.mark.parametrize("bad", [np.zeros(16), np.zeros((8, 3)), np.array([[np.nan, 0.0]])])
def test_format_rejects_bad_arrays(bad):
    with pytest.raises(ValueError):
        format_waypoints(bad)


# --- boxes -------------------------------------------------------------------------------

def test_box_mapping_whole_image():
    parsed = parse_boxes('[{"bbox_2d": [100, 200, 500, 600], "label": "car"}]', SOURCE)
    # x: v / 1000 * 1920, y: v / 1000 * 1080
    assert parsed.ok and parsed.dropped == 0
    assert parsed.boxes == [Box("car", 1.0, 192.0, 216.0, 960.0, 648.0)]


def test_box_mapping_with_crop():
    # The model saw the region x0=400, y0=100, w=800, h=600 of the source image.
    parsed = parse_boxes('[{"bbox_2d": [250, 500, 750, 1000], "label": "bus", "score": 0.8}]', SOURCE,
                         crop=(400, 100, 800, 600))
    # x: 400 + [0.25, 0.75] * 800 = [600, 1000]; y: 100 + [0.5, 1.0] * 600 = [400, 700]
    assert parsed.boxes == [Box("bus", 0.8, 600.0, 400.0, 1000.0, 700.0)]


def test_fenced_json_with_text_around_it():
    text = ('Sure! Here are the objects:\n```json\n[\n  {"bbox_2d": [0, 0, 500, 500], "label": "pedestrian",'
            ' "confidence": 0.5},\n  {"bbox_2d": [500, 500, 1000, 1000], "label": " truck "}\n]\n```\nDone.')
    parsed = parse_boxes(text, (1000, 500))
    assert parsed.ok
    assert parsed.boxes == [Box("pedestrian", 0.5, 0.0, 0.0, 500.0, 250.0),
                            Box("truck", 1.0, 500.0, 250.0, 1000.0, 500.0)]


def test_unfenced_json_after_bracketed_text():
    parsed = parse_boxes('[note] found: [{"bbox_2d": [0, 0, 10, 10], "label": "car"}] end', (1000, 1000))
    assert parsed.boxes == [Box("car", 1.0, 0.0, 0.0, 10.0, 10.0)]


def test_single_object_is_a_list_of_one():
    parsed = parse_boxes('{"bbox_2d": [0, 0, 1000, 1000], "label": "bicycle"}', (640, 480))
    assert parsed.boxes == [Box("bicycle", 1.0, 0.0, 0.0, 640.0, 480.0)]


def test_corners_are_ordered_clipped_and_degenerate_boxes_dropped():
    text = json.dumps([
        {"bbox_2d": [600, 700, 100, 200], "label": "car"},       # swapped corners
        {"bbox_2d": [-100, -50, 1100, 500], "label": "truck"},   # beyond the image: clipped
        {"bbox_2d": [300, 300, 300, 600], "label": "bus"},       # zero width
        {"bbox_2d": [1100, 0, 1200, 100], "label": "car"},       # wholly outside: zero after clipping
    ])
    parsed = parse_boxes(text, (1000, 1000))
    assert parsed.ok and parsed.dropped == 2
    assert parsed.boxes == [Box("car", 1.0, 100.0, 200.0, 600.0, 700.0),
                            Box("truck", 1.0, 0.0, 0.0, 1000.0, 500.0)]


def test_malformed_objects_are_dropped_and_counted():
    malformed = [
        '{"bbox_2d": [0, 0, 10], "label": "car"}',                         # three corners
        '{"bbox_2d": [0, 0, "a", 10], "label": "car"}',                    # a string
        '{"bbox_2d": [0, 0, NaN, 10], "label": "car"}',                    # NaN (json accepts it)
        '{"bbox_2d": [0, 0, 1e999, 10], "label": "car"}',                  # overflows to inf
        '{"bbox_2d": [0, 0, 1' + "0" * 400 + ', 10], "label": "car"}',     # int too big for a float
        '{"bbox_2d": [0, 0, true, 10], "label": "car"}',                   # a bool is not a number
        '{"bbox_2d": [0, 0, 10, 10]}',                                     # no label
        '{"bbox_2d": [0, 0, 10, 10], "label": "car", "score": "hi"}',      # bad score
        '"car"',
        '7',
    ]
    text = "[" + ", ".join([*malformed, '{"bbox_2d": [0, 0, 10, 10], "label": "car"}']) + "]"
    parsed = parse_boxes(text, (1000, 1000))
    assert parsed.ok and parsed.dropped == len(malformed)
    assert parsed.boxes == [Box("car", 1.0, 0.0, 0.0, 10.0, 10.0)]


@pytest.mark.parametrize("text, code", [
    ("", EMPTY),
    (None, EMPTY),
    ("  \n", EMPTY),
    ("no objects here", INVALID_JSON),
    ('[{"bbox_2d": [0, 0, 10, 10], "label": "car"', INVALID_JSON),   # truncated answer
    ("[" * 100_000, INVALID_JSON),                                   # deep nesting
    ('"car"', NOT_A_LIST),
    ("42", NOT_A_LIST),
    ('[{"bbox_2d": [1, 2, 3]}, {"label": "car"}]', BAD_BOX),
    ('{"objects": []}', BAD_BOX),
])
def test_box_error_codes(text, code):
    parsed = parse_boxes(text, SOURCE)
    assert not parsed.ok and parsed.boxes == []
    assert parsed.error.code == code and parsed.error.message


def test_empty_list_is_no_boxes_not_an_error():
    for text in ("[]", "```json\n[]\n```"):
        parsed = parse_boxes(text, SOURCE)
        assert parsed.ok and parsed.boxes == [] and parsed.dropped == 0


@pytest.mark.parametrize("size, crop", [((0, 10), None), ((10, float("nan")), None), ((10, 10), (0, 0, 0, 5))])
def test_bad_geometry_arguments_raise(size, crop):
    with pytest.raises(ValueError):
        parse_boxes("[]", size, crop)


def _assert_boxes_well_formed(parsed, width, height):
    if not parsed.ok:
        assert parsed.boxes == [] and parsed.error.code in {EMPTY, INVALID_JSON, NOT_A_LIST, BAD_BOX}
    assert parsed.dropped >= 0
    for box in parsed.boxes:
        assert isinstance(box.label, str) and math.isfinite(box.score)
        assert 0.0 <= box.x_min < box.x_max <= width and 0.0 <= box.y_min < box.y_max <= height


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.sampled_from(["bbox_2d", "label", "score", "confidence", "x"]), children, max_size=4),
    max_leaves=20)
box_objects = st.fixed_dictionaries(
    {"bbox_2d": st.lists(st.one_of(st.floats(), st.integers(-10**400, 10**400)), min_size=4, max_size=4),
     "label": st.sampled_from(["car", "truck", "pedestrian"])},
    optional={"score": st.floats()})


@settings(max_examples=300, deadline=None)
@given(st.one_of(hostile_strings,
                 json_values.map(json.dumps),
                 st.lists(box_objects, max_size=6).map(lambda objs: "```json\n" + json.dumps(objs) + "\n```")),
       st.one_of(st.none(), st.tuples(st.floats(-50, 500), st.floats(-50, 500), st.floats(1, 900), st.floats(1, 900))))
def test_hostile_box_answers_never_raise(text, crop):
    _assert_boxes_well_formed(parse_boxes(text, (640, 480), crop), 640, 480)
    if text is not None:             # scored by the decoder's confidences: the same boxes, scores in (0, 1]
        plain = parse_boxes(text, (640, 480), crop)
        scored = parse_boxes(text, (640, 480), crop, char_confidence=[0.5] * len(text))
        _assert_boxes_well_formed(scored, 640, 480)
        assert [(b.x_min, b.y_min, b.x_max, b.y_max) for b in scored.boxes] == \
            [(b.x_min, b.y_min, b.x_max, b.y_max) for b in plain.boxes]


# ---------------------------------------------------------------- box scores from the decoder's confidences
def _confidence_of(text: str, digits: dict[int, float]) -> list[float]:
    """1.0 per character except the digits of the object index -> confidence in ``digits`` (the 2 of
    "bbox_2d" too: only the list's digits must count)."""
    conf, obj = [1.0] * len(text), -1
    for i, ch in enumerate(text):
        obj += ch == "{"
        if ch.isdigit() and obj in digits:
            conf[i] = digits[obj]
    return conf


def test_boxes_score_the_confidence_of_their_own_coordinates():
    text = ('[{"bbox_2d": [100, 200, 300, 400], "label": "car"}, {"bbox_2d": [500, 500, 600, 700], "label": "car"},'
            ' {"bbox_2d": [10, 10, 20, 20], "label": "truck 2", "score": 0.3}]')
    conf = _confidence_of(text, {0: 0.5, 1: 0.8, 2: 0.01})
    conf[text.index("100") + 1] = 0.125            # box 0: 11 digits at 0.5 and one at 0.125
    found = parse_boxes(text, (1000, 1000), char_confidence=conf)
    assert [b.score for b in found.boxes] == pytest.approx([math.exp((11 * math.log(0.5) + math.log(0.125)) / 12),
                                                            0.8, 0.3])    # the answer's own score is kept
    assert [b.score for b in parse_boxes(text, (1000, 1000)).boxes] == [1.0, 1.0, 0.3]


def test_box_scores_in_a_fence_in_prose_and_for_one_object():
    body = '[{"bbox_2d": [1, 2, 3, 4], "label": "car"}, {"bbox_2d": [5, 6, 7, 8], "label": "car"}]'
    for text in (f"Here:\n```json\n{body}\n```\nthat is all, 42.", f"I see {body} and 99 more."):
        conf = [0.2 if ch.isdigit() else 1.0 for ch in text]
        box1 = text.index("[5")
        for i in range(box1, text.index("]", box1)):
            conf[i] = 0.9 if text[i].isdigit() else 1.0
        assert [b.score for b in parse_boxes(text, (1000, 1000), char_confidence=conf).boxes] == \
            pytest.approx([0.2, 0.9])                # prose digits (42, 99) count for neither box
    one = ' {"bbox_2d": [1, 2, 3, 4], "label": "car"} 7'
    conf = [0.4 if ch.isdigit() else 1.0 for ch in one]
    conf[-1] = 0.001
    assert parse_boxes(one, (1000, 1000), char_confidence=conf).boxes[0].score == pytest.approx(0.4)


def test_char_confidences_follow_the_tokens_and_refuse_what_does_not_spell_the_text():
    assert char_confidences(["[{", "12", "3"], [0.5, 0.25, 1.0], "[{123") == [0.5, 0.5, 0.25, 0.25, 1.0]
    assert char_confidences(["[{", "12"], [0.5, 0.25], "[{123") is None          # pieces do not spell it
    assert char_confidences(["[{", "12"], [0.5], "[{12") is None                 # counts differ
    with pytest.raises(ValueError, match="one per character"):
        parse_boxes('[{"bbox_2d": [1, 2, 3, 4], "label": "car"}]', (10, 10), char_confidence=[1.0])


def test_token_char_confidences_with_a_real_tokenizer(tiny_model):
    tokenizer = tiny_model.tokenizer
    text = '[{"bbox_2d": [12, 340, 56, 789], "label": "car"}]'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.batch_decode([ids], skip_special_tokens=False)[0] == text
    conf = [0.5 + 0.5 * k / len(ids) for k in range(len(ids))]
    chars = token_char_confidences(tokenizer, ids, conf, text)
    assert chars is not None and len(chars) == len(text)
    digit_tokens = [c for t, c in zip(ids, conf) if tokenizer.decode([t]).isdigit()]
    assert len(digit_tokens) == 11                 # Qwen's pre-tokenizer: one token per digit ("bbox_2d"'s 2 first)
    expected = math.exp(sum(math.log(c) for c in digit_tokens[1:]) / 10)
    assert parse_boxes(text, (1000, 1000), char_confidence=chars).boxes[0].score == pytest.approx(expected)
    assert token_char_confidences(tokenizer, ids, [], text) is None
