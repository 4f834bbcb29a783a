"""Attention backends of the static decoder: SDPA (the reference) and FlashInfer (attention_flashinfer.py).

A backend reads keys from the StaticKVCache: ``prompt`` during the prefill, ``step`` during a
denoise step (``begin`` plans a step shape once per block; ``graph_key`` names what a CUDA graph of
the step depends on).

    attention = make_attention("sdpa", text, cuda_graphs=False)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..config import ConfigError
from .kv_cache import StaticKVCache
from .text_forward import QwenTextForward

if TYPE_CHECKING:
    from .static import PromptPlan
    from .step import StepBuffers


class SdpaAttention:
    """torch SDPA through transformers' own ``sdpa_attention_forward``: the plain path's exact dispatch
    (repeat_kv for grouped heads, pack_gqa for a single query). Keys are cache slots [0, span)."""

    name = "sdpa"
    packed_prompts = False      # the cache keeps prompts left-padded, like the plain path's cache

    def __init__(self):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self._sdpa = sdpa_attention_forward

    def begin_prompt(self, plan: "PromptPlan", cache: StaticKVCache) -> None:
        pass

    def prompt(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, plan: "PromptPlan") -> torch.Tensor:
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
            outs.append(self._sdpa(attn, q[:, :, group.start:group.stop], k, v, mask,
                                   dropout=0.0, scaling=attn.scaling)[0])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def make_attention(name: str, text: QwenTextForward, cuda_graphs: bool):
    if name == "sdpa":
        return SdpaAttention()
    if name == "flashinfer":
        from .attention_flashinfer import FlashInferAttention
        return FlashInferAttention(text, use_cuda_graph=cuda_graphs)
    raise ConfigError(f"attention_backend: {name!r} is not one of sdpa, flashinfer")
