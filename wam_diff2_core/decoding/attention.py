"""Attention backends of the static decoder: SDPA (the reference) and FlashInfer (attention_flashinfer.py).

A backend reads keys from the StaticKVCache: ``prompt`` during the prefill, ``step`` during a
denoise step (``begin`` plans a step shape once per block; ``graph_key`` names what a CUDA graph of
the step depends on).

    attention = make_attention("sdpa", text, cuda_graphs=False)
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..config import ConfigError
from .kv_cache import StaticKVCache
from .text_forward import QwenTextForward

if TYPE_CHECKING:
    from .step import StepBuffers


@dataclass
class PromptPlan:
    """Where the prompt's K/V go and how its attention is masked (made by the static decoder's prefill,
    read by the backends)."""

    length: int                         # T, the padded prompt length
    rows: torch.Tensor                  # [M] or [N, T] cache rows of the stored tokens
    slots: torch.Tensor                 # same shape: cache slots
    select: tuple | None                # (row, token) indices of the stored tokens; None = all
    mask: torch.Tensor | None           # [N, 1, T, T] block-causal (SDPA)
    lengths: list[int]                  # host: P_n, real prompt tokens per row
    block_size: int


# The SDPA kernels a static step may run, by device type, in order of preference (the one place they are
# stated). CUDA: a step's mask is an arbitrary boolean [N, 1, Q, S] (block-causal, padded prompts), which
# flash attention does not take, and the math kernel materialises the scores: memory-efficient attention,
# else cuDNN (verify-device's probe lists which of them run a bool mask in bf16 on the device). Other
# devices are not pinned: torch's own choice there (CPU: its flash kernel, which takes a mask, or math).
SDPA_STEP_BACKENDS: dict[str, tuple[SDPBackend, ...]] = {
    "cuda": (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION),
}


def sdpa_step_backends(device: torch.device) -> AbstractContextManager:
    """The context every static SDPA step runs under (eager, compiled and graphed alike, so the graph
    captures the kernels the eager step ran): ``sdpa_kernel`` over :data:`SDPA_STEP_BACKENDS` of the
    device, or nothing where none are pinned."""
    backends = SDPA_STEP_BACKENDS.get(device.type)
    return sdpa_kernel(list(backends), set_priority=True) if backends else nullcontext()


class SdpaAttention:
    """torch SDPA over cache slots [0, span). The prefill goes through transformers' own
    ``sdpa_attention_forward`` (the plain path's dispatch); a step folds grouped heads into the query axis
    instead (:func:`grouped_sdpa`: no copy of K/V per query head), the same numbers (tests pin the tokens)."""

    name = "sdpa"
    packed_prompts = False      # the cache keeps prompts left-padded, like the plain path's cache

    def __init__(self):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self._sdpa = sdpa_attention_forward

    def begin_prompt(self, plan: PromptPlan, cache: StaticKVCache) -> None:
        pass

    def prompt(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, plan: PromptPlan) -> torch.Tensor:
        k, v = cache.read(layer, q.shape[0], plan.length)
        return self._sdpa(attn, q, k, v, plan.mask, dropout=0.0, scaling=attn.scaling)[0]

    def begin(self, buf: "StepBuffers", cache: StaticKVCache) -> None:
        pass

    def graph_key(self, buf: "StepBuffers") -> tuple:
        return (self.name, tuple(buf.tokens.shape), buf.segments, buf.groups)

    def step(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, buf: "StepBuffers") -> torch.Tensor:
        outs = []
        for group in buf.groups:  # one SDPA call per distinct key span (see _plan)
            k, v = cache.read(layer, q.shape[0], group.span)
            mask = buf.mask[:, :, group.start:group.stop, :group.span]
            outs.append(grouped_sdpa(q[:, :, group.start:group.stop], k, v, mask, attn.scaling))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of q [N, H, Q, D] over k, v [N, H_kv, S, D] under a boolean mask [N, 1, Q, S], returned
    as [N, Q, H, D] (transformers' layout). With grouped heads (H = G * H_kv) the G query heads that share
    a K/V head are one longer query axis [N, H_kv, G * Q, D] (the mask tiled G times along it), so K and V
    are read where they are instead of being copied G times (transformers' ``repeat_kv`` under a mask)."""
    n, heads, queries, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    if groups > 1:
        q = q.reshape(n, kv_heads, groups * queries, dim)
        mask = mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale)
    return out.reshape(n, heads, queries, dim).transpose(1, 2).contiguous()


def make_attention(name: str, text: QwenTextForward, cuda_graphs: bool):
    if name == "sdpa":
        return SdpaAttention()
    if name == "flashinfer":
        from .attention_flashinfer import FlashInferAttention
        return FlashInferAttention(text, use_cuda_graph=cuda_graphs)
    raise ConfigError(f"attention_backend: {name!r} is not one of sdpa, flashinfer")
