"""COCO-style detection scores (evaluation/detection.py, pycocotools) on cases whose answer is known by
construction: perfect boxes score 1, boxes shifted to a known IoU climb the IoU-threshold ladder, a
missing box halves recall, a hallucinated class is left out, unparseable answers are counted."""
from __future__ import annotations

import json
import math

import pytest

from wam_diff2_core.evaluation.detection import METRICS, DetectionImage, detection_scores
from wam_diff2_core.outputs.parsing import Box, BoxParse, ParseError, parse_boxes

IOU_THRESHOLDS = [0.5 + 0.05 * i for i in range(10)]   # COCO's 0.50:0.05:0.95
RECALL_POINTS = 101                                     # COCO's 0:0.01:1


def box(x: float, y: float, w: float, h: float, label: str = "car", score: float = 1.0) -> Box:
    return Box(label, score, x, y, x + w, y + h)


def answered(*boxes: Box) -> BoxParse:
    return BoxParse(boxes=list(boxes))


UNPARSED = BoxParse(error=ParseError("invalid_json", "no JSON list or object in 'I see two cars.'"))


def scene() -> list[list[Box]]:
    """Ground truth of three images: at most one box per class per image (so AR@1 can reach 1 too)."""
    return [[box(10, 20, 50, 30), box(100, 40, 80, 60, "truck")],
            [box(200, 50, 40, 40)],
            [box(5, 5, 20, 60, "pedestrian"), box(60, 70, 90, 45)]]


def test_perfect_boxes_score_one_on_every_metric():
    truths = scene()
    # answers in another order than the truth; two images with neither truth nor answer change nothing
    images = [DetectionImage(f"i{n}", t, answered(*reversed(t))) for n, t in enumerate(truths)]
    images += [DetectionImage("empty0", [], answered()), DetectionImage("empty1", [], answered())]
    scores = detection_scores(images)
    for name in METRICS:
        assert scores[name] == pytest.approx(1.0, abs=1e-12), name
    assert scores["classes"] == ["car", "pedestrian", "truck"]
    for label, boxes in {"car": 3, "pedestrian": 1, "truck": 1}.items():
        c = scores["per_class"][label]
        assert (c["ap"], c["ap50"], c["ap75"]) == pytest.approx((1, 1, 1), abs=1e-12), label
        assert (c["truth"], c["predicted"]) == (boxes, boxes), label
    assert (scores["images"], scores["truth_boxes"], scores["predicted_boxes"], scores["parse_failures"]) == (5, 5, 5, 0)
    assert scores["library"].startswith("pycocotools ")


def test_vehicles_score_as_one_class_and_leave_other_classes_out():
    """A truck answered as a bus: the truck class is missed and the bus a false positive, but the vehicle
    is found; the pedestrian (not a vehicle) counts in the overall AP and not in the vehicles' figure."""
    truths = scene()
    answers = [[box(10, 20, 50, 30), box(100, 40, 80, 60, "bus")], [box(200, 50, 40, 40)],
               [box(60, 70, 90, 45)]]                       # the pedestrian missed
    scores = detection_scores([DetectionImage(f"i{n}", t, answered(*a)) for n, (t, a) in
                               enumerate(zip(truths, answers))])
    vehicles = scores["vehicles"]
    assert vehicles["classes"] == ["car", "truck", "bus"] and (vehicles["truth"], vehicles["predicted"]) == (4, 4)
    for name in ("ap", "ap50", "ap75", "ar10", "ar100"):
        assert vehicles[name] == pytest.approx(1.0, abs=1e-12), name
    assert vehicles["ar1"] == pytest.approx(0.75)       # one box per image: the first image's two vehicles
    assert scores["per_class"]["truck"]["ap"] == 0 and scores["per_class"]["pedestrian"]["ap"] == 0
    assert scores["per_class"]["bus"]["ap"] is None                 # no bus in the truth: left out by COCO
    assert scores["ap"] == pytest.approx(1 / 3)                     # car 1, pedestrian 0, truck 0
    shifted_away = [[box(500, 500, 10, 10)] for _ in truths]
    missed = detection_scores([DetectionImage(f"i{n}", t, answered(*a)) for n, (t, a) in
                               enumerate(zip(truths, shifted_away))])["vehicles"]
    assert missed["ap"] == 0 and missed["ap50"] == 0
    assert detection_scores([DetectionImage("p", [box(5, 5, 20, 60, "pedestrian")], answered())])["vehicles"] == {
        "classes": [], "truth": 0, "predicted": 0, **{name: None for name in METRICS}}


