"""One step of the static decoder: its fixed buffers (:class:`StepBuffers`, after the prefill's
:class:`StaticPrefix`), the forward (:func:`forward_step`; :func:`eager_twin_step`, the reference it must
equal; :func:`compiled_forward_step`), the whole denoising step (:func:`whole_step` over :class:`BlockState`:
one CUDA graph per step, so the host reads only its "still masked?" flag, every ``mask_check_interval``
steps; ``torch.compile(whole_step, fullgraph=True)`` traces it without a graph break, as a CPU test proves)
and the B = 1 step (:func:`ar_step` over :class:`ARState`).

    state = decoder.begin(inputs, block_size=32, answer_slots=64)        # prefill (public API)
    buf = decoder.plan_step(state, [(0, 32)])                            # block 0's step buffers
    logits = decoder.forward(state, buf)                                 # [R, 32, V]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..config import DecodingSettings
from .kv_cache import StaticKVCache
from .masks import response_positions
from .sampling import choose_transfer
from .text_forward import QwenTextForward


@dataclass
class StaticPrefix:
    """What the prefill leaves for decoding (rows beyond the batch pad a CUDA graph bucket)."""

    n: int                              # sequences in the batch
    base: list[int]                     # host: first response slot of each row
    base_t: torch.Tensor                # [R] the same on the device
    prompt_valid: torch.Tensor          # [R, slots] prompt slots that may be attended
    next_position: torch.Tensor         # [R] MRoPE position of response offset 0
    last_logits: torch.Tensor           # [N, V] logits at the last prompt token (AR)


@dataclass(frozen=True)
class QueryGroup:
    """Queries [start, stop) of a step attend to cache slots [0, span) (under the step's mask)."""

    start: int
    stop: int
    span: int


@dataclass
class StepBuffers:
    """Fixed device buffers of one step shape [rows, queries], refilled in place once per block.

    A step's queries are response segments (offset, length), e.g. [(kB, B)] for a denoise step of
    block k, [((k-1)B, B), (kB, B)] for the fused commit + step; segment j sees the prefix and the
    response up to its own end.
    """

    tokens: torch.Tensor        # [R, Q] long
    rows: torch.Tensor          # [R, Q] long: cache row of each query
    slots: torch.Tensor         # [R, Q] long: cache slot its K/V are written to
    positions: torch.Tensor     # [3, R, Q] MRoPE ids (all three axes equal for response tokens)
    cos: torch.Tensor           # [R, Q, head_dim]
    sin: torch.Tensor
    mask: torch.Tensor          # [R, 1, Q, cache slots] bool, True = may attend (SDPA)
    out_rows: int               # logits are returned for the last out_rows queries
    segments: tuple[tuple[int, int], ...] = ()   # host: (start, stop) of each segment in the queries
    groups: tuple[QueryGroup, ...] = ()          # host: SDPA calls (segments merged when spans agree)
    kv_lengths: list[list[int]] = field(default_factory=list)  # host: [row][segment] visible slots

    @classmethod
    def empty(cls, rows: int, queries: int, slots: int, out_rows: int, head_dim: int, dtype: torch.dtype,
              device: torch.device) -> "StepBuffers":
        long = dict(dtype=torch.long, device=device)
        return cls(tokens=torch.zeros(rows, queries, **long),
                   rows=torch.arange(rows, device=device).unsqueeze(1).expand(rows, queries).contiguous(),
                   slots=torch.zeros(rows, queries, **long), positions=torch.zeros(3, rows, queries, **long),
                   cos=torch.zeros(rows, queries, head_dim, dtype=dtype, device=device),
                   sin=torch.zeros(rows, queries, head_dim, dtype=dtype, device=device),
                   mask=torch.zeros(rows, 1, queries, slots, dtype=torch.bool, device=device), out_rows=out_rows)

    def fill(self, text: QwenTextForward, prefix: StaticPrefix, segments: Sequence[tuple[int, int]],
             span_of: Callable[[int], int]) -> None:
        """Fill the buffers for response ``segments`` [(offset, length)] after ``prefix``: their cache slots,
        positions, cos/sin and mask on the device; on the host the query bounds, the SDPA groups (segments
        merged while their key span ``span_of(end)`` agrees) and each row's visible slots."""
        rows, slots = self.tokens.shape[0], self.mask.shape[-1]
        slot = torch.arange(slots, device=self.tokens.device)
        start, bounds, groups, kv_lengths = 0, [], [], [[] for _ in range(rows)]
        for offset, length in segments:
            stop = start + length
            end = offset + length                                   # response slots visible: [0, end)
            steps = torch.arange(offset, end, device=self.tokens.device)
            self.slots[:, start:stop] = prefix.base_t.unsqueeze(1) + steps
            # cos/sin per segment, at the plain path's shapes (elementwise kernels stay bit-identical).
            positions = response_positions(prefix.next_position, offset, length)      # [3, R, length]
            cos, sin = text.rope(positions)
            self.positions[:, :, start:stop], self.cos[:, start:stop], self.sin[:, start:stop] = positions, cos, sin
            visible = prefix.prompt_valid | ((slot >= prefix.base_t.unsqueeze(1))
                                             & (slot < (prefix.base_t + end).unsqueeze(1)))   # [R, slots]
            self.mask[:, 0, start:stop] = visible.unsqueeze(1)
            span = span_of(end)
            if groups and groups[-1].span == span:
                groups[-1] = QueryGroup(groups[-1].start, stop, span)
            else:
                groups.append(QueryGroup(start, stop, span))
            for r in range(rows):
                kv_lengths[r].append(prefix.base[r] + end)
            bounds.append((start, stop))
            start = stop
        self.segments, self.groups, self.kv_lengths = tuple(bounds), tuple(groups), kv_lengths


def forward_step(text: QwenTextForward, cache: StaticKVCache, attention, buf: StepBuffers) -> torch.Tensor:
    """The denoise step as a pure function of fixed-shape buffers (what a CUDA graph captures).

    Embeds ``buf.tokens``, writes their K/V into ``buf.slots``, attends through ``attention`` (an
    :class:`attention.AttentionBackend`, which reads these buffers: not imported here; what its layers share,
    the SDPA masks, made once here) and returns the logits of the last ``buf.out_rows`` queries
    [R, out_rows, V]. No host reads.
    """
    shared = attention.step_inputs(buf)
    hidden = text.layers_forward(text.embed_tokens(buf.tokens), buf.cos, buf.sin, cache, buf.rows, buf.slots,
                                 attend=lambda i, attn, q: attention.step(i, attn, q, cache, buf, shared),
                                 last=buf.out_rows)
    return text.lm_head(hidden)


# Inductor's mode by ``engine.compile_mode``. The static decoder's own graphs capture the compiled forward
# (cuda_graphs.py), so Inductor must not add graphs of its own: "default" (heuristic kernel configurations,
# seconds per step shape) or "max-autotune-no-cudagraphs" (autotuned matmuls, which on an H200 took over 170 s
# for one step shape of the 2B model).
COMPILE_MODES = {"default": None, "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
# Compiled step shapes one process may hold (Dynamo's default is 8 per function; a warm-up compiles one per
# batch bucket x key-span bucket x step shape). Past it a call raises rather than run eagerly unseen.
COMPILE_SHAPES_LIMIT = 1024


def compiled_forward_step(mode: str = "default") -> Callable[..., torch.Tensor]:
    """:func:`forward_step` compiled (fullgraph: a graph break raises; static shapes: one compiled graph per
    step shape, which is what a CUDA graph replays anyway; the fused layer ops stay single opaque calls).
    Code is generated on the first call of a shape; on CUDA that call may synchronise (autotuning), so
    StepGraphs makes it before the capture rules apply."""
    compiled = torch.compile(forward_step, fullgraph=True, dynamic=False, mode=COMPILE_MODES[mode])

    def run(text: QwenTextForward, cache: StaticKVCache, attention, buf: StepBuffers) -> torch.Tensor:
        with torch._dynamo.config.patch(recompile_limit=COMPILE_SHAPES_LIMIT,
                                        accumulated_recompile_limit=COMPILE_SHAPES_LIMIT,
                                        fail_on_recompile_limit_hit=True):
            return compiled(text, cache, attention, buf)
    return run


def eager_twin_step(model, cache: StaticKVCache, buf: StepBuffers, rows: int) -> torch.Tensor:
    """The same step through transformers' own forward, the reference :func:`forward_step` must equal:
    a DynamicCache holds the static cache's slots before the step's first slot and the HF model
    appends the step's tokens. Single-segment steps over left-padded prompts (the SDPA layout)."""
    from transformers import DynamicCache

    if len(buf.segments) != 1:
        raise ValueError("eager_twin_step: one segment (a denoise step), got %d" % len(buf.segments))
    first = int(buf.slots[0, 0])            # left-padded prompts: every row's block starts here
    queries = buf.tokens.shape[1]
    dynamic = DynamicCache(config=model.config)
    for layer in range(cache.k.shape[0]):
        k, v = cache.read(layer, rows, first)
        dynamic.update(k.contiguous(), v.contiguous(), layer)
    out = model(input_ids=buf.tokens[:rows], attention_mask=buf.mask[:rows, :, :, :first + queries],
                position_ids=buf.positions[:, :rows], past_key_values=dynamic, use_cache=True)
    return out.logits[:, queries - buf.out_rows:]


@dataclass(frozen=True)
class TransferRule:
    """The host constants one whole step bakes in (part of its CUDA graph's key): the strategy and
    threshold, how many positions a static strategy fixes at this step, the MASK and EOS ids."""

    strategy: str
    threshold: float
    count: int
    mask_id: int
    eos_id: int

    @classmethod
    def at_step(cls, settings: DecodingSettings, step: int, schedule: Sequence[int], mask_id: int,
                eos_id: int) -> "TransferRule":
        count = 0 if settings.remasking_strategy == "low_confidence_dynamic" else schedule[min(step, len(schedule) - 1)]
        return cls(settings.remasking_strategy, settings.confidence_threshold, count, mask_id, eos_id)

    @property
    def settings(self) -> DecodingSettings:
        return DecodingSettings(remasking_strategy=self.strategy, confidence_threshold=self.threshold)


@dataclass
class BlockState:
    """The block being denoised, in fixed device buffers that a whole step reads and writes in place."""

    tokens: torch.Tensor        # [R, B] long: MASK where nothing is fixed yet
    last: torch.Tensor          # [R, B] long: the last step's pick at every position
    steps: torch.Tensor         # [R] long: steps each row has needed in this block
    conf: torch.Tensor          # [R, B] float32: the confidence each fixed token was fixed with
    last_conf: torch.Tensor     # [R, B] float32: the last step's confidence at every position

    @classmethod
    def empty(cls, rows: int, size: int, device: torch.device) -> "BlockState":
        long = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(rows, size, **long), torch.zeros(rows, size, **long), torch.zeros(rows, **long),
                   torch.ones(rows, size, device=device), torch.ones(rows, size, device=device))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.tokens, self.last, self.steps, self.conf, self.last_conf


def pending_rows(block: torch.Tensor, masked: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[R] True where a masked position remains before the first fixed EOS: the row needs more steps.
    (Positions after a fixed EOS cannot change the answer, which is truncated there.)"""
    size = block.shape[1]
    is_eos = block == eos_id
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), size)
    before = torch.arange(size, device=block.device).unsqueeze(0) < first_eos.unsqueeze(1)
    return (masked & before).any(dim=1)


def whole_step(forward: Callable[[], torch.Tensor], pick, buf: StepBuffers, block: BlockState,
               rule: TransferRule) -> torch.Tensor:
    """One denoising step on the device: the block's tokens into the step's last B queries, the
    forward, a token and confidence per position (``pick``), the transfer rule, the block updated in
    place; returns [R] "still masked before EOS?" after the step. Fixed shapes, no host reads (with
    :func:`sampling.greedy_pick`), so a CUDA graph captures all of it; run eagerly it is the eager twin."""
    size = block.tokens.shape[1]
    masked = block.tokens == rule.mask_id                                    # [R, B]
    needed = pending_rows(block.tokens, masked, rule.eos_id)                  # [R]
    buf.tokens[:, buf.tokens.shape[1] - size:].copy_(block.tokens)
    logits = forward()                                                       # [R, B, V]
    tokens, conf = pick(logits)
    transfer = choose_transfer(masked, conf, rule.settings, 0, (rule.count,))
    block.tokens.copy_(torch.where(transfer, tokens, block.tokens))
    block.conf.copy_(torch.where(transfer, conf, block.conf))
    block.last.copy_(tokens)
    block.last_conf.copy_(conf)
    block.steps.add_(needed)
    return pending_rows(block.tokens, block.tokens == rule.mask_id, rule.eos_id)


@dataclass
class ARState:
    """An autoregressive (B = 1) decode in fixed device buffers that :func:`ar_step` reads and writes."""

    out: torch.Tensor           # [R, slots] long: the answer so far, EOS beyond it
    t: torch.Tensor             # [1] long: response offset of the token the next step feeds
    done: torch.Tensor          # [R] bool: EOS produced
    conf: torch.Tensor          # [R, slots] float32: the probability each answer token was chosen with

    @classmethod
    def empty(cls, rows: int, slots: int, device: torch.device) -> "ARState":
        return cls(torch.zeros(rows, slots, dtype=torch.long, device=device),
                   torch.zeros(1, dtype=torch.long, device=device), torch.zeros(rows, dtype=torch.bool, device=device),
                   torch.ones(rows, slots, device=device))

    def reset(self, eos_id: int) -> None:
        """Before a decode: no answer (EOS everywhere), t = 0, every row done until its first token."""
        self.out.fill_(eos_id)
        self.t.zero_()
        self.done.fill_(True)
        self.conf.fill_(1.0)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.out, self.t, self.done, self.conf


def ar_step(forward: Callable[[], torch.Tensor], pick, text: QwenTextForward, buf: StepBuffers, ar: ARState,
            prefix: StaticPrefix, eos_id: int) -> torch.Tensor:
    """One AR step on the device: token ``t`` of the answer into its cache slot ``prefix.base_t + t`` (position
    ``prefix.next_position + t``, attending to the prompt and response slots [0, t]), the forward, token
    ``t + 1`` chosen (``pick``) and written, ``t`` advanced; returns [R] "EOS produced?". The step's
    plan (slots, positions, cos/sin, mask) is computed here from the device counter, so with
    :func:`sampling.greedy_pick` one CUDA graph replays every token of a key-span bucket with no host work."""
    rows, t = ar.out.shape[0], ar.t
    base, prompt_valid, next_position = prefix.base_t, prefix.prompt_valid, prefix.next_position
    buf.tokens.copy_(ar.out.gather(1, t.expand(rows, 1)))
    buf.slots.copy_((base + t).unsqueeze(1))
    buf.positions.copy_((next_position + t).view(1, rows, 1).expand(3, rows, 1))
    cos, sin = text.rope(buf.positions)
    buf.cos.copy_(cos)
    buf.sin.copy_(sin)
    slot = torch.arange(prompt_valid.shape[1], device=prompt_valid.device)
    visible = prompt_valid | ((slot >= base.unsqueeze(1)) & (slot <= (base + t).unsqueeze(1)))
    buf.mask[:, 0, 0].copy_(visible)
    tokens, conf = pick(forward())                                            # [R, 1]
    ar.out.scatter_(1, (t + 1).expand(rows, 1), tokens)
    ar.conf.scatter_(1, (t + 1).expand(rows, 1), conf)
    ar.done.logical_or_(tokens[:, 0] == eos_id)
    ar.t.add_(1)
    return ar.done
