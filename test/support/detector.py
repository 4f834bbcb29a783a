"""A tiny checkpoint that really answers a grounding prompt with boxes: the only kind of model that lets a
test follow a box from the decoder to the outputs (random tiny checkpoints never write a parseable box).

    checkpoint, samples = train_box_memorizer(tmp_path)

It is the tiny stock (AR) Qwen3-VL trained by the shipped ``ar_pretrain`` recipe on one grounding sample
of the demo world until it answers it word for word (loss ~0 within ~30 steps at this learning rate;
~15 s of one CPU thread). ``samples`` is a JSON file holding that sample alone.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import REPO_ROOT

STEPS = 50
LR = 3e-3


def grounding_sample(data_dir: Path) -> dict:
    """The first demo-world grounding sample with two or more boxes among ``data_dir``'s train / val sets."""
    for name in ("train.json", "val.json"):
        for record in json.loads((data_dir / name).read_text()):
            answer = record["conversations"][1]["value"]
            if answer.startswith("[") and answer.count("bbox_2d") >= 2:
                return record
    raise AssertionError(f"{data_dir}: no grounding sample with two boxes")


def train_box_memorizer(root: Path) -> tuple[Path, Path]:
    """(checkpoint, samples file): see the module doc."""
    from wam_diff2_core.cli import main
    from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build_tiny_checkpoint
    from wam_diff2_core.trainer.recipes import run_stage
    from wam_diff2_core.trainer.training_config import load_training_config

    data = root / "synth"
    assert main(["synth", str(data), "--episodes", "1", "--frames", "2", "--frame-stride", "20", "--formats", "json",
                 "--vqa-per-frame", "0", "--no-progress"]) == 0
    record = grounding_sample(data)
    samples = data / "grounding.json"
    samples.write_text(json.dumps([record]))
    batch = data / "grounding_x4.json"            # one batch of four copies (sample ids must be unique)
    batch.write_text(json.dumps([dict(record, id=f"{record['id']}-{i}") for i in range(4)]))
    start = build_tiny_checkpoint(root / "ar", seed=0, diffusion=False)
    overrides = {"model.path": str(start), "data.train_file": str(batch), "data.data_root": str(data),
                 "data.min_pixels": TINY_MIN_PIXELS, "data.max_pixels": TINY_MAX_PIXELS,
                 "train.global_batch_size": 4, "train.micro_batch_size": 4, "train.max_steps": STEPS,
                 "optim.lr": LR, "optim.merger_lr": LR, "optim.vision_lr": LR, "output.dir": str(root / "run"),
                 "output.save_every_steps": 0}
    final = run_stage(load_training_config(REPO_ROOT / "training" / "ar_pretrain.yaml", overrides))
    return final, samples
