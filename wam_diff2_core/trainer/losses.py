"""The training objective (training/README.md, The objective): the student's forward and its loss
(``DiffusionObjective``, what the recipes and the evaluation run), a teacher's hidden states, and the
losses on the positions that count, chunked so that full-vocabulary logits exist for at most
``chunk_size`` positions at a time (in the forward and, by recomputation, in the backward).

    terms = objective(hidden, lm_head, targets, ce_weight, settings=LossSettings(chunk_size=1024))

Every position carries its own weight, which already holds the averaging (1 / t for the CE, 1 / L
per sample, 1 / samples of the global batch), so CE = sum_p w_p CE_p, KD = tau^2 sum_p v_p D(P_p, Q_p)
and total = (1 - kd_ratio) CE + kd_ratio KD. rho_K is counted on the same chunks, without gradient.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .noise import TrainingBatch

KD_LOSSES = ("jsd", "forward_kl", "reverse_kl")


@dataclass(frozen=True)
class LossSettings:
    chunk_size: int = 1024
    kd_loss: str = "jsd"
    beta: float = 0.5
    temperature: float = 1.0
    kd_ratio: float = 0.0
    overlap_k: int = 5


@dataclass
class LossTerms:
    total: torch.Tensor     # differentiable
    ce: torch.Tensor        # detached weighted sums
    kd: torch.Tensor
    overlap: torch.Tensor   # sum over positions of |topK_t ∩ topK_s| / K (divide by the position count)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    """Softmax statistics in at least float32 (bf16 logits under autocast lose too much)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, kind: str = "jsd",
               beta: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """Per-position divergence between student P and teacher Q, [M] (not yet x tau^2)."""
    log_p = F.log_softmax(_fp32(student_logits) / temperature, dim=-1)     # [M, V]
    log_q = F.log_softmax(_fp32(teacher_logits) / temperature, dim=-1)
    if kind == "forward_kl":
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    if kind == "reverse_kl":
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    if kind != "jsd":
        raise ValueError(f"kd loss {kind!r} is not one of {', '.join(KD_LOSSES)}")
    log_m = torch.logsumexp(torch.stack([log_q + math.log(beta), log_p + math.log(1.0 - beta)]), dim=0)
    kl_qm = (log_q.exp() * (log_q - log_m)).sum(-1)
    kl_pm = (log_p.exp() * (log_p - log_m)).sum(-1)
    return beta * kl_qm + (1.0 - beta) * kl_pm


