"""``wam-diff2 bench --model CKPT --data SAMPLES.json``: AR vs block diffusion on planning and grounding samples.

One run, side by side: the AR model (``--ar-model``, default ``--model`` decoded at B = 1) and the
diffusion model at each ``--block-sizes`` (threshold 0.9) and at B = 32 for each ``--thresholds``.
Per configuration, medians over the samples of: tokens per forward (answer tokens / forwards after
the prefill, commits included), forwards per answer, ms per token and tokens per second (decoding
time = denoise + commit phases, **prefill excluded**; the prefill and the whole call are reported
separately), and over the samples whose answer parses: L2 at 4 s (median and mean) and the
per-waypoint mean L2 curve, against the sample's ground-truth answer (parsed); parse failures count
every sample.

Grounding samples (a prompt that asks for ``bbox_2d`` boxes, such as ``synth``'s detection samples) are
decoded under the same configurations and scored apart from the planning ones: COCO AP@[.5:.95], AP50,
AP75, AR@1/10/100 and AP per class by pycocotools (``evaluation/detection.py``: ranking, ties and what
is counted), the answers and the sample's ground-truth answer both mapped onto the sample's image in
pixels; an answer that does not parse is a parse failure and scores no box. Their decoding speed
(tokens per forward, ms per token) is reported separately, as their answers are longer and more
regular than waypoints. Other samples are skipped (``skipped`` in bench.json, with the reason).

On a demo-world data set (``wam-diff2 synth``'s folder: a ``manifest.json`` beside the samples file),
each configuration also gets NAVSIM v1's PDM score (``pdm_score.py``) and its sub-scores, means over
the planning samples seen from the ego: each sample's episode is simulated again and its frame scored
against the world's road and traffic, the expert as the reference planner (``sim/pdm_scenes.py``); an
answer that does not parse scores PDMS 0 (the sub-scores are over the parsed ones). The
constant-velocity baseline is scored alike. With ``--candidates N`` the diffusion model's answers with and
without candidate selection are scored side by side on the same samples (``bench_candidates.py``).

Writes ``bench.json`` and ``bench.png`` (per-waypoint error of AR vs Block-32, the exposure-bias
figure, and ms/token per configuration) into ``--out``, atomically.
"""
from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..config import DecodingSettings
from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS
from ..profiling import stage_summary

log = logging.getLogger(__name__)

SWEEP_BLOCK = 32
TASKS = ("planning", "grounding")
DEFAULT_THRESHOLD = DecodingSettings().confidence_threshold   # the Block-B rows' threshold (0.9)


