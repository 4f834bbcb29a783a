"""Batch inference over the authors' sample format (JSON list or JSONL).

    wam-diff2 infer --model CKPT --input eval.json --output preds.json [--data-root DIR]
    torchrun --nproc-per-node 8 -m wam_diff2_core.cli infer --model CKPT --input eval.json --output preds.json

Each output record: ``{id, line, prediction, ground_truth, waypoints | boxes, parse_error, stats}``,
or ``{id, line, error}`` when the sample could not be run (never fatal: a broken JSONL line, a
record that is not an object or has fields of the wrong type, an id used twice (every record
of it), an image that is missing, undecodable or over ``--max-decoded-pixels`` /
``--max-decoded-bytes``). Records are appended to ``OUTPUT.partial.jsonl`` as they finish; the
final file is written atomically at the end; ``--resume`` skips the ids already in the partial
file. Under torchrun each rank decodes a shard and rank 0 merges them in input order. The exit
status is 1 when every sample failed. ``OUTPUT.lock`` is held while the run writes: a second run
with the same output stops at once, naming the first's PID.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from ..outputs.parsing import parse_boxes, parse_waypoints, token_char_confidences
from ..profiling import PeakMemory, StageTimes, stage_summary, stage_table, timed_decode
from .common import (add_decoding_arguments, add_engine_arguments, add_image_limit_arguments, add_model_arguments,
                     add_sample_path_arguments, apply_threads, config_errors, decoding_overrides, engine_settings,
                     image_limits)

HELP = "decode a JSON/JSONL file of samples and write predictions"
log = logging.getLogger(__name__)
PARSERS = ("auto", "waypoints", "boxes", "none")


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--input", required=True, help="samples (JSON list or JSONL)")
    p.add_argument("--output", required=True, help="predictions (.json list or .jsonl)")
    add_sample_path_arguments(p)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--parse", default="auto", choices=PARSERS,
                   help="how to read answers: auto = waypoints for planning prompts, boxes for bbox_2d prompts")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (per sample: seed + index)")
    p.add_argument("--resume", action="store_true", help="continue from OUTPUT.partial.jsonl")
    add_image_limit_arguments(p)
    add_decoding_arguments(p)
    add_engine_arguments(p)


def _parsed_fields(text: str, sample, images, mode: str, char_confidence=lambda: None) -> dict:
    """The parsed answer's fields; ``char_confidence()``: the answer's per-character confidences (boxes only)."""
    if mode == "auto":
        prompt = json.dumps(sample.raw.get("conversations", ""))
        mode = "waypoints" if "waypoints" in prompt else "boxes" if "bbox_2d" in prompt else "none"
    if mode == "waypoints":
        r = parse_waypoints(text)
        return {"waypoints": r.waypoints.tolist() if r.ok else None, "parse_error": None if r.ok else str(r.error)}
    if mode == "boxes":
        if not images:
            return {"boxes": None, "parse_error": "no image to map boxes onto"}
        r = parse_boxes(text, images[0].size, char_confidence=char_confidence())
        return {"boxes": [vars(b) for b in r.boxes], "parse_error": None if r.ok else str(r.error)}
    return {}


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from ..config import ConfigError
    from ..data.samples import Sample, SampleError, iter_samples, load_images
    from ..decoding import make_decoder
    from ..model.checkpoint import load_checkpoint
    from ..model.devices import rank_device
    from ..model.prompt_encoding import encode_prompts, pixel_size
    from ..utils.atomic import atomic_write_json, atomic_write_text

    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    device = args.device
    if world > 1:
        device = rank_device(args.device, int(os.environ.get("LOCAL_RANK", 0)))
        if not torch.distributed.is_initialized():
            backend = {"cuda": "nccl", "npu": "hccl"}.get(device.split(":")[0], "gloo")
            torch.distributed.init_process_group(backend)

    try:
        limits = image_limits(args)
    except ValueError as exc:
        name, _, why = str(exc).partition(": ")
        raise ConfigError(f"--{name.replace('_', '-')}: {why}") from None
    output = Path(args.output)
    with _output_lock(output, rank, world):      # one run writes OUTPUT (and its partial files) at a time
        data_root = Path(args.data_root) if args.data_root else Path(args.input).parent
        with config_errors("--input: "):    # the file as a whole: unreadable, or a JSON list that does not parse
            items = list(iter_samples(args.input, data_root,      # Sample, or the SampleError of a record
                                      allow_absolute_paths=args.allow_absolute_image_paths))
        refused = [s for s in items if isinstance(s, SampleError)]
        if refused and rank == 0:
            for exc in refused:
                log.warning("refused %s", exc)
            log.warning("%d of %d records refused up front (each gets its error record)", len(refused), len(items))
        shard = [(i, s) for i, s in enumerate(items) if i % world == rank and isinstance(s, Sample)]
        partial = output.with_name(output.name + (f".rank{rank}" if world > 1 else "") + ".partial.jsonl")
        done: dict[str, dict] = {}        # sample id -> its record (ids of usable samples are unique)
        if args.resume and partial.exists():
            for line in partial.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    done[rec["id"]] = rec
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a kill: redo that sample
            log.info("resuming: %d samples already decoded", len(done))
        # Rewrite the partial file (without --resume: empty) without any torn last line before appending.
        atomic_write_text(partial, "".join(json.dumps(r) + "\n" for r in done.values()))

        apply_threads(args)
        engine = engine_settings(args)
        loaded = load_checkpoint(args.model, device=device, dtype=args.dtype, overrides=decoding_overrides(args),
                                 quantization=engine.quantization)
        with config_errors("--min-pixels/--max-pixels: "):  # a bad pixel budget is the run's error, not every sample's
            pixel_size(args.min_pixels, args.max_pixels, loaded.processor.image_processor.size)
        decoder = make_decoder(loaded.model, loaded.config, engine=engine)
        tokenizer = loaded.tokenizer
        todo = [(i, s) for i, s in shard if s.id not in done]
        bar = tqdm(total=len(shard), initial=len(shard) - len(todo), desc=f"infer B={loaded.config.block_size}",
                   disable=rank != 0, unit="sample")
        batch_stages = []                 # StageTimes of every decoded batch (the stage table at the end)
        with partial.open("a") as sink:
            for start in range(0, len(todo), args.batch_size):
                batch = todo[start:start + args.batch_size]
                records, ready = [], []
                t_batch = time.perf_counter()
                stages = StageTimes()
                for i, s in batch:
                    try:
                        ready.append((i, s, load_images(s, limits)))
                    except SampleError as exc:
                        records.append(_error_record(exc))
                stages.image_ms = (time.perf_counter() - t_batch) * 1e3
                if ready:
                    memory = PeakMemory(loaded.device)
                    memory.reset()
                    stages.memory_kind = memory.kind
                    records += _decode(ready, loaded, decoder, tokenizer, args, encode_prompts, stages)
                    stages.finish((time.perf_counter() - t_batch) * 1e3, memory)
                    batch_stages.append(stages)
                for rec in records:
                    sink.write(json.dumps(rec) + "\n")
                    done[rec["id"]] = rec
                sink.flush()
                bar.update(len(batch))
        bar.close()

        if world > 1:
            torch.distributed.barrier()
            if rank != 0:
                return 0
            parts = [output.with_name(output.name + f".rank{r}.partial.jsonl") for r in range(world)]
            for part in parts[1:]:
                done.update((rec["id"], rec) for rec in map(json.loads, part.read_text().splitlines()))
        ordered = [_error_record(s) if isinstance(s, SampleError) else done[s.id] for s in items
                   if isinstance(s, SampleError) or s.id in done]
        if output.suffix == ".jsonl":
            atomic_write_text(output, "".join(json.dumps(r) + "\n" for r in ordered))
        else:
            atomic_write_json(output, ordered)
        for part in ([partial] if world == 1 else parts):
            part.unlink(missing_ok=True)
        failed = sum("error" in r for r in ordered)
        unparsed = sum(bool(r.get("parse_error")) for r in ordered)
        print(f"wrote {len(ordered)} predictions to {output} ({failed} failed samples, {unparsed} unparsed answers)")
        summary = stage_summary(batch_stages)
        if summary is not None:
            print(f"per stage, over {summary['frames']} batches of up to {args.batch_size} (image = reading the image "
                  "files; this rank):")
            print("\n".join(stage_table(summary, total_label="batch -> records")))
        if ordered and failed == len(ordered):
            print(f"wam-diff2 infer: error: every sample failed; the first: {ordered[0]['error']}", file=sys.stderr)
            return 1
        return 0


@contextlib.contextmanager
def _output_lock(output: Path, rank: int, world: int):
    """Rank 0 holds OUTPUT.lock while every rank writes; the other ranks start writing only once it does."""
    import torch

    from ..utils.run_lock import RunLock

    with RunLock(output.with_name(output.name + ".lock"), "output") if rank == 0 else contextlib.nullcontext():
        if world > 1:
            torch.distributed.barrier()
        yield


def _error_record(exc) -> dict:
    return {"id": exc.sample_id, "line": exc.line, "error": str(exc)}


def _decode(ready, loaded, decoder, tokenizer, args, encode_prompts, stages: StageTimes) -> list[dict]:
    """Decode a batch; its stage times are added to ``stages``."""
    from ..decoding.sampling import seeded_generators

    t = time.perf_counter()
    try:
        inputs = encode_prompts(loaded.processor, [s.prompt_messages for _, s, _ in ready],
                                [ims for _, _, ims in ready], min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    except (ValueError, TypeError) as exc:
        if len(ready) == 1:
            return [_error_record(ready[0][1].error(f"cannot encode ({exc})"))]
        # One bad sample must not sink the batch: retry one by one.
        return [rec for item in ready
                for rec in _decode([item], loaded, decoder, tokenizer, args, encode_prompts, stages)]
    stages.processor_ms += (time.perf_counter() - t) * 1e3
    gens = seeded_generators((args.seed + i for i, _, _ in ready), decoder.device)
    out, texts = timed_decode(decoder, tokenizer, inputs, stages, generators=gens)
    t = time.perf_counter()
    records = []
    for row, ((_, s, ims), text, stats, finished) in enumerate(zip(ready, texts, out.stats, out.finished)):
        rec = {"id": s.id, "line": s.line, "prediction": text, "ground_truth": s.answer, "finished": finished}
        rec.update(_parsed_fields(text, s, ims, args.parse, lambda: token_char_confidences(
            tokenizer, out.sequences[row], out.confidences_of(row), text)))
        rec["stats"] = stats.as_dict()
        records.append(rec)
    stages.parse_ms += (time.perf_counter() - t) * 1e3
    return records
