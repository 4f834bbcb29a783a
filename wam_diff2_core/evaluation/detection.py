"""COCO-style detection scores of grounding answers, computed by pycocotools (``COCOeval``, bbox, its default
parameters, on in-memory ``COCO`` objects): AP@[.5:.95], AP50, AP75, AR@1 / 10 / 100, AP per class and
``vehicles`` (:data:`VEHICLE_CLASSES` as one class). How boxes rank and what is counted: "Detection scores"
in this folder's README.md.

    images = [DetectionImage("f0", truth=parse_boxes(truth_text, size).boxes, answer=parse_boxes(answer_text, size))]
    scores = detection_scores(images)
    scores["ap"], scores["ap50"], scores["per_class"]["car"]["ap"]
"""
from __future__ import annotations

import contextlib
import io
import math
import numbers
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Sequence

import numpy as np

from ..outputs.parsing import Box, BoxParse

# COCOeval.stats positions (pycocotools' summarize(), area "all")
_STATS = {"ap": 0, "ap50": 1, "ap75": 2, "ar1": 6, "ar10": 7, "ar100": 8}
METRICS = tuple(_STATS)
MAX_BOXES_PER_IMAGE = 100       # COCOeval's largest maxDets: boxes beyond it (per image and class) are not scored
# ``vehicles``: these classes scored as one (COCOeval's class-agnostic mode), the figure a planner cares for
VEHICLE_CLASSES = ("car", "truck", "bus")


@dataclass(frozen=True)
class DetectionImage:
    """One image to score: its ground-truth boxes and the parsed answer (source-image pixels)."""
    id: str
    truth: Sequence[Box]
    answer: BoxParse            # not ok: the answer did not parse (its image scores no box)


def _check_box(box: object, what: str) -> None:
    if not isinstance(box, Box):
        raise ValueError(f"{what}: expected a parsing.Box, got {type(box).__name__}")
    if not isinstance(box.label, str) or not box.label:
        raise ValueError(f"{what}: the label must be a non-empty string, got {box.label!r}")
    corners = (box.x_min, box.y_min, box.x_max, box.y_max)
    if not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in corners):
        raise ValueError(f"{what}: corners must be finite numbers, got {corners}")
    if not (box.x_max > box.x_min and box.y_max > box.y_min):
        raise ValueError(f"{what}: needs x_max > x_min and y_max > y_min, got {corners}")
    if not (isinstance(box.score, numbers.Real) and math.isfinite(box.score)):
        raise ValueError(f"{what}: the score must be a finite number, got {box.score!r}")


def _checked(images: Sequence[DetectionImage]) -> list[DetectionImage]:
    seen: set[str] = set()
    for n, image in enumerate(images):
        if not isinstance(image, DetectionImage):
            raise ValueError(f"image {n}: expected a DetectionImage, got {type(image).__name__}")
        if image.id in seen:
            raise ValueError(f"image {image.id!r} is given twice")
        seen.add(image.id)
        if not isinstance(image.answer, BoxParse):
            raise ValueError(f"image {image.id!r}: the answer must be a parsing.BoxParse, got "
                             f"{type(image.answer).__name__}")
        for i, box in enumerate(image.truth):
            _check_box(box, f"image {image.id!r}: truth box {i}")
        if image.answer.ok:
            for i, box in enumerate(image.answer.boxes):
                _check_box(box, f"image {image.id!r}: answer box {i}")
    return list(images)


def _annotation(box: Box, annotation_id: int, image_id: int, category: dict[str, int]) -> dict[str, Any]:
    x, y, w, h = float(box.x_min), float(box.y_min), float(box.x_max - box.x_min), float(box.y_max - box.y_min)
    return {"id": annotation_id, "image_id": image_id, "category_id": category[box.label], "bbox": [x, y, w, h],
            "area": w * h, "iscrowd": 0}


def _coco(images: list[dict], categories: list[dict], annotations: list[dict]):
    """A pycocotools COCO object over in-memory annotations (no file)."""
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):        # pycocotools prints its progress
        coco = COCO()
        coco.dataset = {"images": images, "categories": categories, "annotations": annotations}
        coco.createIndex()
    return coco


def _undefined(value: float) -> float | None:
    # pycocotools writes -1 where a figure has no ground truth to measure against
    return None if value < 0 else float(value)


def _mean_defined(values) -> float | None:
    values = np.asarray(values)
    defined = values[values > -1]
    return float(defined.mean()) if defined.size else None