def add_arguments(p) -> None:
    from .common import add_sample_path_arguments

    g = p.add_argument_group("model comparison mode (with --data)")
    g.add_argument("--data", default=None,
                   help="planning and grounding samples (JSON/JSONL): compare --ar-model (B=1) with --model's "
                        "block sizes")
    g.add_argument("--ar-model", default=None, help="AR checkpoint (default: --model decoded at B = 1)")
    add_sample_path_arguments(g)
    g.add_argument("--block-sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    g.add_argument("--thresholds", type=float, nargs="+", default=[0.7, 0.8, 0.9, 0.95],
                   help=f"confidence thresholds swept at B = {SWEEP_BLOCK}")
    g.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS,
                   help="which samples of --data to bench (default: both)")
    g.add_argument("--every", type=int, default=1,
                   help="take every N-th sample of each task (spread over the set)")
    g.add_argument("--limit", type=int, default=None, help="at most this many samples of each task (after --every)")
    g.add_argument("--max-new-tokens", type=int, default=None, help="answer bound (default: the checkpoint's)")
    g.add_argument("--min-pixels", type=int, default=None, help="image pixel budget (default: the processor's)")
    g.add_argument("--max-pixels", type=int, default=None)
    from . import bench_candidates
    bench_candidates.add_arguments(g)
    g.add_argument("--out", default="bench_models", help="folder for bench.json and bench.png (written atomically)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def configurations(block_sizes, thresholds) -> list[tuple[str, int, float | None]]:
    """(label, block size, threshold) in table order: AR, Block-B at 0.9, Block-32 at each threshold."""
    out = [("AR", 1, None)]
    for b in block_sizes:
        out.append((f"Block-{b} t={DEFAULT_THRESHOLD:g}", b, DEFAULT_THRESHOLD))
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
    from ..config import ConfigError
    from ..data.samples import SampleError, iter_samples
    from ..outputs.parsing import parse_waypoints
    from ..outputs.prompts import is_grounding_prompt

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
        if is_grounding_prompt(prompt_text(s)):
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


def prompt_text(sample) -> str:
    """The text of a sample's turns before its answer."""
    return "\n".join(item["text"] for m in sample.prompt_messages for item in m["content"] if item["type"] == "text")


def grounding_truth(sample, image):
    """The ground truth of a grounding sample, its answer read as boxes on ``image`` (a BoxParse, in
    pixels: objects it cannot use, malformed or of no area, are its ``dropped``), or a string saying why
    its answer is not a grounding answer."""
    from ..outputs.parsing import parse_boxes

    truth = parse_boxes(sample.answer or "", image.size)
    return truth if truth.ok else f"ground truth is not a grounding answer ({truth.error})"


def decode_one(decoder, tokenizer, inputs, settings, generator):
    """(answer text, DecodeStats) of one sample (the test stubs this to pin the L2 math)."""
    out = decoder.generate(inputs, settings, [generator])
    return tokenizer.batch_decode(out.sequences, skip_special_tokens=False)[0], out.stats[0]


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def pdm_row(pdm, sample_id: str, waypoints) -> dict[str, Any] | None:
    """A sample's PDM score and sub-scores (``waypoints`` None: the answer did not parse, PDMS 0);
    None when ``pdm`` is None or does not know the sample."""
    from ..evaluation.metrics import pdm_entry

    if pdm is None or pdm.inputs(sample_id) is None:
        return None
    return pdm_entry(None if waypoints is None else pdm.score(sample_id, waypoints))


def summarize(label: str, block: int, threshold, model: str, rows: list[dict]) -> dict[str, Any]:
    """Medians over samples + L2 over the parsed ones (metrics.trajectory_metrics) + the PDM score
    means where the rows carry them (``pdm``)."""
    import numpy as np

    from ..evaluation.metrics import pdm_means, trajectory_metrics

    errors = [r["errors"] for r in rows if r["errors"] is not None]
    traj = trajectory_metrics(np.array(errors) if errors else np.zeros((0, 8)))
    return {
        "label": label, "block_size": block, "confidence_threshold": threshold, "model": model,
        "samples": len(rows), "parsed": len(errors), "parse_failures": len(rows) - len(errors),
        **decode_medians(rows),
        "l2_4s_median": _median(e[-1] for e in errors),
        "l2_4s_mean": traj["l2_at_t"]["4s"],
        "per_waypoint": traj["per_waypoint"],
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
    import numpy as np

    from ..evaluation.ground_truth import constant_velocity_waypoints
    from ..evaluation.metrics import pdm_means, trajectory_metrics, waypoint_errors
    from ..outputs.prompts import parse_planning_prompt

    errors, scores = [], []
    for sample, truth in samples:
        telemetry = parse_planning_prompt(prompt_text(sample))
        if telemetry is not None:
            plan = constant_velocity_waypoints(telemetry[1])
            errors.append(waypoint_errors(plan, truth))
            scores.append(pdm_row(pdm, sample.id, plan))
    traj = trajectory_metrics(np.array(errors) if errors else np.zeros((0, 8)))
    return {"label": "CV baseline", "samples": len(errors), "l2_4s_median": _median(e[-1] for e in errors),
            "l2_4s_mean": traj["l2_at_t"]["4s"], "per_waypoint": traj["per_waypoint"], **pdm_means(scores)}


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
    """(answer text, ``parse(text)``, DecodeStats, stage times as a dict) of one sample under one
    configuration (``image_ms`` / ``processor_ms``: reading and encoding the sample, done once)."""
    import time

    import torch

    from ..decoding.sampling import seeded_generators
    from ..profiling import PeakMemory, StageTimes, VisionTimer

    memory = PeakMemory(decoder.device)
    memory.reset()
    t0 = time.perf_counter()
    with torch.no_grad(), VisionTimer(decoder.model, decoder.device) as vision:
        text, s = decode_one(decoder, tokenizer, inputs, settings, seeded_generators([seed], decoder.device)[0])
    t_parse = time.perf_counter()
    parsed = parse(text)
    t_end = time.perf_counter()
    stages = StageTimes(image_ms=image_ms, processor_ms=processor_ms, parse_ms=(t_end - t_parse) * 1e3,
                        total_ms=image_ms + processor_ms + (t_end - t0) * 1e3, memory_kind=memory.kind)
    stages.add_decode(s, vision.ms)
    stages.other_ms = max(0.0, stages.total_ms - stages.stage_sum_ms)
    stages.peak_memory_mb = memory.peak_mb()
    return text, parsed, s, stages.as_dict()


def _decode_fields(s, stages: dict) -> dict[str, Any]:
    return {"forwards": s.forwards, "tokens": s.tokens, "prefill_ms": s.prefill_ms,
            "decode_ms": s.denoise_ms + s.commit_ms, "stages": stages}


def decode_row(decoder, tokenizer, sample_id: str, inputs, truth, settings, seed: int,
               image_ms: float = 0.0, processor_ms: float = 0.0) -> dict[str, Any]:
    """One planning sample under one configuration: its answer, errors against ``truth`` [8, 2], decode
    statistics and stage times."""
    from ..evaluation.metrics import waypoint_errors
    from ..outputs.parsing import parse_waypoints

    text, plan, s, stages = timed_answer(decoder, tokenizer, inputs, settings, seed, parse_waypoints,
                                         image_ms, processor_ms)
    return {"id": sample_id, "text": text, "parse_error": None if plan.ok else str(plan.error),
            "waypoints": plan.waypoints.tolist() if plan.ok else None,
            "errors": waypoint_errors(plan.waypoints, truth).tolist() if plan.ok else None,
            **_decode_fields(s, stages)}


def ground_row(decoder, tokenizer, sample_id: str, inputs, image_size: tuple[int, int], settings, seed: int,
               image_ms: float = 0.0, processor_ms: float = 0.0):
    """(row, BoxParse) of one grounding sample under one configuration: its answer read as boxes on an
    image of ``image_size`` (width, height) pixels, decode statistics and stage times."""
    from ..outputs.parsing import parse_boxes

    text, found, s, stages = timed_answer(decoder, tokenizer, inputs, settings, seed,
                                          lambda answer: parse_boxes(answer, image_size), image_ms, processor_ms)
    row = {"id": sample_id, "text": text, "parse_error": None if found.ok else str(found.error),
           "boxes": [vars(b) for b in found.boxes], "dropped": found.dropped, **_decode_fields(s, stages)}
    return row, found


def print_stage_table(results: list[dict[str, Any]]) -> None:
    """p50 / p95 ms per stage and the memory peak, one row per configuration."""
    from ..profiling import STAGE_LABELS, STAGES

    rows = [r for r in results if r.get("stages")]
    if not rows:
        return
    names = [*STAGES, "total"]
    print("\nper stage, p50 / p95 ms over planning samples (image: reading the files, processor: encoding them, both once "
          "per sample; total: image file -> parsed answer)")
    print(f"{'config':<24}" + "".join(f"{STAGE_LABELS[n] if n != 'total' else 'total':>18}" for n in names)
          + f"{'peak MB':>10}")
    for r in rows:
        ms = r["stages"]["ms"]
        print(f"{r['label']:<24}" + "".join(f"{ms[n]['p50']:>10.1f} /{ms[n]['p95']:>6.1f}" for n in names)
              + f"{r['stages']['peak_memory_mb'] or 0:>10.0f}")


def plot(result: dict[str, Any], path: Path) -> None:
    from ..evaluation.report import WAYPOINT_TIMES_S, pyplot

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.0), dpi=100)
    configs = result["configurations"]
    ar = configs[0]
    b32 = next((c for c in configs if c["block_size"] == SWEEP_BLOCK
                and c["confidence_threshold"] == DEFAULT_THRESHOLD), None)
    drawn = False
    cv = result.get("baseline")
    if cv and cv["per_waypoint"][0] is not None:
        ax1.plot(WAYPOINT_TIMES_S, cv["per_waypoint"], "k--", label=f"CV baseline ({cv['samples']} samples)")
    for c, style in ((ar, "o-"), (b32, "s-")):
        if c is not None and c["per_waypoint"][0] is not None:
            ax1.plot(WAYPOINT_TIMES_S, c["per_waypoint"], style, label=f"{c['label']} ({c['parsed']} parsed)")
            drawn = True
    ax1.set_xlabel("time ahead (s)")
    ax1.set_ylabel("mean L2 error (m)")
    ax1.set_title("Per-waypoint error: AR vs Block-32 (exposure bias)")
    ax1.set_xticks(WAYPOINT_TIMES_S)
    ax1.grid(alpha=0.3)
    if drawn:
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no parsed answers to score", ha="center", va="center", transform=ax1.transAxes)
    labels = [c["label"] for c in configs]
    ax2.barh(labels, [c["ms_per_token"] or 0.0 for c in configs])
    ax2.invert_yaxis()
    ax2.set_xlabel("ms per token (median, prefill excluded)")
    ax2.set_title("Decoding cost per configuration")
    ax2.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