def test_two_cars_in_one_image_are_half_recalled_with_one_box_per_image():
    """AR@1 keeps one box per image and class (COCO's maxDets): one of two cars."""
    truth = [box(0, 0, 50, 50), box(100, 0, 50, 50)]
    scores = detection_scores([DetectionImage("a", truth, answered(*truth))])
    assert scores["ar1"] == pytest.approx(0.5) and scores["ar10"] == pytest.approx(1.0)
    assert scores["ap"] == pytest.approx(1.0, abs=1e-12)


def shifted(truth: Box, iou: float) -> Box:
    """``truth`` moved right so that its IoU with ``truth`` is ``iou``: a box w wide moved by d overlaps
    (w - d) / (w + d); w = 1000 (1 + iou), d = 1000 (1 - iou) make that 2000 iou / 2000 in exact arithmetic."""
    width, shift = 1000 * (1 + iou), 1000 * (1 - iou)
    assert truth.x_max - truth.x_min == pytest.approx(width)
    return Box(truth.label, truth.score, truth.x_min + shift, truth.y_min, truth.x_max + shift, truth.y_max)


@pytest.mark.parametrize("iou", [0.45, 0.525, 0.625, 0.775, 0.875, 0.975])
def test_boxes_shifted_to_a_known_iou_climb_the_threshold_ladder(iou):
    """Every answer box overlaps its truth with IoU ``iou`` (between two thresholds): it is a match at each
    threshold <= iou and a miss above, so AP@t is 1 or 0 and AP@[.5:.95] = (thresholds <= iou) / 10."""
    width = 1000 * (1 + iou)
    truths = [[box(0, 0, width, 50)], [box(300, 100, width, 80, "truck"), box(0, 300, width, 40)]]
    images = [DetectionImage(f"i{n}", t, answered(*(shifted(b, iou) for b in t))) for n, t in enumerate(truths)]
    scores = detection_scores(images)
    passed = sum(t <= iou for t in IOU_THRESHOLDS)
    assert passed == {0.45: 0, 0.525: 1, 0.625: 3, 0.775: 6, 0.875: 8, 0.975: 10}[iou]
    assert scores["ap"] == pytest.approx(passed / 10, abs=1e-12)
    assert scores["ap50"] == pytest.approx(float(iou > 0.5), abs=1e-12)
    assert scores["ap75"] == pytest.approx(float(iou > 0.75), abs=1e-12)
    assert scores["ar100"] == pytest.approx(passed / 10, abs=1e-12)
    for label in ("car", "truck"):
        assert scores["per_class"][label]["ap"] == pytest.approx(passed / 10, abs=1e-12)


def test_iou_0_625_gives_ap_three_tenths():
    """The worked example: IoU 0.625 passes 0.50, 0.55 and 0.60 of the ten thresholds."""
    truth = box(0, 0, 1625, 100)
    scores = detection_scores([DetectionImage("a", [truth], answered(shifted(truth, 0.625)))])
    assert (scores["ap"], scores["ap50"], scores["ap75"]) == pytest.approx((0.3, 1.0, 0.0), abs=1e-12)


@pytest.mark.parametrize("miss", [answered(), UNPARSED], ids=["empty answer", "unparseable answer"])
def test_a_missing_box_halves_recall(miss):
    """Two cars, one found exactly: recall 1/2 at every threshold; precision 1 up to recall 0.50, then
    nothing, so AP is the share of COCO's 101 recall points <= 0.5: 51/101. An answer that does not parse
    scores exactly as an empty one (its car is missed) and is counted."""
    car = box(10, 10, 40, 40)
    scores = detection_scores([DetectionImage("found", [car], answered(car)), DetectionImage("missed", [car], miss)])
    assert scores["ar100"] == pytest.approx(0.5) and scores["ar1"] == pytest.approx(0.5)
    for name in ("ap", "ap50", "ap75"):
        assert scores[name] == pytest.approx(51 / RECALL_POINTS, abs=1e-12)
    assert scores["parse_failures"] == (0 if miss.ok else 1)
    assert scores["truth_boxes"] == 2 and scores["predicted_boxes"] == 1


def test_a_box_of_a_class_without_ground_truth_is_counted_and_left_out():
    truths = scene()
    images = [DetectionImage(f"i{n}", t, answered(*t)) for n, t in enumerate(truths)]
    images[1] = DetectionImage("i1", truths[1], answered(*truths[1], box(0, 0, 30, 30, "bus")))
    scores = detection_scores(images)
    assert scores["ap"] == pytest.approx(1.0, abs=1e-12)          # COCO averages over classes with truth
    assert scores["per_class"]["bus"] == {"ap": None, "ap50": None, "ap75": None, "truth": 0, "predicted": 1}
    assert scores["predicted_without_truth"] == 1 and "bus" in scores["classes"]


