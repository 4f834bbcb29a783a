"""Distillation recipe: a frozen teacher guides the student on the student's noisy batch
(training/README.md, The objective: Distillation, on-policy and rho_K).

    wam-diff2 train --config training/distill_blockwise.yaml     # small-block teacher -> larger-block student
    wam-diff2 train --config training/distill_modelwise.yaml     # large teacher -> small student

Both models read the same sequences, each under its own block size's mask, so responses are padded to a
multiple of lcm(B_s, B_t). Logged per step: ``kd``, ``ce`` and ``top{K}_overlap``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

from ...config import ConfigError
from ..training_data import Example, padded_length, prompt_batch
from ..losses import DiffusionObjective, LossSettings, objective_inputs
from ..noise import TrainingBatch
from .finetune import FinetuneRecipe, StepResult

log = logging.getLogger(__name__)


class DistillRecipe(FinetuneRecipe):
    """Student (``model.path``, ``diffusion.block_size``) + frozen teacher (``distill.teacher_path``)."""

    reports_overlap = True

    def setup_extra(self) -> None:
        from ...model.checkpoint import load_checkpoint

        cfg = self.cfg.distill
        dtype = cfg.teacher_dtype
        if dtype == "auto":
            dtype = "float32" if self.accelerator.device.type == "cpu" else "bfloat16"
        loaded = load_checkpoint(cfg.teacher_path, device=str(self.accelerator.device), dtype=dtype,
                                 attn_implementation=self.cfg.model.attn_implementation)
        self.teacher = loaded.model.eval().requires_grad_(False)
        self.teacher_block_size = cfg.teacher_block_size or loaded.config.block_size
        student, teacher = self.diffusion, loaded.config
        if teacher.vocab_size != student.vocab_size:
            raise ConfigError(f"distill.teacher_path: LM head width {teacher.vocab_size} differs from the student's "
                              f"{student.vocab_size}")
        if teacher.eos_token_id != student.eos_token_id:
            raise ConfigError(f"distill.teacher_path: the teacher's EOS token id {teacher.eos_token_id} differs from "
                              f"the student's {student.eos_token_id}")
        # An AR teacher reads the clean tokens only; a diffusion teacher reads the student's MASKs too.
        if self.teacher_block_size > 1 and teacher.mask_token_id != student.mask_token_id:
            raise ConfigError(f"distill.teacher_path: the teacher's mask token id {teacher.mask_token_id} differs from "
                              f"the student's {student.mask_token_id} (a teacher with B_t = "
                              f"{self.teacher_block_size} reads the student's masked positions)")
        for key in ("patch_size", "merge_size", "temporal_patch_size"):
            t_val = getattr(loaded.processor.image_processor, key, None)
            s_val = getattr(self.processor.image_processor, key, None)
            if t_val != s_val:
                raise ConfigError(f"distill.teacher_path: image processor {key} {t_val} differs from the student's "
                                  f"{s_val} (both must see the same image tokens)")
        log.info("teacher %s (B_t = %d, %s) -> student B_s = %d, loss %s", cfg.teacher_path,
                 self.teacher_block_size, dtype, self.block_size, cfg.loss)
        self.pad_multiple = math.lcm(self.block_size, self.teacher_block_size)

    def build_objective(self) -> torch.nn.Module:
        d = self.cfg.distill
        return DiffusionObjective(self.hf_model, LossSettings(
            chunk_size=self.cfg.loss.chunk_size, kd_loss=d.loss, beta=d.beta, temperature=d.temperature,
            kd_ratio=d.kd_ratio, overlap_k=d.overlap_k))

    def loss_inputs(self, batch: TrainingBatch) -> dict[str, Any]:
        with self.accelerator.autocast():        # the teacher's forward
            return objective_inputs(batch, self.teacher, self.teacher_block_size)

    def prepare_examples(self, step: int, examples: list[Example]) -> tuple[list[Example], int]:
        d = self.cfg.distill
        if not d.on_policy or step % d.generate_interval:
            return examples, 0
        return self.regenerate(examples), 1

    @torch.no_grad()
    def regenerate(self, examples: list[Example]) -> list[Example]:
        """The student's own answers (its decoder, its block size) in place of the ground truth."""
        from ...decoding.decoder import BlockDiffusionDecoder

        eos = self.diffusion.eos_token_id
        longest = max(int(e.response_ids.shape[0]) for e in examples)
        settings = self.diffusion.settings.replace(
            block_size=self.block_size,
            max_new_tokens=self.cfg.distill.max_new_tokens or padded_length(longest, self.block_size))
        pad_id = self.processor.tokenizer.pad_token_id
        inputs = prompt_batch(examples, eos if pad_id is None else pad_id)
        model = self.hf_model
        was_training = model.training
        model.eval()
        try:
            with self.accelerator.autocast():
                out = BlockDiffusionDecoder(model, self.diffusion).generate(inputs, settings)
        finally:
            model.train(was_training)
        return [dataclasses.replace(e, response_ids=torch.tensor(seq + [eos], dtype=torch.long))
                for e, seq in zip(examples, out.sequences)]

    def extra_metrics(self, result: StepResult) -> dict[str, Any]:
        d = self.cfg.distill
        return {"kd": result.kd, f"top{d.overlap_k}_overlap": result.overlap,
                "teacher_block_size": self.teacher_block_size,
                "on_policy_step": bool(d.on_policy and (result.step % d.generate_interval == 0))}