COLUMNS = [("label", "config", ""), ("tokens_per_forward", "tok/fwd", ".2f"),
           ("forwards_per_token", "fwd/tok", ".3f"), ("forwards_per_answer", "fwd/answer", ".1f"),
           ("ms_per_token", "ms/token", ".3f"), ("speedup_vs_ar", "x AR speed", ".2f"),
           ("tokens_per_s", "tokens/s", ".1f"), ("total_ms", "ms/answer", ".1f"),
           ("l2_4s_median", "L2@4s med", ".3f"), ("l2_4s_mean", "L2@4s mean", ".3f"),
           ("l2_4s_vs_ar", "/AR", ".2f"), ("l2_4s_vs_cv", "/CV", ".2f"), ("parse_failures", "parse fail", ""),
           ("pdms", "PDMS", ".3f")]


def pdm_columns() -> list[tuple[str, str, str]]:
    """The PDM table's columns: PDMS and each sub-score (metrics.PDM_SUBSCORES)."""
    from ..evaluation.metrics import PDM_SUBSCORES

    return [("label", "config", ""), ("pdm_samples", "samples", ""), ("pdms", "PDMS", ".3f"),
            *((k, k.upper(), ".3f") for k in PDM_SUBSCORES)]


GROUNDING_COLUMNS = [("label", "config", ""), ("samples", "samples", ""), ("parse_failures", "parse fail", ""),
                     ("ap", "AP", ".3f"), ("ap50", "AP50", ".3f"), ("ap75", "AP75", ".3f"),
                     ("vehicles_ap", "vehicles AP", ".3f"), ("vehicles_ap50", "vehicles AP50", ".3f"), ("ar1", "AR@1", ".3f"),
                     ("ar10", "AR@10", ".3f"), ("ar100", "AR@100", ".3f"), ("tokens_per_forward", "tok/fwd", ".2f"),
                     ("tokens_per_answer", "tokens/answer", ".0f"), ("ms_per_token", "ms/token", ".3f")]


