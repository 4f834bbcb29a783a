"""Validation loss with fixed noise: the training objective on a data file, reproducible.

Each sample is noised ``rounds`` times from fixed seeds, so two checkpoints are compared on
exactly the same masked inputs (training losses per step are noisy by design). With a
teacher, the loss is the distillation objective of ``settings`` (kd_ratio, divergence, tau).

    loss = validation_loss(load_checkpoint("runs/block4/final"), "val.json", block_size=4)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS
from .training_data import SampleDataset
from .losses import DiffusionObjective, LossSettings, objective_inputs
from .noise import build_batch


@dataclass
class ValidationResult:
    loss: float       # the objective (CE, or the kd_ratio mix with a teacher), mean per sample
    ce: float
    kd: float
    overlap: float    # rho_K over masked positions (with a teacher)
    samples: int      # samples scored (each ``rounds`` times)


@torch.no_grad()
def validation_loss(loaded, data_file: str | Path, *, block_size: int, data_root: str | Path = ".",
                    min_pixels: int | None = None, max_pixels: int | None = None, rounds: int = 4,
                    seed: int = 1234, micro_batch_size: int = 8, teacher=None, teacher_block_size: int = 0,
                    settings: LossSettings | None = None, limit: int | None = None,
                    allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS) -> ValidationResult:
    """Mean per-sample loss (the objective's averaging) over ``rounds`` fixed noise draws (of the first
    ``limit`` samples, default all)."""
    settings = settings or LossSettings(kd_ratio=1.0 if teacher is not None else 0.0)
    pad_multiple = math.lcm(block_size, teacher_block_size) if teacher is not None and block_size > 1 else block_size
    dataset = SampleDataset(data_file, loaded.processor, eos_token_id=loaded.config.eos_token_id,
                            data_root=data_root, min_pixels=min_pixels, max_pixels=max_pixels,
                            block_size=block_size, pad_multiple=pad_multiple, on_error="fail",
                            allow_absolute_paths=allow_absolute_paths)
    examples = [dataset[i] for i in range(len(dataset) if limit is None else min(limit, len(dataset)))]
    for i, example in enumerate(examples):
        example.position = i
    objective = DiffusionObjective(loaded.model, settings)
    was_training = loaded.model.training
    loaded.model.eval()
    sums = torch.zeros(5, dtype=torch.float64)   # total, ce, kd, overlap, counted positions
    try:
        for noise_round in range(rounds):
            for start in range(0, len(examples), micro_batch_size):
                chunk = examples[start:start + micro_batch_size]
                batch = build_batch(chunk, block_size=block_size, mask_token_id=loaded.config.mask_token_id,
                                    eos_token_id=loaded.config.eos_token_id,
                                    rope_index=loaded.model.model.get_rope_index, seed=seed,
                                    pad_multiple=pad_multiple, noise_round=noise_round).to(loaded.device)
                out = objective(**objective_inputs(batch, teacher, teacher_block_size))
                sums += torch.tensor([float(out["total"]), float(out["ce"]), float(out["kd"]),
                                      float(out["overlap"]), batch.num_targets], dtype=torch.float64)
    finally:
        loaded.model.train(was_training)
    n = rounds * len(examples)
    return ValidationResult(loss=float(sums[0]) / n, ce=float(sums[1]) / n, kd=float(sums[2]) / n,
                            overlap=float(sums[3] / max(float(sums[4]), 1.0)), samples=len(examples))
