"""``wam-diff2 bench --model CKPT --data SAMPLES.json``: AR vs block diffusion on planning and grounding samples.

One run, side by side: the AR model (``--ar-model``, default ``--model`` decoded at B = 1) and the
diffusion model at each ``--block-sizes`` (threshold 0.9) and at B = 32 for each ``--thresholds``
(``benchmark/model_comparison.py`` measures; the tables' notes say what each figure is over). Planning
answers are scored by L2 against the sample's answer; grounding answers (``bbox_2d`` prompts) by COCO AP
(``evaluation/detection.py``); on a ``wam-diff2 synth`` data set every configuration also gets the PDM
score, and ``--candidates N`` the selection comparison (``bench_candidates.py``). Other samples are
``skipped`` in bench.json. Writes ``bench.json`` and ``bench.png`` (per-waypoint error of AR vs Block-32,
ms/token per configuration) into ``--out``, atomically.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..benchmark.model_comparison import (DEFAULT_THRESHOLD, SWEEP_BLOCK, TASKS, bench_samples, compare_models,
                                          read_sample_images)
from ..config import ConfigError
from ..evaluation.metrics import PDM_SUBSCORES, WAYPOINT_TIMES_S
from . import bench_candidates
from .common import (add_candidate_arguments, add_sample_path_arguments, apply_threads, candidate_settings,
                     config_errors, format_table, hardware_name)


def add_arguments(p) -> None:
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
    add_candidate_arguments(g)
    g.add_argument("--out", default="bench_models", help="folder for bench.json and bench.png (written atomically)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing --out")


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
    from ..evaluation.report_plots import per_waypoint_axes, pyplot, save

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
    per_waypoint_axes(ax1, "Per-waypoint error: AR vs Block-32 (exposure bias)", drawn, "no parsed answers to score")
    labels = [c["label"] for c in configs]
    ax2.barh(labels, [c["ms_per_token"] or 0.0 for c in configs])
    ax2.invert_yaxis()
    ax2.set_xlabel("ms per token (median, prefill excluded)")
    ax2.set_title("Decoding cost per configuration")
    ax2.grid(alpha=0.3, axis="x")
    save(fig, path)


COLUMNS = [("label", "config", ""), ("tokens_per_forward", "tok/fwd", ".2f"),
           ("forwards_per_token", "fwd/tok", ".3f"), ("forwards_per_answer", "fwd/answer", ".1f"),
           ("ms_per_token", "ms/token", ".3f"), ("speedup_vs_ar", "x AR speed", ".2f"),
           ("tokens_per_s", "tokens/s", ".1f"), ("total_ms", "ms/answer", ".1f"),
           ("l2_4s_median", "L2@4s med", ".3f"), ("l2_4s_mean", "L2@4s mean", ".3f"),
           ("l2_4s_vs_ar", "/AR", ".2f"), ("l2_4s_vs_cv", "/CV", ".2f"), ("parse_failures", "parse fail", ""),
           ("pdms", "PDMS", ".3f")]


PDM_COLUMNS = [("label", "config", ""), ("pdm_samples", "samples", ""), ("pdms", "PDMS", ".3f"),
               *((k, k.upper(), ".3f") for k in PDM_SUBSCORES)]


GROUNDING_COLUMNS = [("label", "config", ""), ("samples", "samples", ""), ("parse_failures", "parse fail", ""),
                     ("ap", "AP", ".3f"), ("ap50", "AP50", ".3f"), ("ap75", "AP75", ".3f"),
                     ("vehicles_ap", "vehicles AP", ".3f"), ("vehicles_ap50", "vehicles AP50", ".3f"), ("ar1", "AR@1", ".3f"),
                     ("ar10", "AR@10", ".3f"), ("ar100", "AR@100", ".3f"), ("tokens_per_forward", "tok/fwd", ".2f"),
                     ("tokens_per_answer", "tokens/answer", ".0f"), ("ms_per_token", "ms/token", ".3f")]


def print_grounding_tables(results: list[dict[str, Any]]) -> None:
    """COCO scores of the grounding answers per configuration, then AP@[.5:.95] per class with ground truth."""
    rows = [{"label": r["label"], **r["grounding"], **r["grounding"]["coco"],
             **{f"vehicles_{k}": r["grounding"]["coco"]["vehicles"][k] for k in ("ap", "ap50")}} for r in results]
    coco = results[0]["grounding"]["coco"]
    print(f"\ngrounding answers: COCO AP by {coco['library']} over {coco['images']} images, {coco['truth_boxes']} "
          "ground-truth boxes (unparsed answers score no box; boxes rank by the decoder's confidence in their "
          "coordinates; vehicles: " + "/".join(coco["vehicles"]["classes"]) + " as one class); tok/fwd and "
          "ms/token: medians over these answers")
    print(format_table(rows, GROUNDING_COLUMNS))
    classes = [c for c, v in coco["per_class"].items() if v["truth"]]
    if classes:
        print("\nAP@[.5:.95] per class (ground-truth boxes): "
              + ", ".join(f"{c} ({coco['per_class'][c]['truth']})" for c in classes))
        per_class = [{"label": r["label"], **{c: r["grounding"]["coco"]["per_class"][c]["ap"] for c in classes}}
                     for r in results]
        print(format_table(per_class, [("label", "config", ""), *((c, c, ".3f") for c in classes)]))


def run(args) -> int:
    import platform

    import torch

    from ..utils.atomic import atomic_directory, atomic_write_json

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
    with config_errors("--data: "):
        pdm = DataSetPdm.for_data(args.data)
    candidates = candidate_settings(args)
    if candidates is not None and (pdm is None or not samples):
        raise ConfigError("--candidates: the selection comparison needs planning samples of a demo-world data set "
                          "(a wam-diff2 synth folder, manifest.json beside --data)")
    apply_threads(args)

    data = read_sample_images(samples, grounding, skipped)
    samples, grounding = data.samples, data.grounding
    if not samples and not grounding:
        raise ConfigError(f"--data {args.data}: no planning or grounding sample has readable images (and, for "
                          "grounding, a ground truth of boxes)")
    models = {"diffusion": args.model, "ar": args.ar_model or args.model}
    found = compare_models(data, models, block_sizes=args.block_sizes, thresholds=args.thresholds, seed=args.seed,
                           device=args.device, dtype=args.dtype, quantization=args.quantization,
                           max_new_tokens=args.max_new_tokens, min_pixels=args.min_pixels, max_pixels=args.max_pixels,
                           pdm=pdm)
    results, baseline, loaded = found.results, found.baseline, found.loaded
    selection = None
    if candidates is not None:
        diffusion, decoder, encoded, _ = found.by_path[models["diffusion"]]
        own = diffusion.config.settings
        selection = bench_candidates.compare_selection(
            decoder, diffusion.tokenizer, own, samples, encoded[:len(samples)], pdm, candidates,
            f"{args.model}, its own settings: B = {own.block_size}, threshold {own.confidence_threshold:g}")
    device = loaded.device
    device_name = hardware_name(device)
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
        print(format_table(table, columns))
    if baseline["samples"]:
        print(f"constant-velocity baseline ({baseline['samples']} samples): L2@4s median "
              f"{baseline['l2_4s_median']:.3f} m, mean {baseline['l2_4s_mean']:.3f} m; /AR and /CV: the row's "
              "mean L2@4s over the AR row's and the baseline's; x AR speed: AR ms/token over the row's")
    if grounding:
        print_grounding_tables(results)

    if results[0]["pdm_samples"]:
        print(f"\nPDM score (NAVSIM v1; demo world, the expert as reference) over {results[0]['pdm_samples']} "
              "samples: PDMS mean (an unparsed answer scores 0), sub-scores over the parsed answers")
        print(format_table(results + [baseline], PDM_COLUMNS))
    if selection is not None:
        bench_candidates.print_selection(selection)
    print_stage_table(results)

    payload = {"device": str(device), "device_name": device_name, "threads": torch.get_num_threads(),
               "dtype": str(loaded.dtype), "quantization": args.quantization, "torch": torch.__version__, "platform": platform.platform(),
               "model": str(args.model), "ar_model": str(models["ar"]), "data": str(args.data),
               "samples": len(samples), "grounding_samples": len(grounding),
               "grounding_truth_dropped": data.truth_dropped, "skipped": skipped,
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
