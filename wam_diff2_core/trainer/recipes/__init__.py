"""Training recipes (one per mode) and the runner that chains curriculum stages.

    from wam_diff2_core.trainer.recipes import run
    final_dir = run(load_training_config("training/curriculum.yaml"), resume=False)
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..checkpointing import FINAL
from ..training_config import TrainingConfig
from .distill import DistillRecipe
from .finetune import FinetuneRecipe
from .vision import VisionRecipe

log = logging.getLogger(__name__)

RECIPES = {"finetune": FinetuneRecipe, "distill": DistillRecipe, "vision": VisionRecipe}


def run_stage(cfg: TrainingConfig, *, resume: bool = False) -> Path:
    """setup -> train -> cleanup of one recipe; returns its ``final/`` checkpoint directory."""
    recipe = RECIPES[cfg.recipe](cfg, resume=resume)
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()


def curriculum_stages(cfg: TrainingConfig) -> list[TrainingConfig]:
    """One finetune config per block size: stage k starts from stage k-1's ``final/``."""
    stages = []
    init = cfg.model.path
    for block_size in cfg.curriculum.block_sizes:
        out = Path(cfg.output.dir) / f"block{block_size}"
        stages.append(cfg.replace(**{"diffusion.block_size": block_size, "model.path": str(init),
                                     "output.dir": str(out), "curriculum.block_sizes": []}))
        init = out / FINAL
    return stages


def run(cfg: TrainingConfig, *, resume: bool = False) -> Path:
    """Run a config: a single stage, or every curriculum stage in order (finished ones are
    skipped with --resume, so a stopped curriculum continues where it stopped)."""
    if not cfg.curriculum.block_sizes:
        return run_stage(cfg, resume=resume)
    stages = curriculum_stages(cfg)
    for i, stage in enumerate(stages, 1):
        log.info("curriculum stage %d/%d: B = %d from %s -> %s", i, len(stages), stage.diffusion.block_size,
                 stage.model.path, stage.output.dir)
        final = run_stage(stage, resume=resume)
    return final
