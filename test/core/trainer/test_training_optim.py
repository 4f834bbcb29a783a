"""Optimizer groups and the learning-rate schedule (training/README.md, The optimizer)."""
from __future__ import annotations

import math

import pytest
import torch

from wam_diff2_core.trainer.training_config import OptimSection
from wam_diff2_core.trainer.optim import (LANGUAGE_MODEL, MERGER, VISION_TOWER, build_optimizer, build_scheduler,
                                          freeze_vision_tower, lr_factor, no_decay_names, part_of, warmup_steps)





@pytest.fixture()
def model(tiny_checkpoint):
    from transformers import Qwen3VLForConditionalGeneration
    return Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_checkpoint))


def test_parts_from_names():
    assert part_of("model.visual.blocks.0.attn.qkv.weight") == VISION_TOWER
    assert part_of("model.visual.patch_embed.proj.weight") == VISION_TOWER
    assert part_of("model.visual.merger.linear_fc1.weight") == MERGER
    assert part_of("model.visual.deepstack_merger_list.1.norm.weight") == MERGER
    assert part_of("model.language_model.layers.0.mlp.up_proj.weight") == LANGUAGE_MODEL
    assert part_of("lm_head.weight") == LANGUAGE_MODEL
    assert part_of("model.model.visual.merger.norm.bias") == MERGER      # inside a wrapper too


def test_groups_learning_rates_and_weight_decay(model):
    cfg = OptimSection(lr=1e-3, merger_lr=2e-3, vision_lr=3e-3, weight_decay=0.05)
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    lrs = {LANGUAGE_MODEL: 1e-3, MERGER: 2e-3, VISION_TOWER: 3e-3}
    for group in opt.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            seen.add(name)
            assert group["lr"] == lrs[part_of(name)], name
            plain = p.ndim < 2 or "norm" in name or name.endswith(".bias") or "embed_tokens" in name \
                or "pos_embed" in name
            assert group["weight_decay"] == (0.0 if plain else 0.05), name
    assert seen == set(names.values())                            # every parameter exactly once
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)
    assert opt.defaults["betas"] == (0.9, 0.95)
    skip = no_decay_names(model)
    assert "model.language_model.embed_tokens.weight" in skip and "model.visual.pos_embed.weight" in skip
    assert "lm_head.weight" not in skip and "model.visual.patch_embed.proj.weight" not in skip


def test_frozen_vision_tower_is_not_optimised(model):
    frozen = freeze_vision_tower(model)
    assert frozen > 0
    opt = build_optimizer(model, OptimSection())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in in_opt) == (part_of(name) != VISION_TOWER), name


@pytest.mark.parametrize("total,warm", [(100, 10), (50_000, 1000), (5, 0)])
def test_warmup_then_cosine(total, warm):
    cfg = OptimSection()
    assert warmup_steps(total, cfg) == warm
    if warm:
        assert lr_factor(0, total, cfg) == pytest.approx(0.1)
        assert lr_factor(warm // 2, total, cfg) == pytest.approx(0.1 + 0.9 * (warm // 2) / warm)
    assert lr_factor(warm, total, cfg) == pytest.approx(1.0)
    assert lr_factor(total, total, cfg) == pytest.approx(0.01)
    mid = warm + (total - warm) / 2
    assert lr_factor(int(mid), total, cfg) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * (int(mid) - warm)
                                                                                          / (total - warm))))
    factors = [lr_factor(s, total, cfg) for s in range(warm, total + 1)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))      # monotone decay after warm-up


def test_scheduler_drives_every_group():
    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2, 2))]
    opt = torch.optim.AdamW([{"params": [params[0]], "lr": 1.0}, {"params": [params[1]], "lr": 0.5}])
    sched = build_scheduler(opt, 20, OptimSection())
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.05])
    for _ in range(2):
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1.0, 0.5])   # warm-up of 2 steps done
