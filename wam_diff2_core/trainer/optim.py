"""AdamW with per-part learning rates, and the warm-up + cosine schedule (training/README.md, The optimizer).
Each part (``part_of``) is split into a decayed group and one without weight decay; frozen parameters
are left out.

    optimizer = build_optimizer(model, cfg.optim); scheduler = build_scheduler(optimizer, 1000, cfg.optim)
"""
from __future__ import annotations

import math
import re

import torch

from .training_config import OptimSection

LANGUAGE_MODEL, MERGER, VISION_TOWER = "language_model", "merger", "vision_tower"
_MERGER = re.compile(r"(^|\.)visual\.(merger|deepstack_merger_list)\.")
_VISION = re.compile(r"(^|\.)visual\.")


def part_of(name: str) -> str:
    """Which learning-rate group a parameter belongs to, from its name."""
    if _MERGER.search(name):
        return MERGER
    if _VISION.search(name):
        return VISION_TOWER
    return LANGUAGE_MODEL


def no_decay_names(model: torch.nn.Module) -> set[str]:
    """Norms, biases, embedding tables and every other tensor with fewer than 2 dimensions."""
    return {f"{module_name}.{name}" if module_name else name
            for module_name, module in model.named_modules() for name, param in module.named_parameters(recurse=False)
            if param.ndim < 2 or isinstance(module, torch.nn.Embedding) or name == "bias"
            or "norm" in module_name.split(".")[-1].lower()}


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop training the vision tower (not the mergers). Returns the number of frozen tensors."""
    tower = [param for name, param in model.named_parameters() if part_of(name) == VISION_TOWER]
    for param in tower:
        param.requires_grad_(False)
    return len(tower)


def build_optimizer(model: torch.nn.Module, cfg: OptimSection) -> torch.optim.AdamW:
    lrs = {LANGUAGE_MODEL: cfg.lr, MERGER: cfg.merger_lr, VISION_TOWER: cfg.vision_lr}
    skip_decay = no_decay_names(model)
    groups: dict[tuple[str, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            groups.setdefault((part_of(name), name not in skip_decay), []).append(param)
    if not groups:
        from ..config import ConfigError
        raise ConfigError("model: no trainable parameters")
    return torch.optim.AdamW([{"params": params, "lr": lrs[part], "weight_decay": cfg.weight_decay if decay else 0.0,
                               "name": f"{part}{'' if decay else '_no_decay'}"}
                              for (part, decay), params in sorted(groups.items())],
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def warmup_steps(total_steps: int, cfg: OptimSection) -> int:
    return min(cfg.warmup_max_steps, int(cfg.warmup_fraction * total_steps))


def lr_factor(step: int, total_steps: int, cfg: OptimSection) -> float:
    """Multiplier of the base learning rates at optimizer step ``step`` (0-based)."""
    warm = warmup_steps(total_steps, cfg)
    if step < warm:
        return cfg.warmup_start_factor + (1.0 - cfg.warmup_start_factor) * step / warm
    progress = min(1.0, (step - warm) / max(1, total_steps - warm))
    return cfg.final_lr_factor + (1.0 - cfg.final_lr_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimSection):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