def top_k_overlap(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """|topK(teacher) ∩ topK(student)| / K per position, [M]."""
    k = min(k, student_logits.shape[-1])
    s = student_logits.topk(k, dim=-1).indices                      # [M, K]
    t = teacher_logits.topk(k, dim=-1).indices
    return (s.unsqueeze(2) == t.unsqueeze(1)).any(dim=2).float().sum(-1) / k


def _chunk_terms(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
                 ce_weight: torch.Tensor, teacher_hidden: torch.Tensor | None, teacher_head, kd_weight: torch.Tensor | None,
                 settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, ce, kd, overlap) of one chunk; logits [chunk, V] live only inside this call."""
    logits = _fp32(head(hidden))                                         # [c, V]
    zero = logits.new_zeros(())
    ce = (F.cross_entropy(logits, targets, reduction="none") * ce_weight).sum()   # logged even when kd_ratio = 1
    kd, overlap = zero, zero
    if teacher_hidden is not None:
        with torch.no_grad():
            teacher_logits = _fp32(teacher_head(teacher_hidden))         # [c, V]
            counted = (kd_weight > 0).float()                             # zero-weight stand-ins do not count
            overlap = (top_k_overlap(logits.detach(), teacher_logits, settings.overlap_k) * counted).sum()
        if settings.kd_ratio > 0.0:
            per_position = divergence(logits, teacher_logits, settings.kd_loss, settings.beta, settings.temperature)
            kd = (per_position * kd_weight).sum() * settings.temperature ** 2
    total = (1.0 - settings.kd_ratio) * ce + settings.kd_ratio * kd
    return total, ce.detach(), kd.detach(), overlap


def objective(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
              ce_weight: torch.Tensor, settings: LossSettings, *, teacher_hidden: torch.Tensor | None = None,
              teacher_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
              kd_weight: torch.Tensor | None = None, chunked: bool = True) -> LossTerms:
    """Weighted CE (+ KD) over the selected positions. hidden: [M, H] student hidden states at the positions that
    count; targets, ce_weight, kd_weight: [M]; teacher_hidden: [M, H_t]. ``chunked=False`` is the plain path (all M
    logits at once) the chunked one is tested against."""
    if teacher_hidden is not None and (teacher_head is None or kd_weight is None):
        raise ValueError("teacher_hidden needs teacher_head and kd_weight")
    if hidden.shape[0] == 0:
        zero = hidden.sum() * 0.0        # keeps the graph connected (every process must call backward)
        return LossTerms(total=zero, ce=zero.detach(), kd=zero.detach(), overlap=zero.detach())
    if not chunked:
        return LossTerms(*_chunk_terms(hidden, head, targets, ce_weight, teacher_hidden, teacher_head, kd_weight,
                                       settings))
    chunks = []
    for start in range(0, hidden.shape[0], settings.chunk_size):
        sl = slice(start, start + settings.chunk_size)
        t_hidden = teacher_hidden[sl] if teacher_hidden is not None else None
        t_weight = kd_weight[sl] if kd_weight is not None else None
        # Recompute the chunk's logits in backward instead of keeping [M, V] of activations.
        chunks.append(checkpoint(_chunk_terms, hidden[sl], head, targets[sl], ce_weight[sl], t_hidden,
                                 teacher_head, t_weight, settings, use_reentrant=False))
    return LossTerms(*(torch.stack(column).sum() for column in zip(*chunks)))


class DiffusionObjective(torch.nn.Module):
    """The student and its loss in one forward: what Accelerate wraps (DDP, FSDP, DeepSpeed). Returns a dict of
    scalars: ``total`` (differentiable) and the detached ``ce``, ``kd``, ``overlap`` sums."""

    def __init__(self, model: torch.nn.Module, settings: LossSettings):
        super().__init__()
        self.model = model                   # Qwen3VLForConditionalGeneration
        self.settings = settings

    def forward(self, input_ids, attention_mask, position_ids, mm_token_type_ids, target_index, target_ids,
                ce_weight, pixel_values=None, image_grid_thw=None, teacher_hidden=None, teacher_head=None,
                kd_weight=None) -> dict[str, torch.Tensor]:
        if pixel_values is not None:
            pixel_values = pixel_values.to(self.model.dtype)
        out = self.model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               mm_token_type_ids=mm_token_type_ids, pixel_values=pixel_values,
                               image_grid_thw=image_grid_thw, use_cache=False)
        hidden = out.last_hidden_state.flatten(0, 1)[target_index]        # [M, H]: only positions that count
        return vars(objective(hidden, self.model.lm_head, target_ids, ce_weight, self.settings,
                              teacher_hidden=teacher_hidden, teacher_head=teacher_head, kd_weight=kd_weight))


def objective_inputs(batch: TrainingBatch, teacher=None, teacher_block_size: int = 0) -> dict[str, Any]:
    """:class:`DiffusionObjective`'s arguments for ``batch``; with a teacher, its hidden states at the targets."""
    inputs = {"target_index": batch.target_index, "target_ids": batch.target_ids, "ce_weight": batch.ce_weight,
              **batch.model_inputs()}
    if teacher is not None:
        inputs.update(teacher_hidden=teacher_hidden_states(teacher, batch, teacher_block_size),
                      teacher_head=teacher.lm_head, kd_weight=batch.kd_weight)
    return inputs


@torch.no_grad()
def teacher_hidden_states(teacher, batch: TrainingBatch, teacher_block_size: int) -> torch.Tensor:
    """Teacher hidden states at the batch's targets, [M, H_t], under the teacher's own mask.
    An AR teacher (B_t = 1) is read at the clean token before each target (its next-token view)."""
    inputs = batch.model_inputs(batch.mask_for(teacher_block_size))
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(teacher.dtype)
    out = teacher.model(**inputs, use_cache=False)
    index = batch.ar_predecessor_index if teacher_block_size == 1 else batch.target_index
    return out.last_hidden_state.flatten(0, 1)[index]
