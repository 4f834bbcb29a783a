"""Attention backends of the static decoder: the interface (:class:`AttentionBackend`), SDPA (the
reference) and FlashInfer (attention_flashinfer.py).

A backend reads keys from the StaticKVCache: ``prompt`` during the prefill (where the prompt is stored
and masked: :class:`PromptPlan`), ``step`` during a denoise step (``begin`` plans a step shape once per
block; ``graph_key`` names what a CUDA graph of the step depends on).

    attention = SdpaAttention()
    plan = PromptPlan.of(valid, lengths, block_size, attention.packed_prompts)
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .kv_cache import StaticKVCache
from .masks import prompt_block_mask
from .step import StepBuffers


@dataclass
class PromptPlan:
    """Where the prompt's K/V go and how its attention is masked (made by the static decoder's prefill,
    read by the backends)."""

    length: int                         # T, the padded prompt length
    rows: torch.Tensor                  # [N, T] cache row of each prompt position
    slots: torch.Tensor                 # [N, T] its cache slot
    select: tuple | None                # (row, token) indices of the real tokens (packed prompts); None = all
    mask: torch.Tensor | None           # [N, 1, T, T] block-causal (SDPA)
    lengths: list[int]                  # host: P_n, real prompt tokens per row
    block_size: int

    @classmethod
    def of(cls, valid: torch.Tensor, lengths: list[int], block_size: int, packed: bool) -> "PromptPlan":
        """The plan of a left-padded batch (``valid`` [N, T], ``lengths`` its row sums): stored left-padded
        as the plain path's cache under the block-causal mask, or ``packed``: row r's real tokens at slots
        [0, P_r), its padding after them in slots [P_r, T), which the response overwrites before any step
        reads them (a backend with packed prompts reads a row's slots [0, kv length) only; the mask is
        left to it)."""
        n, length = valid.shape
        dev = valid.device
        rows = torch.arange(n, device=dev).unsqueeze(1).expand(n, length).contiguous()
        slots = torch.arange(length, device=dev).unsqueeze(0).expand(n, length)
        if not packed:
            return cls(length, rows, slots.contiguous(), None, prompt_block_mask(valid, block_size), lengths,
                       block_size)
        pad = torch.tensor([length - p for p in lengths], device=dev)
        return cls(length, rows, (slots - pad.unsqueeze(1)) % length, valid.nonzero(as_tuple=True), None, lengths,
                   block_size)


class AttentionBackend(Protocol):
    """What the static decoder asks of an attention backend (SDPA here, FlashInfer in attention_flashinfer.py)."""

    name: str                   # "sdpa" attends to key spans (graph keys, warm-up lengths); others plan pages
    packed_prompts: bool        # the cache stores prompts packed rather than left-padded (PromptPlan.of)

    def begin_prompt(self, plan: PromptPlan, cache: StaticKVCache) -> None:
        """Plan the prefill's attention (host side, once per call)."""

    def prompt(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, plan: PromptPlan) -> torch.Tensor:
        """Prefill attention of ``layer``: q [N, H, T, D] -> [N, T, H, D], over the K/V just stored."""

    def begin(self, buf: StepBuffers, cache: StaticKVCache) -> None:
        """Plan a step's attention (host side, once per block, per token in AR; outside any graph)."""

    def graph_key(self, buf: StepBuffers) -> tuple:
        """What a CUDA graph of a step over ``buf`` depends on (part of its key)."""

    def step_inputs(self, buf: StepBuffers) -> Any:
        """What every layer's step attention reads, made once per forward on the device (inside its graph)."""

    def step(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, buf: StepBuffers,
             shared: Any) -> torch.Tensor:
        """Step attention of ``layer``: q [R, H, Q, D] -> [R, Q, H, D], under the step's visibility (``shared``:
        :meth:`step_inputs` of this forward); no host reads."""


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


class SdpaAttention(AttentionBackend):
    """torch SDPA over cache slots [0, span). The prefill goes through transformers' own
    ``sdpa_attention_forward`` (the plain path's dispatch); a step folds grouped heads into the query axis
    instead (:func:`grouped_sdpa`: no copy of K/V per query head), the same numbers (tests pin the tokens)."""

    name = "sdpa"
    packed_prompts = False      # the cache keeps prompts left-padded, like the plain path's cache

    def __init__(self, query_groups: int):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self._sdpa = sdpa_attention_forward
        self.query_groups = query_groups        # query heads per K/V head

    def begin_prompt(self, plan: PromptPlan, cache: StaticKVCache) -> None:
        pass

    def prompt(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, plan: PromptPlan) -> torch.Tensor:
        k, v = cache.read(layer, q.shape[0], plan.length)
        return self._sdpa(attn, q, k, v, plan.mask, dropout=0.0, scaling=attn.scaling)[0]

    def begin(self, buf: StepBuffers, cache: StaticKVCache) -> None:
        pass

    def graph_key(self, buf: StepBuffers) -> tuple:
        return (self.name, tuple(buf.tokens.shape), buf.segments, buf.groups)

    def step_inputs(self, buf: StepBuffers) -> list[torch.Tensor]:
        """One additive mask per SDPA call (:func:`folded_bias`), shared by every layer."""
        return [folded_bias(buf.mask[:, :, g.start:g.stop, :g.span], self.query_groups, buf.cos.dtype)
                for g in buf.groups]

    def step(self, layer: int, attn, q: torch.Tensor, cache: StaticKVCache, buf: StepBuffers,
             shared: list[torch.Tensor]) -> torch.Tensor:
        outs = []
        with sdpa_step_backends(q.device):       # here, so every caller of a step runs the same kernels
            for group, bias in zip(buf.groups, shared):  # one SDPA call per distinct key span (StepBuffers.fill)
                k, v = cache.read(layer, q.shape[0], group.span)
                outs.append(grouped_sdpa(q[:, :, group.start:group.stop], k, v, bias, attn.scaling))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def folded_bias(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask [N, 1, Q, S] (True = may attend) as the additive mask [N, 1, G * Q, S] of
    :func:`grouped_sdpa` with G query heads per K/V head: 0 where visible, -inf elsewhere, which is what SDPA
    makes of a boolean mask itself (the same numbers), here once per step instead of in every layer. Rows are
    16-aligned in memory (memory-efficient attention copies a bias whose row stride is not)."""
    n, _, queries, span = mask.shape
    aligned = -(-span // 16) * 16
    bias = torch.full((n, 1, groups, queries, aligned), float("-inf"), dtype=dtype, device=mask.device)[..., :span]
    bias.masked_fill_(mask.unsqueeze(2), 0.0)
    return bias.view(n, 1, groups * queries, span)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of q [N, H, Q, D] over k, v [N, H_kv, S, D] under an additive mask [N, 1, G * Q, S]
    (:func:`folded_bias`), returned as [N, Q, H, D] (transformers' layout). With grouped heads (H = G * H_kv) the
    G query heads that share a K/V head are one longer query axis [N, H_kv, G * Q, D], so K and V are read
    where they are instead of being copied G times (transformers' ``repeat_kv`` under a mask)."""
    n, heads, queries, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    q = q.reshape(n, kv_heads, groups * queries, dim)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0, scale=scale)
    # [N, KVH, G * Q, D] -> [N, Q, KVH * G, D]: one copy whichever layout the kernel wrote (memory-efficient
    # attention writes [N, G * Q, KVH, D])
    return out.view(n, kv_heads, groups, queries, dim).permute(0, 3, 1, 2, 4).reshape(n, queries, heads, dim)
