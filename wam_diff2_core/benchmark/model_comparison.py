"""AR against block diffusion on planning and grounding samples: the samples, one timed answer per sample
and configuration, and the summaries (``wam-diff2 bench --model CKPT --data SAMPLES.json`` prints them).

Per configuration, medians over the samples of the decoding statistics (decoding time = denoise + commit
phases, prefill excluded) and, over the samples whose answer parses, L2 against the sample's ground-truth
answer; grounding answers are scored by COCO AP (``evaluation/detection.py``).

    planning, grounding, skipped = bench_samples("eval.json", None, limit=None)
    row = decode_row(decoder, tokenizer, sample.id, inputs, truth, settings, seed=0)
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..config import ConfigError, DecodingSettings
from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS, SampleError, iter_samples, load_images
from ..evaluation.ground_truth import constant_velocity_waypoints
from ..evaluation.metrics import pdm_entry, pdm_means, trajectory_metrics, waypoint_errors
from ..outputs.parsing import parse_boxes, parse_waypoints, token_char_confidences
from ..outputs.prompts import is_grounding_prompt, parse_planning_prompt
from ..profiling import PeakMemory, StageTimes, stage_summary, timed_decode

log = logging.getLogger(__name__)
SWEEP_BLOCK = 32
TASKS = ("planning", "grounding")
DEFAULT_THRESHOLD = DecodingSettings().confidence_threshold   # the Block-B rows' threshold (0.9)


def configurations(block_sizes, thresholds) -> list[tuple[str, int, float | None]]:
    """(label, block size, threshold) in table order: AR, Block-B at 0.9, Block-32 at each threshold."""
    out = [("AR", 1, None), *((f"Block-{b} t={DEFAULT_THRESHOLD:g}", b, DEFAULT_THRESHOLD) for b in block_sizes)]
    for t in thresholds:
        label = f"Block-{SWEEP_BLOCK} t={t:g}"
        if label not in [c[0] for c in out]:
            out.append((label, SWEEP_BLOCK, t))
    return out


def bench_samples(data: str, data_root: str | None, limit: int | None, every: int = 1, *,
                  tasks=TASKS, allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS):
    """(planning [(Sample, ground truth [8, 2])], grounding [Sample], skipped [{id, reason}]) of a samples
    file, each task's thinned to every ``every``-th and cut to ``limit``: a record whose last answer is 8
    waypoints is a planning sample, one whose prompt asks for ``bbox_2d`` boxes (with one image) a
    grounding sample (its answer is read as boxes once its image is loaded: :func:`grounding_truth`).
    ConfigError when there is neither."""
    path = Path(data)
    if not path.is_file():
        raise ConfigError(f"--data {path}: no such file")
    if every < 1:
        raise ConfigError(f"--every must be >= 1, got {every}")
    try:
        items = list(iter_samples(path, Path(data_root) if data_root else path.parent,
                                  allow_absolute_paths=allow_absolute_paths))
    except ValueError as exc:
        raise ConfigError(f"--data {exc}") from exc
    planning, grounding, skipped = [], [], []
    for s in items:
        if isinstance(s, SampleError):
            skipped.append({"id": s.sample_id, "reason": str(s)})
            continue
        truth = parse_waypoints(s.answer or "")
        if truth.ok:
            if "planning" in tasks:
                planning.append((s, truth.waypoints))
            continue
        if is_grounding_prompt(s.prompt_text):
            if "grounding" not in tasks:
                continue
            if len(s.image_paths) != 1:
                skipped.append({"id": s.id, "reason": f"a grounding sample needs one image, it has "
                                                      f"{len(s.image_paths)}"})
            else:
                grounding.append(s)
            continue
        skipped.append({"id": s.id, "reason": f"ground truth is not a planning answer ({truth.error}) and the "
                                              "prompt asks for no bbox_2d boxes"})
    planning, grounding = planning[::every], grounding[::every]
    if limit is not None:
        planning, grounding = planning[:max(0, limit)], grounding[:max(0, limit)]
    if not planning and not grounding:
        kinds = {"planning": "planning samples (records whose last assistant answer is 8 waypoints)",
                 "grounding": "grounding samples (records whose prompt asks for bbox_2d boxes)"}
        raise ConfigError(f"--data {path}: no {' or '.join(kinds[t] for t in TASKS if t in tasks)}; "
                          f"{len(skipped)} record(s) skipped")
    return planning, grounding, skipped


def grounding_truth(sample, image):
    """The ground truth of a grounding sample, its answer read as boxes on ``image`` (a BoxParse, in
    pixels: objects it cannot use, malformed or of no area, are its ``dropped``), or a string saying why
    its answer is not a grounding answer."""
    truth = parse_boxes(sample.answer or "", image.size)
    return truth if truth.ok else f"ground truth is not a grounding answer ({truth.error})"


def decode_one(decoder, tokenizer, inputs, settings, generator, stages):
    """(answer text, DecodeStats, (answer token ids, their confidences) or None) of one sample, its decode's
    stage times added to ``stages`` (the tests stub this to pin the L2 math)."""
    decoded, (text,) = timed_decode(decoder, tokenizer, inputs, stages, settings, generators=[generator])
    return text, decoded.stats[0], (decoded.sequences[0], decoded.confidences_of(0))


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def pdm_row(pdm, sample_id: str, waypoints) -> dict[str, Any] | None:
    """A sample's PDM score and sub-scores (``waypoints`` None: the answer did not parse, PDMS 0);
    None when ``pdm`` is None or does not know the sample."""
    if pdm is None or pdm.inputs(sample_id) is None:
        return None
    return pdm_entry(None if waypoints is None else pdm.score(sample_id, waypoints))


def _l2_summary(errors: list) -> dict[str, Any]:
    """L2 at 4 s (median and mean) and per waypoint over per-sample waypoint errors [[8]]
    (metrics.trajectory_metrics)."""
    traj = trajectory_metrics(np.array(errors) if errors else np.zeros((0, 8)))
    return {"l2_4s_median": _median(e[-1] for e in errors), "l2_4s_mean": traj["l2_at_t"]["4s"],
            "per_waypoint": traj["per_waypoint"]}


def summarize(label: str, block: int, threshold, model: str, rows: list[dict]) -> dict[str, Any]:
    """Medians over samples + L2 over the parsed ones (:func:`_l2_summary`) + the PDM score
    means where the rows carry them (``pdm``)."""
    errors = [r["errors"] for r in rows if r["errors"] is not None]
    return {
        "label": label, "block_size": block, "confidence_threshold": threshold, "model": model,
        "samples": len(rows), "parsed": len(errors), "parse_failures": len(rows) - len(errors),
        **decode_medians(rows), **_l2_summary(errors),
        **pdm_means([r.get("pdm") for r in rows]),
        "per_sample": rows,
    }


def decode_medians(rows: list[dict]) -> dict[str, Any]:
    """Medians over samples of the decoding statistics (tokens per forward, ms per token ...) and the
    per-stage times."""
    return {
        "tokens_per_forward": _median(r["tokens"] / r["forwards"] if r["forwards"] else None for r in rows),
        "forwards_per_token": _median(r["forwards"] / r["tokens"] if r["tokens"] else None for r in rows),
        "forwards_per_answer": _median(r["forwards"] for r in rows),
        "tokens_per_answer": _median(r["tokens"] for r in rows),
        "ms_per_token": _median(r["decode_ms"] / r["tokens"] if r["tokens"] else None for r in rows),
        "tokens_per_s": _median(r["tokens"] / (r["decode_ms"] / 1e3) if r["decode_ms"] > 0 else None for r in rows),
        "prefill_ms": _median(r["prefill_ms"] for r in rows),
        "decode_ms": _median(r["decode_ms"] for r in rows),
        "total_ms": _median(r["prefill_ms"] + r["decode_ms"] for r in rows),
        "stages": stage_summary([r["stages"] for r in rows if r.get("stages")]),
    }


def summarize_grounding(rows: list[dict], images) -> dict[str, Any] | None:
    """A configuration's grounding answers: COCO scores (:func:`~wam_diff2_core.evaluation.detection.
    detection_scores` over ``images``, the DetectionImages of ``rows``), parse failures and decoding
    medians; None without grounding samples."""
    from ..evaluation.detection import detection_scores

    if not rows:
        return None
    failures = sum(r["parse_error"] is not None for r in rows)
    return {"samples": len(rows), "parsed": len(rows) - failures, "parse_failures": failures,
            "coco": detection_scores(images), **decode_medians(rows), "per_sample": rows}


def constant_velocity_baseline(samples, pdm=None) -> dict[str, Any]:
    """L2 of the constant-velocity extrapolation of each sample's prompt velocity (the floor a
    planner must beat), over the samples whose prompt is the planning prompt; its PDM score with
    ``pdm`` (a :class:`~wam_diff2_core.sim.pdm_scenes.DataSetPdm`)."""
    errors, scores = [], []
    for sample, truth in samples:
        telemetry = parse_planning_prompt(sample.prompt_text)
        if telemetry is not None:
            plan = constant_velocity_waypoints(telemetry[1])
            errors.append(waypoint_errors(plan, truth))
            scores.append(pdm_row(pdm, sample.id, plan))
    return {"label": "CV baseline", "samples": len(errors), **_l2_summary(errors), **pdm_means(scores)}


def compare(results: list[dict[str, Any]], baseline: dict[str, Any]) -> None:
    """Add each configuration's decoding speed-up over the AR row (ratio of median ms/token) and its
    L2 at 4 s relative to the AR row and to the constant-velocity baseline (ratio of means)."""
    ar = results[0]

    def ratio(a, b):
        return a / b if a is not None and b else None
    for r in results:
        r["speedup_vs_ar"] = ratio(ar["ms_per_token"], r["ms_per_token"])
        r["l2_4s_vs_ar"] = ratio(r["l2_4s_mean"], ar["l2_4s_mean"])
        r["l2_4s_vs_cv"] = ratio(r["l2_4s_mean"], baseline["l2_4s_mean"])


def timed_answer(decoder, tokenizer, inputs, settings, seed: int, parse, image_ms: float = 0.0,
                 processor_ms: float = 0.0):
    """(answer text, ``parse(text, tokens)``, the row's decode fields: forwards, tokens, prefill_ms, decode_ms
    (denoise + commit) and stage times as a dict) of one sample under one configuration (``tokens``:
    decode_one's answer token ids and confidences, or None; ``image_ms`` / ``processor_ms``: reading and
    encoding the sample, done once)."""
    from ..decoding.sampling import seeded_generators

    memory = PeakMemory(decoder.device)
    memory.reset()
    stages = StageTimes(image_ms=image_ms, processor_ms=processor_ms, memory_kind=memory.kind)
    t0 = time.perf_counter()
    text, s, tokens = decode_one(decoder, tokenizer, inputs, settings, seeded_generators([seed], decoder.device)[0],
                                 stages)
    t_parse = time.perf_counter()
    parsed = parse(text, tokens)
    t_end = time.perf_counter()
    stages.parse_ms += (t_end - t_parse) * 1e3
    stages.finish(image_ms + processor_ms + (t_end - t0) * 1e3, memory)
    return text, parsed, {"forwards": s.forwards, "tokens": s.tokens, "prefill_ms": s.prefill_ms,
                          "decode_ms": s.denoise_ms + s.commit_ms, "stages": stages.as_dict()}


def decode_row(decoder, tokenizer, sample_id: str, inputs, truth, settings, seed: int,
               image_ms: float = 0.0, processor_ms: float = 0.0) -> dict[str, Any]:
    """One planning sample under one configuration: its answer, errors against ``truth`` [8, 2], decode
    statistics and stage times."""
    text, plan, fields = timed_answer(decoder, tokenizer, inputs, settings, seed,
                                      lambda answer, _: parse_waypoints(answer), image_ms, processor_ms)
    return {"id": sample_id, "text": text, "parse_error": None if plan.ok else str(plan.error),
            "waypoints": plan.waypoints.tolist() if plan.ok else None,
            "errors": waypoint_errors(plan.waypoints, truth).tolist() if plan.ok else None,
            **fields}


def ground_row(decoder, tokenizer, sample_id: str, inputs, image_size: tuple[int, int], settings, seed: int,
               image_ms: float = 0.0, processor_ms: float = 0.0):
    """(row, BoxParse) of one grounding sample under one configuration: its answer read as boxes on an
    image of ``image_size`` (width, height) pixels, each scored by the decoder's confidence in its coordinates
    (parsing.span_confidence), decode statistics and stage times."""
    def parse(answer: str, tokens):
        confidence = token_char_confidences(tokenizer, *tokens, answer) if tokens else None
        return parse_boxes(answer, image_size, char_confidence=confidence)

    text, found, fields = timed_answer(decoder, tokenizer, inputs, settings, seed, parse, image_ms, processor_ms)
    row = {"id": sample_id, "text": text, "parse_error": None if found.ok else str(found.error),
           "boxes": [vars(b) for b in found.boxes], "dropped": found.dropped, **fields}
    return row, found


@dataclass
class SampleSet:
    """The samples a comparison decodes, each image read once: planning samples [(Sample, ground truth
    [8, 2])] with readable images, grounding samples with readable images and a ground truth of boxes
    (``truth_boxes`` by sample id), the images and their reading time (ms) by sample id, and the
    ground-truth objects no box could be made of."""

    samples: list
    grounding: list
    images: dict[str, list]
    image_ms: dict[str, float]
    truth_boxes: dict[str, list]
    truth_dropped: int


def read_sample_images(samples, grounding, skipped: list[dict]) -> SampleSet:
    """The :class:`SampleSet` of :func:`bench_samples`' ``samples`` and ``grounding``; a sample whose
    images cannot be read, or whose answer is not a grounding answer on its image, is appended to
    ``skipped`` ({id, reason}) instead."""
    images, image_ms, truth_boxes = {}, {}, {}
    for s in [*(s for s, _ in samples), *grounding]:
        try:
            t = time.perf_counter()
            images[s.id] = load_images(s)
            image_ms[s.id] = (time.perf_counter() - t) * 1e3
        except SampleError as exc:
            skipped.append({"id": s.id, "reason": str(exc)})
    truth_dropped = 0
    for s in grounding:
        truth = grounding_truth(s, images[s.id][0]) if s.id in images else None
        if isinstance(truth, str):
            skipped.append({"id": s.id, "reason": truth})
        elif truth is not None:
            truth_boxes[s.id], truth_dropped = truth.boxes, truth_dropped + truth.dropped
    return SampleSet(samples=[(s, t) for s, t in samples if s.id in images],
                     grounding=[s for s in grounding if s.id in truth_boxes], images=images, image_ms=image_ms,
                     truth_boxes=truth_boxes, truth_dropped=truth_dropped)


@dataclass
class Comparison:
    """What :func:`compare_models` measured: a summary per configuration (table order, :func:`summarize` with
    its ``grounding`` and the :func:`compare` ratios), the constant-velocity baseline, the first model
    loaded (its device and dtype) and, by checkpoint path, each model loaded with its decoder and the
    samples' encoded prompts (work order: planning samples first)."""

    results: list[dict[str, Any]]
    baseline: dict[str, Any]
    loaded: Any
    by_path: dict[str, tuple]


def compare_models(data: SampleSet, models: dict[str, str], *, block_sizes, thresholds, seed: int = 0,
                   device: str = "auto", dtype: str = "auto", quantization: str = "none",
                   max_new_tokens: int | None = None, min_pixels: int | None = None, max_pixels: int | None = None,
                   pdm=None) -> Comparison:
    """Decode every sample of ``data`` under every configuration (:func:`configurations`: ``models["ar"]`` at
    B = 1, ``models["diffusion"]`` at the other rows) and summarize; ``pdm`` (a ``DataSetPdm``) adds the PDM
    score. Each prompt is encoded once per model; samples outer, configurations inner, so a change in the
    machine's load while the benchmark runs reaches every configuration alike instead of skewing the
    ratios between them."""
    from ..decoding import make_decoder
    from ..evaluation.detection import DetectionImage
    from ..model.checkpoint import load_checkpoint
    from ..model.prompt_encoding import encode_prompts

    overrides = {"max_new_tokens": max_new_tokens} if max_new_tokens else None
    # every sample the benchmark decodes, planning first: (sample, task, ground truth)
    work = [*((s, "planning", t) for s, t in data.samples),
            *((s, "grounding", data.truth_boxes[s.id]) for s in data.grounding)]
    loaded_by_path: dict[str, Any] = {}
    runs = []

    def decode(r, i: int, seed: int, sample_id: str | None = None):
        """Row (and for grounding, its DetectionImage) of work item ``i`` under run ``r``."""
        sample, task, truth = work[i]
        common = dict(image_ms=data.image_ms[sample.id], processor_ms=r.processor_ms[i])
        if task == "planning":
            return decode_row(r.decoder, r.loaded.tokenizer, sample_id or sample.id, r.encoded[i], truth,
                              r.settings, seed, **common), None
        row, found = ground_row(r.decoder, r.loaded.tokenizer, sample_id or sample.id, r.encoded[i],
                                data.images[sample.id][0].size, r.settings, seed, **common)
        return row, DetectionImage(sample.id, truth, found)

    for label, block, threshold in configurations(block_sizes, thresholds):
        path = models["ar" if block == 1 else "diffusion"]
        if path not in loaded_by_path:
            loaded = load_checkpoint(path, device=device, dtype=dtype, overrides=overrides, quantization=quantization)
            encoded, processor_ms = [], []
            for s, _, _ in work:
                t = time.perf_counter()
                encoded.append(encode_prompts(loaded.processor, [s.prompt_messages], [data.images[s.id]],
                                              min_pixels=min_pixels, max_pixels=max_pixels).to(loaded.device))
                processor_ms.append((time.perf_counter() - t) * 1e3)
            loaded_by_path[path] = (loaded, make_decoder(loaded.model, loaded.config), encoded, processor_ms)
        loaded, decoder, encoded, processor_ms = loaded_by_path[path]
        if block > 1 and loaded.config.mask_token_id is None:
            log.warning("%s: %s is autoregressive (no mask token): its block-diffusion rows are left out", label, path)
            continue
        settings = loaded.config.with_settings(block_size=block, denoising_steps=block,
                                               **({} if threshold is None else {"confidence_threshold": threshold})
                                               ).settings
        r = SimpleNamespace(label=label, block=block, threshold=threshold, path=path, loaded=loaded,
                            decoder=decoder, encoded=encoded, settings=settings, processor_ms=processor_ms,
                            rows=[], ground_rows=[], detections=[])
        decode(r, 0, seed, "warm-up")
        runs.append(r)
    for i, (sample, task, _) in enumerate(work):
        log.info("bench sample %d/%d (%s, %s)", i + 1, len(work), task, sample.id)
        for r in runs:
            row, detection = decode(r, i, seed + i)
            if detection is None:
                r.rows.append(row)
            else:
                r.ground_rows.append(row)
                r.detections.append(detection)
    results = []
    for r in runs:
        for row in r.rows:
            row["pdm"] = pdm_row(pdm, row["id"], row["waypoints"])
        results.append({**summarize(r.label, r.block, r.threshold, str(r.path), r.rows),
                        "grounding": summarize_grounding(r.ground_rows, r.detections)})
    baseline = constant_velocity_baseline(data.samples, pdm)
    compare(results, baseline)
    return Comparison(results=results, baseline=baseline, loaded=next(iter(loaded_by_path.values()))[0],
                      by_path=loaded_by_path)