def test_false_positives_without_scores_rank_by_image_order():
    """The tie rule: with every score 1.0, a false positive ranked after the true positive (a later image)
    leaves precision 1 at recall 1 (AP 1); ranked before it (an earlier image) precision is 1/2 at every
    recall (AP 1/2). A lower score of its own ranks it last wherever it is."""
    car = box(10, 10, 40, 40)
    stray = box(200, 200, 30, 30)
    hit = DetectionImage("hit", [car], answered(car))
    late = detection_scores([hit, DetectionImage("stray", [], answered(stray))])
    early = detection_scores([DetectionImage("stray", [], answered(stray)), hit])
    assert late["ap"] == pytest.approx(1.0, abs=1e-12) and early["ap"] == pytest.approx(0.5, abs=1e-12)
    assert late["ar100"] == early["ar100"] == pytest.approx(1.0)
    unsure = Box(stray.label, 0.3, stray.x_min, stray.y_min, stray.x_max, stray.y_max)
    ranked = detection_scores([DetectionImage("stray", [], answered(unsure)), hit])
    assert ranked["ap"] == pytest.approx(1.0, abs=1e-12)


def test_no_answer_box_scores_zero_and_no_truth_is_undefined():
    truths = scene()
    nothing = detection_scores([DetectionImage(f"i{n}", t, answered()) for n, t in enumerate(truths)])
    for name in METRICS:
        assert nothing[name] == 0.0, name
    assert all(c["ap"] == 0.0 for c in nothing["per_class"].values())
    unparsed = detection_scores([DetectionImage(f"i{n}", t, UNPARSED) for n, t in enumerate(truths)])
    assert unparsed["ap"] == 0.0 and unparsed["parse_failures"] == 3
    no_truth = detection_scores([DetectionImage("a", [], answered(box(0, 0, 10, 10))),
                                 DetectionImage("b", [], answered())])
    assert all(no_truth[name] is None for name in METRICS)
    assert no_truth["predicted_without_truth"] == 1
    assert detection_scores([])["ap"] is None


def test_grounding_answers_through_the_parser():
    """Ground truth and answers as the model writes them (0..1000, synth's format), parsed onto a 320 x 180
    image: the same text scores 1; prose is a parse failure; a malformed object is dropped, not scored."""
    size = (320, 180)
    truth_text = json.dumps([{"bbox_2d": [100, 200, 400, 600], "label": "car"},
                             {"bbox_2d": [500, 100, 700, 900], "label": "truck"}])
    truth = parse_boxes(truth_text, size).boxes
    answer = parse_boxes("```json\n" + truth_text[:-1] + ', {"bbox_2d": [1, 2], "label": "car"}]\n```', size)
    assert answer.dropped == 1
    scores = detection_scores([DetectionImage("a", truth, answer),
                               DetectionImage("b", truth, parse_boxes("I see two cars.", size))])
    assert scores["parse_failures"] == 1 and scores["dropped_objects"] == 1
    assert scores["ar100"] == pytest.approx(0.5) and scores["ap50"] == pytest.approx(51 / RECALL_POINTS, abs=1e-12)


@pytest.mark.parametrize("images, message", [
    ([DetectionImage("a", [], answered()), DetectionImage("a", [], answered())], "image 'a' is given twice"),
    ([DetectionImage("a", [Box("car", 1.0, 10, 0, 10, 5)], answered())], r"image 'a': truth box 0: needs x_max > x_min"),
    ([DetectionImage("a", [], answered(Box("car", 1.0, 0, 0, math.nan, 5)))], "answer box 0: corners must be finite"),
    ([DetectionImage("a", [Box("", 1.0, 0, 0, 5, 5)], answered())], "label must be a non-empty string"),
    ([DetectionImage("a", [(0, 0, 5, 5)], answered())], "truth box 0: expected a parsing.Box, got tuple"),
    ([DetectionImage("a", [], "[]")], "the answer must be a parsing.BoxParse, got str"),
    ([("a", [], answered())], "image 0: expected a DetectionImage, got tuple"),
])
def test_bad_input_names_what_is_wrong(images, message):
    with pytest.raises(ValueError, match=message):
        detection_scores(images)
