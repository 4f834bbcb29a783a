"""Turn the model's text answers into typed results: planning waypoints and detection boxes.

Both parsers take whatever text the decoder produced and never raise on it: a bad answer
comes back as a ``ParseError`` with a code a node can count and a message a person can read.
Only bad *arguments* (a non-positive image size, a degenerate crop) raise ``ValueError``.

    >>> answer = "2.26,-0.17,4.43,-0.70,6.52,-1.55,8.48,-2.64,10.28,-3.88,11.99,-5.25,13.76,-6.83,15.59,-8.59"
    >>> plan = parse_waypoints(answer)
    >>> plan.ok, plan.waypoints.shape, plan.waypoints[0].tolist()
    (True, (8, 2), [2.26, -0.17])
    >>> format_waypoints(plan.waypoints) == answer
    True
    >>> parse_waypoints("2.26,-0.17").error.message
    'expected 16 numbers, got 2'
    >>> found = parse_boxes('```json\\n[{"bbox_2d": [100, 200, 500, 600], "label": "car"}]\\n```', (1920, 1080))
    >>> found.boxes[0]
    Box(label='car', score=1.0, x_min=192.0, y_min=216.0, x_max=960.0, y_max=648.0)

Planning answers: ``x1,y1,...,x8,y8``, ego frame (x forward, y left), metres, one waypoint every 0.5 s. Each
field, stripped, must be a plain decimal ``[+-]digits[.digits][e[+-]digits]`` in ASCII digits (``nan`` / ``inf``
only to report them as ``non_finite``; ``.5``, ``5.``, ``1_000``, hex, non-ASCII digits: ``not_a_number``); one
trailing period is accepted, a trailing comma is an empty field. The first failing check is reported, in this
order: empty, not_a_number, wrong_count, non_finite (overflow such as ``1e999`` too), out_of_range.

Detection answers follow Qwen3-VL grounding: a JSON list of objects (or one object), possibly in a
```` ```json ```` fence with text around it, with ``"bbox_2d": [x1, y1, x2, y2]`` on a 0..1000 scale of the image
the model saw, a ``"label"`` and optionally a ``"score"`` or ``"confidence"`` (:func:`parse_boxes`).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .prompts import NUM_WAYPOINTS, round_2dp

DEFAULT_MAX_WAYPOINT_ABS_M = 200.0   # an answer with a waypoint coordinate beyond this (metres) is invalid

# Error codes (ParseError.code).
EMPTY = "empty"
NOT_A_NUMBER = "not_a_number"
WRONG_COUNT = "wrong_count"
NON_FINITE = "non_finite"
OUT_OF_RANGE = "out_of_range"
INVALID_JSON = "invalid_json"
NOT_A_LIST = "not_a_list"
BAD_BOX = "bad_box"

BOX_SCALE = 1000.0   # Qwen3-VL grounding coordinates are relative, 0..1000

_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", re.ASCII)
_NON_FINITE_WORD = re.compile(r"[+-]?(?:nan|inf(?:inity)?)", re.ASCII | re.IGNORECASE)
_BBOX_LIST = re.compile(r'"bbox_2d"\s*:\s*\[([^\]]*)\]')
_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)
# Bounds the search for a JSON value inside surrounding text, so a hostile answer full of
# brackets costs a bounded number of decode attempts.
_MAX_JSON_STARTS = 32


@dataclass(frozen=True)
class ParseError:
    code: str      # one of the module's error-code constants
    message: str   # what was found, for logs and diagnostics

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# eq=False: the generated __eq__ would compare numpy arrays, whose truth value is ambiguous.
@dataclass(frozen=True, eq=False)
class WaypointParse:
    waypoints: np.ndarray | None   # [num_waypoints, 2] float64, (x forward, y left) metres; read-only
    error: ParseError | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in source-image pixels (x right, y down), clipped to the image."""
    label: str
    score: float
    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class BoxParse:
    boxes: list[Box] = field(default_factory=list)
    error: ParseError | None = None
    dropped: int = 0   # objects skipped: malformed, or zero area after clipping

    @property
    def ok(self) -> bool:
        return self.error is None


def _preview(text: str, limit: int = 40) -> str:
    # Answers can be arbitrarily long; messages quote only the start.
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def _waypoint_error(code: str, message: str) -> WaypointParse:
    return WaypointParse(waypoints=None, error=ParseError(code, message))