def detection_scores(images: Sequence[DetectionImage]) -> dict[str, Any]:
    """pycocotools' COCO scores of the answers against the ground truth (module docstring), JSON-ready:
    counts, ``ap`` / ``ap50`` / ``ap75`` / ``ar1`` / ``ar10`` / ``ar100`` (None where undefined) and
    ``per_class`` {label: ap, ap50, ap75, truth, predicted} and ``vehicles`` (the same figures with every box of
    :data:`VEHICLE_CLASSES` one class). A ValueError names a malformed input."""
    images = _checked(images)
    truth_labels = {b.label for image in images for b in image.truth}
    answered = [b for image in images if image.answer.ok for b in image.answer.boxes]
    classes = sorted(truth_labels | {b.label for b in answered})
    category = {label: k for k, label in enumerate(classes, start=1)}
    coco_images = [{"id": n} for n in range(1, len(images) + 1)]
    truth, predicted = [], []
    for n, image in enumerate(images, start=1):
        for box in image.truth:          # ids from 1: pycocotools takes a match to id 0 for no match
            truth.append(_annotation(box, len(truth) + 1, n, category))
        for box in image.answer.boxes if image.answer.ok else ():
            predicted.append({**_annotation(box, len(predicted) + 1, n, category), "score": float(box.score)})
    out: dict[str, Any] = {
        "library": f"pycocotools {version('pycocotools')}", "images": len(images), "truth_boxes": len(truth),
        "predicted_boxes": len(predicted),
        "parse_failures": sum(not image.answer.ok for image in images),
        "dropped_objects": sum(image.answer.dropped for image in images),
        "predicted_without_truth": sum(b.label not in truth_labels for b in answered),
        "classes": classes,
        **{name: None for name in METRICS},
        "per_class": {label: {"ap": None, "ap50": None, "ap75": None,
                              "truth": sum(t["category_id"] == category[label] for t in truth),
                              "predicted": sum(p["category_id"] == category[label] for p in predicted)}
                      for label in classes},
    }
    vehicle_ids = {category[label] for label in VEHICLE_CLASSES if label in category}
    vehicle_truth = [t for t in truth if t["category_id"] in vehicle_ids]
    out["vehicles"] = {"classes": [label for label in VEHICLE_CLASSES if label in category],
                       "truth": len(vehicle_truth),
                       "predicted": sum(p["category_id"] in vehicle_ids for p in predicted),
                       **{name: None for name in METRICS}}
    if not truth:                        # nothing to recall: every COCO figure is undefined
        return out
    categories = [{"id": k, "name": label} for label, k in category.items()]
    evaluation = _evaluate(coco_images, categories, truth, predicted, by_class=True)
    out.update({name: _undefined(evaluation.stats[i]) for name, i in _STATS.items()})
    precision = evaluation.eval["precision"]              # [iou thresholds, recall points, class, area, max boxes]
    thresholds = list(evaluation.params.iouThrs)
    at50, at75 = (min(range(len(thresholds)), key=lambda t: abs(thresholds[t] - iou)) for iou in (0.5, 0.75))
    for k, category_id in enumerate(evaluation.params.catIds):
        per_class = precision[:, :, k, 0, -1]              # area "all", the largest per-image cap
        out["per_class"][classes[category_id - 1]].update(
            ap=_mean_defined(per_class), ap50=_mean_defined(per_class[at50]), ap75=_mean_defined(per_class[at75]))
    if vehicle_truth:                    # one class: a truck answered as a bus still finds its vehicle
        vehicles = _evaluate(coco_images, categories, vehicle_truth,
                             [p for p in predicted if p["category_id"] in vehicle_ids], by_class=False)
        out["vehicles"].update({name: _undefined(vehicles.stats[i]) for name, i in _STATS.items()})
    return out


def _evaluate(coco_images: list[dict], categories: list[dict], truth: list[dict], predicted: list[dict],
              by_class: bool):
    """pycocotools' COCOeval (bbox, default parameters) run to its summary; ``by_class`` False: every box
    one class (COCOeval's ``useCats = 0``)."""
    from pycocotools.cocoeval import COCOeval

    evaluation = COCOeval(_coco(coco_images, categories, truth), _coco(coco_images, categories, predicted), "bbox")
    evaluation.params.useCats = int(by_class)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.params.maxDets[-1] == MAX_BOXES_PER_IMAGE and evaluation.params.areaRngLbl[0] == "all"
    return evaluation