def print_grounding_tables(results: list[dict[str, Any]]) -> None:
    """COCO scores of the grounding answers per configuration, then AP@[.5:.95] per class with ground truth."""
    from .common import format_table

    rows = [{"label": r["label"], **r["grounding"], **r["grounding"]["coco"],
             **{f"vehicles_{k}": r["grounding"]["coco"]["vehicles"][k] for k in ("ap", "ap50")}} for r in results]
    coco = results[0]["grounding"]["coco"]
    print(f"\ngrounding answers: COCO AP by {coco['library']} over {coco['images']} images, {coco['truth_boxes']} "
          "ground-truth boxes (unparsed answers score no box; no answer gives a score: every box ranks as 1.0, "
          "ties in sample order; vehicles: " + "/".join(coco["vehicles"]["classes"]) + " as one class); tok/fwd and "
          "ms/token: medians over these answers")
    print(format_table([{k: "-" if v is None else v for k, v in r.items()} for r in rows], GROUNDING_COLUMNS))
    classes = [c for c, v in coco["per_class"].items() if v["truth"]]
    if classes:
        print("\nAP@[.5:.95] per class (ground-truth boxes): "
              + ", ".join(f"{c} ({coco['per_class'][c]['truth']})" for c in classes))
        per_class = [{"label": r["label"], **{c: r["grounding"]["coco"]["per_class"][c]["ap"] for c in classes}}
                     for r in results]
        print(format_table([{k: "-" if v is None else v for k, v in r.items()} for r in per_class],
                           [("label", "config", ""), *((c, c, ".3f") for c in classes)]))