def parse_waypoints(text: str | None, num_waypoints: int = NUM_WAYPOINTS,
                    max_abs_m: float = DEFAULT_MAX_WAYPOINT_ABS_M) -> WaypointParse:
    """Parse a planning answer ``x1,y1,...,xN,yN`` into an [N, 2] array; never raises on ``text``."""
    if num_waypoints < 1:
        raise ValueError(f"num_waypoints must be >= 1, got {num_waypoints}")
    if not max_abs_m > 0:
        raise ValueError(f"max_abs_m must be > 0, got {max_abs_m}")
    body = (text or "").strip()
    body = body[:-1].rstrip() if body.endswith(".") else body
    if not body:
        return _waypoint_error(EMPTY, f"no numbers in {_preview(text or '')}")

    values = []
    for index, token in enumerate(body.split(","), start=1):
        token = token.strip()
        if not (_NUMBER.fullmatch(token) or _NON_FINITE_WORD.fullmatch(token)):
            return _waypoint_error(NOT_A_NUMBER, f"field {index} is not a number: {_preview(token)}")
        values.append(float(token))   # cannot raise: the patterns above only admit float() syntax

    expected = 2 * num_waypoints
    if len(values) != expected:
        return _waypoint_error(WRONG_COUNT, f"expected {expected} numbers, got {len(values)}")
    for index, value in enumerate(values, start=1):
        if not math.isfinite(value):
            return _waypoint_error(NON_FINITE, f"number {index} is not finite: {value}")
    for index, value in enumerate(values, start=1):
        if abs(value) > max_abs_m:
            return _waypoint_error(OUT_OF_RANGE, f"number {index} is {value:g} m, beyond +-{max_abs_m:g} m")

    waypoints = np.asarray(values, dtype=np.float64).reshape(num_waypoints, 2)   # [N, 2]
    waypoints.setflags(write=False)   # the result is frozen; copy to modify
    return WaypointParse(waypoints=waypoints, error=None)


def format_waypoints(waypoints: np.ndarray) -> str:
    """The training answer format: ``x1,y1,...`` with two decimals and no ``-0.00``."""
    waypoints = np.asarray(waypoints, dtype=np.float64)   # [N, 2]
    if waypoints.ndim != 2 or waypoints.shape[1] != 2:
        raise ValueError(f"waypoints must have shape [N, 2], got {list(waypoints.shape)}")
    if not np.isfinite(waypoints).all():
        raise ValueError("waypoints must be finite")
    return ",".join(f"{round_2dp(value):.2f}" for value in waypoints.ravel())


def _find_json(text: str) -> tuple[bool, object, int]:
    """(found, value, where it starts in ``text``): the fenced block if any, else the whole text, else the
    first object or list of objects that decodes inside the text (not, say, the bbox list of a truncated
    answer)."""
    fence = _FENCE.search(text)
    body, offset = (fence.group(1), fence.start(1)) if fence else (text, 0)
    try:
        value = json.loads(body)
        return True, value, offset + len(body) - len(body.lstrip())
    except (ValueError, RecursionError):   # RecursionError: deeply nested brackets
        pass
    decoder = json.JSONDecoder()
    starts = (match.start() for match in re.finditer(r"[\[{]", body))
    for _, start in zip(range(_MAX_JSON_STARTS), starts):
        try:
            value = decoder.raw_decode(body, start)[0]
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) or (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            return True, value, offset + start
    return False, None, 0


def _element_spans(text: str, i: int, count: int) -> list[tuple[int, int]] | None:
    """[start, end) of ``count`` JSON values in ``text`` from ``i`` on, separated by commas and whitespace
    (the elements of a list :func:`_find_json` decoded), or None when they cannot be told apart."""
    decoder, spans = json.JSONDecoder(), []
    for _ in range(count):
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            end = decoder.raw_decode(text, i)[1]
        except (ValueError, RecursionError):
            return None
        spans.append((i, end))
        i = end
    return spans


def char_confidences(pieces: Sequence[str], confidences: Sequence[float], text: str) -> list[float] | None:
    """Per character of ``text``, the confidence of the token (``pieces``: tokens decoded one by one) it comes from;
    None when the pieces do not spell ``text`` or the counts differ."""
    if len(pieces) != len(confidences) or "".join(pieces) != text:
        return None
    return [float(c) for piece, c in zip(pieces, confidences) for _ in piece]


def token_char_confidences(tokenizer, token_ids: Sequence[int], confidences: Sequence[float],
                           text: str) -> list[float] | None:
    """:func:`char_confidences` of an answer the tokenizer decoded to ``text`` (its tokens decoded one by
    one as ``batch_decode`` decodes them); None without confidences (a decoder that kept none)."""
    if not confidences:
        return None
    pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]
    return char_confidences(pieces, confidences, text)


