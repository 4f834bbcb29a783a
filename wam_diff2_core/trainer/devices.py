"""The device side of a training run: bf16 autocast and TF32 as ``train.*`` asks, and the Accelerator that
accumulates this process's share of the global batch.

    accelerator = make_accelerator(cfg, "cuda", BatchPlan(128, 1, num_processes=8, process_index=0))
"""
from __future__ import annotations

import logging

import torch

from .training_config import TrainingConfig
from .training_data import BatchPlan

log = logging.getLogger(__name__)


def apply_tf32(enabled: bool, device: str) -> bool:
    """``train.tf32``: float32 matrix products on CUDA in TF32 (process-wide, as torch's flag is). Returns whether
    it was applied: only when asked for and on CUDA (TF32 is a CUDA tensor-core format)."""
    if not enabled:
        return False
    if device != "cuda":
        log.warning("train.tf32: ignored on %s (TF32 is a CUDA format)", device)
        return False
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):          # torch >= 2.9; mixing it with allow_tf32 is an error there
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
    return True


def make_accelerator(cfg: TrainingConfig, device: str, plan: BatchPlan):
    """The run's Accelerator on ``device`` (in the process group that PartialState joined)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, DistributedType

    mixed_precision = cfg.train.mixed_precision
    if mixed_precision == "auto":
        bf16 = device == "npu" or (device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        mixed_precision = "bf16" if bf16 else "no"
    acc = Accelerator(
        cpu=device == "cpu", mixed_precision=mixed_precision,
        gradient_accumulation_steps=plan.accumulation_steps,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.train.find_unused_parameters)])
    if acc.distributed_type == DistributedType.DEEPSPEED:
        # no DataLoader goes through prepare(), so DeepSpeed cannot infer its micro-batch
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.train.micro_batch_size
    return acc