def run(args) -> int:
    import platform

    import torch

    from ..config import ConfigError
    from ..decoding import make_decoder
    from ..evaluation.detection import DetectionImage
    from ..model.checkpoint import load_checkpoint
    from ..model.prompt_encoding import encode_prompts
    from ..utils.atomic import atomic_directory, atomic_write_json
    from .common import apply_threads, cpu_name, format_table

    if not args.model:
        raise ConfigError("--data needs --model (the block-diffusion checkpoint)")
    if any(b < 2 for b in args.block_sizes):
        raise ConfigError("--block-sizes: give B >= 2 (the AR model is the B = 1 row)")
    if any(not 0.0 <= t <= 1.0 for t in args.thresholds):
        raise ConfigError("--thresholds: each must be in [0, 1]")
    out_dir = Path(args.out)
    if out_dir.exists() and not args.overwrite:
        raise ConfigError(f"--out {out_dir} already exists (use --overwrite to replace it)")
    samples, grounding, skipped = bench_samples(args.data, args.data_root, args.limit, args.every, tasks=args.tasks,
                                                allow_absolute_paths=args.allow_absolute_image_paths)
    if grounding:
        try:
            import pycocotools  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"--data has {len(grounding)} grounding samples: scoring them needs pycocotools "
                              f"({exc}; pinned in requirements/core.txt), or bench --tasks planning") from None
    from ..sim.pdm_scenes import DataSetPdm
    try:
        pdm = DataSetPdm.for_data(args.data)
    except ValueError as exc:
        raise ConfigError(f"--data: {exc}") from exc
    from . import bench_candidates
    candidates = bench_candidates.candidate_settings(args)
    if candidates is not None and (pdm is None or not samples):
        raise ConfigError("--candidates: the selection comparison needs planning samples of a demo-world data set "
                          "(a wam-diff2 synth folder, manifest.json beside --data)")
    apply_threads(args)

    overrides = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else None
    from ..data.samples import SampleError, load_images
    images, image_ms, truth_boxes = {}, {}, {}
    for s in [*(s for s, _ in samples), *grounding]:
        try:
            t = time.perf_counter()
            images[s.id] = load_images(s)
            image_ms[s.id] = (time.perf_counter() - t) * 1e3
        except SampleError as exc:
            skipped.append({"id": s.id, "reason": str(exc)})
    truth_dropped = 0                     # ground-truth objects no box could be made of (bench.json)
    for s in grounding:
        truth = grounding_truth(s, images[s.id][0]) if s.id in images else None
        if isinstance(truth, str):
            skipped.append({"id": s.id, "reason": truth})
        elif truth is not None:
            truth_boxes[s.id], truth_dropped = truth.boxes, truth_dropped + truth.dropped
    samples = [(s, t) for s, t in samples if s.id in images]
    grounding = [s for s in grounding if s.id in truth_boxes]
    if not samples and not grounding:
        raise ConfigError(f"--data {args.data}: no planning or grounding sample has readable images (and, for "
                          "grounding, a ground truth of boxes)")
    # every sample the benchmark decodes, planning first: (sample, task, ground truth)
    work = [*((s, "planning", t) for s, t in samples), *((s, "grounding", truth_boxes[s.id]) for s in grounding)]

    models = {"diffusion": args.model, "ar": args.ar_model or args.model}
    loaded_by_path: dict[str, Any] = {}
    runs = []

    def decode(r, i: int, seed: int, sample_id: str | None = None):
        """Row (and for grounding, its DetectionImage) of work item ``i`` under run ``r``."""
        sample, task, truth = work[i]
        common = dict(image_ms=image_ms[sample.id], processor_ms=r.processor_ms[i])
        if task == "planning":
            return decode_row(r.decoder, r.loaded.tokenizer, sample_id or sample.id, r.encoded[i], truth,
                              r.settings, seed, **common), None
        row, found = ground_row(r.decoder, r.loaded.tokenizer, sample_id or sample.id, r.encoded[i],
                                images[sample.id][0].size, r.settings, seed, **common)
        return row, DetectionImage(sample.id, truth, found)

    for label, block, threshold in configurations(args.block_sizes, args.thresholds):
        path = models["ar" if block == 1 else "diffusion"]
        if path not in loaded_by_path:
            loaded = load_checkpoint(path, device=args.device, dtype=args.dtype, overrides=overrides,
                                     quantization=args.quantization)
            encoded, processor_ms = [], []
            for s, _, _ in work:
                t = time.perf_counter()
                encoded.append(encode_prompts(loaded.processor, [s.prompt_messages], [images[s.id]],
                                              min_pixels=args.min_pixels, max_pixels=args.max_pixels).to(loaded.device))
                processor_ms.append((time.perf_counter() - t) * 1e3)
            loaded_by_path[path] = (loaded, make_decoder(loaded.model, loaded.config), encoded, processor_ms)
        loaded, decoder, encoded, processor_ms = loaded_by_path[path]
        settings = loaded.config.with_settings(block_size=block, denoising_steps=block,
                                               **({} if threshold is None else {"confidence_threshold": threshold})
                                               ).settings
        r = SimpleNamespace(label=label, block=block, threshold=threshold, path=path, loaded=loaded,
                            decoder=decoder, encoded=encoded, settings=settings, processor_ms=processor_ms)
        decode(r, 0, args.seed, "warm-up")
        runs.append(r)
    # samples outer, configurations inner: a change in the machine's load while the benchmark runs
    # reaches every configuration alike instead of skewing the ratios between them
    rows: list[list[dict]] = [[] for _ in runs]
    ground_rows: list[list[dict]] = [[] for _ in runs]
    detections: list[list] = [[] for _ in runs]
    for i, (sample, task, _) in enumerate(work):
        log.info("bench sample %d/%d (%s, %s)", i + 1, len(work), task, sample.id)
        for k, r in enumerate(runs):
            row, detection = decode(r, i, args.seed + i)
            if detection is None:
                rows[k].append(row)
            else:
                ground_rows[k].append(row)
                detections[k].append(detection)
    for config_rows in rows:
        for row in config_rows:
            row["pdm"] = pdm_row(pdm, row["id"], row["waypoints"])
    results = [summarize(r.label, r.block, r.threshold, str(r.path), config_rows) for r, config_rows in zip(runs, rows)]
    for result, config_rows, config_detections in zip(results, ground_rows, detections):
        result["grounding"] = summarize_grounding(config_rows, config_detections)

    selection = None
    if candidates is not None:
        loaded, decoder, encoded, _ = loaded_by_path[models["diffusion"]]
        own = loaded.config.settings
        selection = bench_candidates.compare_selection(
            decoder, loaded.tokenizer, own, samples, encoded[:len(samples)], pdm, candidates,
            f"{args.model}, its own settings: B = {own.block_size}, threshold {own.confidence_threshold:g}")
    baseline = constant_velocity_baseline(samples, pdm)
    compare(results, baseline)
    loaded = next(iter(loaded_by_path.values()))[0]
    device = loaded.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"device {device} ({device_name}, {torch.get_num_threads()} threads), {loaded.dtype}, "
          f"quantization {args.quantization}, {len(samples)} planning and {len(grounding)} grounding samples, model {args.model}, AR model "
          f"{models['ar']}" + ("" if args.ar_model else " (the diffusion model at B = 1)"))
    if samples:
        print("planning answers, medians over samples; ms/token and tokens/s: decoding only (denoise + commit), "
              "prefill excluded; ms/answer includes the prefill; L2 at 4 s over parsed answers (m)"
              + ("; AP, AP50: the grounding answers' COCO AP (below)" if grounding else ""))
        columns = COLUMNS + ([("ap", "AP", ".3f"), ("ap50", "AP50", ".3f")] if grounding else [])
        table = [{**r, **({"ap": r["grounding"]["coco"]["ap"], "ap50": r["grounding"]["coco"]["ap50"]}
                          if grounding else {})} for r in results]
        print(format_table([{k: "-" if v is None else v for k, v in r.items()} for r in table], columns))
    if baseline["samples"]:
        print(f"constant-velocity baseline ({baseline['samples']} samples): L2@4s median "
              f"{baseline['l2_4s_median']:.3f} m, mean {baseline['l2_4s_mean']:.3f} m; /AR and /CV: the row's "
              "mean L2@4s over the AR row's and the baseline's; x AR speed: AR ms/token over the row's")
    if grounding:
        print_grounding_tables(results)

    if results[0]["pdm_samples"]:
        print(f"\nPDM score (NAVSIM v1; demo world, the expert as reference) over {results[0]['pdm_samples']} "
              "samples: PDMS mean (an unparsed answer scores 0), sub-scores over the parsed answers")
        print(format_table([{k: "-" if v is None else v for k, v in r.items()} for r in results + [baseline]],
                           pdm_columns()))
    if selection is not None:
        bench_candidates.print_selection(selection)
    print_stage_table(results)

    payload = {"device": str(device), "device_name": device_name, "threads": torch.get_num_threads(),
               "dtype": str(loaded.dtype), "quantization": args.quantization, "torch": torch.__version__, "platform": platform.platform(),
               "model": str(args.model), "ar_model": str(models["ar"]), "data": str(args.data),
               "samples": len(samples), "grounding_samples": len(grounding),
               "grounding_truth_dropped": truth_dropped, "skipped": skipped,
               "timing": "ms_per_token and tokens_per_s: denoise + commit time (prefill excluded); "
                         "total_ms: prefill + decoding; tokens exclude EOS; forwards exclude the prefill",
               "grounding": "per configuration, its grounding answers (null without grounding samples): COCO "
                            "scores by pycocotools (coco), parse failures and decoding medians over them",
               "baseline": baseline, "configurations": results, "selection": selection}
    with atomic_directory(out_dir, overwrite=True) as tmp:
        atomic_write_json(tmp / "bench.json", payload)
        plot(payload, tmp / "bench.png")
    print(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'}")
    return 0