def span_confidence(text: str, char_confidence: Sequence[float], span: tuple[int, int]) -> float:
    """The geometric mean of the confidences of the ``bbox_2d`` digits in ``text[span]`` (every digit's without such a
    list): how sure the decoder was of where it put the box; 1.0 without digits."""
    found = _BBOX_LIST.search(text, *span)
    first, end = found.span(1) if found else span
    values = [char_confidence[i] for i in range(first, end) if text[i].isdigit()]
    if not values:
        return 1.0
    return float(math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values)))


def _finite_number(value: object) -> float | None:
    # JSON numbers only: bools are ints in Python but not numbers here; huge ints overflow.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _read_object(obj: object) -> tuple[str, float, list[float]] | None:
    """(label, score, [x1, y1, x2, y2] on the 0..1000 scale), or None if malformed."""
    if not isinstance(obj, dict):
        return None
    label, bbox = obj.get("label"), obj.get("bbox_2d")
    if not isinstance(label, str) or not isinstance(bbox, list) or len(bbox) != 4:
        return None
    corners = [_finite_number(v) for v in bbox]
    if any(c is None for c in corners):
        return None
    score = _finite_number(obj.get("score", obj.get("confidence", 1.0)))
    return None if score is None else (label.strip(), score, corners)


def parse_boxes(text: str | None, source_size: tuple[int, int],
                crop: tuple[float, float, float, float] | None = None,
                char_confidence: Sequence[float] | None = None) -> BoxParse:
    """Parse a grounding answer into boxes in source-image pixels; never raises on ``text``.

    ``source_size`` is (width, height) of the source image; ``crop`` is (x0, y0, w, h), the
    region of it the model saw (None: the whole image). A model coordinate v maps to
    x0 + v / 1000 * w (and likewise for y), which also undoes any resize of that region.
    Boxes are corner-ordered, clipped to the image, and dropped if no area remains. A box without a score of its
    own scores 1.0, or with ``char_confidence`` (per character of ``text``, :func:`char_confidences`)
    :func:`span_confidence` of its object (the whole answer's where the objects cannot be located).
    """
    width, height = (float(v) for v in source_size)
    if not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
        raise ValueError(f"source_size must be a positive (width, height), got {source_size!r}")
    x0, y0, crop_w, crop_h = (0.0, 0.0, width, height) if crop is None else (float(v) for v in crop)
    if not (all(math.isfinite(v) for v in (x0, y0, crop_w, crop_h)) and crop_w > 0 and crop_h > 0):
        raise ValueError(f"crop must be a finite (x0, y0, w, h) with w, h > 0, got {crop!r}")

    if not text or not text.strip():
        return BoxParse(error=ParseError(EMPTY, "no text"))
    if char_confidence is not None and len(char_confidence) != len(text):
        raise ValueError(f"char_confidence: one per character of the text ({len(text)}), got {len(char_confidence)}")
    found, value, start = _find_json(text)
    if not found:
        return BoxParse(error=ParseError(INVALID_JSON, f"no JSON list or object in {_preview(text)}"))
    if isinstance(value, dict):
        value, spans = [value], _element_spans(text, start, 1)
    elif isinstance(value, list):
        spans = _element_spans(text, start + 1, len(value))
    else:
        return BoxParse(error=ParseError(NOT_A_LIST, f"expected a JSON list of objects, got {type(value).__name__}"))

    boxes, malformed, degenerate = [], 0, 0
    for k, obj in enumerate(value):
        parsed = _read_object(obj)
        if parsed is None:
            malformed += 1
            continue
        label, score, (x1, y1, x2, y2) = parsed
        if char_confidence is not None and "score" not in obj and "confidence" not in obj:
            score = span_confidence(text, char_confidence, spans[k] if spans else (0, len(text)))
        xs = sorted(min(max(x0 + v / BOX_SCALE * crop_w, 0.0), width) for v in (x1, x2))
        ys = sorted(min(max(y0 + v / BOX_SCALE * crop_h, 0.0), height) for v in (y1, y2))
        if xs[1] <= xs[0] or ys[1] <= ys[0]:
            degenerate += 1
            continue
        boxes.append(Box(label, score, xs[0], ys[0], xs[1], ys[1]))

    dropped = malformed + degenerate
    if value and malformed == len(value):
        return BoxParse(dropped=dropped, error=ParseError(
            BAD_BOX, f"none of {len(value)} objects has a label and a bbox_2d of 4 finite numbers"))
    return BoxParse(boxes=boxes, dropped=dropped)
