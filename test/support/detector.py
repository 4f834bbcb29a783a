"""Tiny checkpoints that really answer a grounding prompt with boxes: the only kind of model that lets a test
follow a box from the decoder to the outputs (random tiny checkpoints never write a parseable box).

    ar, samples = train_box_memorizer(tmp_path / "ar")                       # B = 1
    block32 = train_block32_memorizer(ar, samples, tmp_path / "block32")     # B = 32
    record, rgb, truth = memorized_sample(samples)                           # what they answer

``ar`` is the tiny stock (AR) Qwen3-VL trained by the shipped ``ar_pretrain`` recipe on one grounding
sample of the demo world until it answers it word for word (loss ~0 by step 30; ~5 s of one CPU thread).
``block32`` is that model converted (``wam-diff2 convert``) and trained by the shipped ``block32`` recipe on
the same sample until it answers it in one denoising step per block (~20 s). ``samples`` is a JSON file
holding that sample alone.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import REPO_ROOT

AR_STEPS = 50
BLOCK32_STEPS = 150
LR = 3e-3


def grounding_sample(data_dir: Path) -> dict:
    """The first demo-world grounding sample with two or more boxes among ``data_dir``'s train / val sets."""
    for name in ("train.json", "val.json"):
        for record in json.loads((data_dir / name).read_text()):
            answer = record["conversations"][1]["value"]
            if answer.startswith("[") and answer.count("bbox_2d") >= 2:
                return record
    raise AssertionError(f"{data_dir}: no grounding sample with two boxes")


def memorized_sample(samples: Path):
    """(the sample's record, its image as an [H, W, 3] uint8 RGB array, its truth boxes in source pixels)."""
    import numpy as np
    from PIL import Image

    from wam_diff2_core.outputs.parsing import parse_boxes

    record = json.loads(samples.read_text())[0]
    rgb = np.asarray(Image.open(samples.parent / record["image"][0]).convert("RGB"))
    truth = parse_boxes(record["conversations"][1]["value"], (rgb.shape[1], rgb.shape[0]))
    assert truth.ok and len(truth.boxes) >= 2, truth
    return record, rgb, truth.boxes


def _train(recipe: str, start: Path, batch: Path, out: Path, steps: int) -> Path:
    """``training/<recipe>.yaml`` from ``start`` on ``batch`` (one batch of 4 samples) for ``steps`` steps."""
    from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
    from wam_diff2_core.trainer.recipes import run_stage
    from wam_diff2_core.trainer.training_config import load_training_config

    overrides = {"model.path": str(start), "data.train_file": str(batch), "data.data_root": str(batch.parent),
                 "data.min_pixels": TINY_MIN_PIXELS, "data.max_pixels": TINY_MAX_PIXELS,
                 "train.global_batch_size": 4, "train.micro_batch_size": 4, "train.max_steps": steps,
                 "optim.lr": LR, "optim.merger_lr": LR, "optim.vision_lr": LR, "output.dir": str(out),
                 "output.save_every_steps": 0}
    return run_stage(load_training_config(REPO_ROOT / "training" / f"{recipe}.yaml", overrides))


def _batch(samples: Path) -> Path:
    return samples.parent / "grounding_x4.json"


def train_box_memorizer(root: Path) -> tuple[Path, Path]:
    """(AR checkpoint, samples file): see the module doc."""
    from wam_diff2_core.cli import main
    from wam_diff2_core.model.tiny import build_tiny_checkpoint

    data = root / "synth"
    assert main(["synth", str(data), "--episodes", "1", "--frames", "2", "--frame-stride", "20", "--formats", "json",
                 "--vqa-per-frame", "0", "--no-progress"]) == 0
    record = grounding_sample(data)
    samples = data / "grounding.json"
    samples.write_text(json.dumps([record]))
    # one batch of four copies (sample ids must be unique)
    _batch(samples).write_text(json.dumps([dict(record, id=f"{record['id']}-{i}") for i in range(4)]))
    start = build_tiny_checkpoint(root / "ar", seed=0, diffusion=False)
    return _train("ar_pretrain", start, _batch(samples), root / "run", AR_STEPS), samples


def train_block32_memorizer(ar: Path, samples: Path, root: Path) -> Path:
    """The Block-32 checkpoint: see the module doc."""
    from wam_diff2_core.model.ar_to_diffusion import convert_to_diffusion

    start = convert_to_diffusion(ar, root / "init", block_size=32)
    return _train("block32", start, _batch(samples), root / "run", BLOCK32_STEPS)
