"""Static block-diffusion decoding: a preallocated KV cache, a fixed-shape step, fused commits.

The algorithm, the settings and the tokens are those of the plain decoder (decoder.py; bit-exact in
float32 on CPU, pinned by test/test_static_decoder.py); the cost structure is gpt-fast's:

1. prefill - the prompt runs once through our own Qwen3-VL text forward (:class:`QwenTextForward`,
             the model's own modules; image/video features and DeepStack come from transformers)
             and its K/V are written in place into a :class:`StaticKVCache` allocated beforehand;
2. denoise - :func:`forward_step` forwards a [batch, block] token buffer: it writes the block's K/V
             into the block's own cache slots and attends to prefix + block. Inside a block every
             shape and buffer is fixed and nothing is read back by the host (the thing a CUDA graph
             captures, see static_graphs.py); caches are never concatenated or cropped;
3. commit  - fused: the commit of block b and the first denoise step of block b + 1 are ONE forward
             over 2B queries (block b sees the prefix and itself, block b + 1 sees both), so a block
             costs S_b forwards instead of S_b + 1; no commit after the last block;
4. stop    - a sequence stops as soon as EOS is fixed with nothing masked before it; the host reads
             the remaining-mask state every ``mask_check_interval`` steps (every step when sampling).

Attention backends: ``sdpa`` (default, the reference; prompts left-padded in the cache exactly like
the plain path) and ``flashinfer`` (static_flashinfer.py: packed prompts, paged KV). Ascend NPUs run
the same code with SDPA, inverse-CDF sampling and NPU synchronisation for timing.

    from wam_diff2_core.decoding import make_decoder
    decoder = make_decoder(loaded.model, loaded.config, implementation="static", cuda_graphs=True)
    decoder.warmup(batch_sizes=(1,))          # captures the graphs before a node reports ready
    out = decoder.generate(processor_batch)   # DecodeOutput, as the plain decoder
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..config import ConfigError, DecodingSettings, DiffusionConfig, EngineSettings
from .decoder import VISION_KEYS, DecodeOutput, DecodeStats, PhaseTimer, record_block
from .masks import prompt_block_mask, response_positions
from .sampling import choose_transfer, device_settings, sample_tokens, transfer_schedule
from .static_graphs import StepGraphs, batch_bucket

log = logging.getLogger(__name__)

PAGE_SIZE = 16          # cache slots per FlashInfer page; capacities are rounded up to it
GRAPH_SPAN_BUCKET = 256  # with CUDA graphs, SDPA attends to slots [0, span) with span a multiple of this


# ---------------------------------------------------------------------------------- KV cache
class StaticKVCache:
    """K/V of every layer for ``rows`` sequences of ``slots`` tokens, allocated once, written in place.

    Layout [layers, rows, slots, kv_heads, head_dim]: a row's slots are contiguous, so the same memory
    is also a FlashInfer paged cache (NHD) whose row r owns pages r * slots / page_size onwards.
    Unwritten slots hold zeros and are never attended (masks, page tables).
    """

    def __init__(self, layers: int, rows: int, slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, page_size: int = PAGE_SIZE, graphed: bool = False):
        slots = -(-slots // page_size) * page_size
        self.graphed = graphed          # the CUDA-graph cache (allocated once) rather than an eager call's
        shape = (layers, rows, slots, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size
        self.step_buffers: dict[tuple, "StepBuffers"] = {}   # fixed step inputs over this cache, by shape

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def slots(self) -> int:
        return self.k.shape[2]

    def fits(self, rows: int, slots: int) -> bool:
        return rows <= self.rows and slots <= self.slots

    def write(self, layer: int, rows: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [..., kv_heads, head_dim] at (rows, slots) (index tensors of shape [...])."""
        self.k[layer].index_put_((rows, slots), k)
        self.v[layer].index_put_((rows, slots), v)

    def read(self, layer: int, rows: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots [0, span) as SDPA wants them: [rows, kv_heads, span, head_dim] views."""
        return self.k[layer, :rows, :span].transpose(1, 2), self.v[layer, :rows, :span].transpose(1, 2)

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashInfer's view: (k, v), each [rows * slots / page_size, page_size, kv_heads, head_dim]."""
        _, rows, slots, heads, dim = self.k.shape
        shape = (rows * slots // self.page_size, self.page_size, heads, dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def data_ptrs(self) -> tuple[int, int]:
        return self.k.data_ptr(), self.v.data_ptr()


# ---------------------------------------------------------------------------------- text forward
def _rotary():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
    return apply_rotary_pos_emb


class QwenTextForward:
    """Qwen3-VL's text decoder run by hand over the model's own modules (no weight is copied).

    The ops are transformers' Qwen3VLTextDecoderLayer's, in the same order, so results are
    bit-identical in float32 on CPU; what differs is where K/V go (a StaticKVCache, in place) and
    who computes attention (a backend reading that cache).
    """

    def __init__(self, model):
        lm = model.model.language_model
        self.embed_tokens, self.layers, self.norm = lm.embed_tokens, lm.layers, lm.norm
        self.rotary_emb, self.lm_head = lm.rotary_emb, model.lm_head
        cfg = lm.config
        self.num_layers = len(lm.layers)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype, self.device = self.embed_tokens.weight.dtype, self.embed_tokens.weight.device
        self.apply_rotary = _rotary()

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MRoPE cos/sin [N, Q, head_dim] for position ids [3, N, Q] (the model's own rotary module)."""
        return self.rotary_emb(self.embed_tokens.weight, positions)

    def layers_forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       write: Callable, attend: Callable, deepstack=None) -> torch.Tensor:
        """hidden [N, Q, hidden] -> final-normed hidden. ``write(layer, k, v)`` stores the new K/V
        ([N, Q, kv_heads, head_dim]) before ``attend(layer, attn_module, q)`` ([N, H, Q, D] ->
        [N, Q, H, D]) reads them. ``deepstack``: (visual position mask, per-layer features)."""
        n, length = hidden.shape[:2]
        shape = (n, length, -1, self.head_dim)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)      # [N, H, Q, D]
            k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)      # [N, KVH, Q, D]
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = self.apply_rotary(q, k, cos, sin)
            write(i, k.transpose(1, 2), v.transpose(1, 2))
            out = attend(i, attn, q)                                         # [N, Q, H, D]
            hidden = hidden + attn.o_proj(out.reshape(n, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if deepstack is not None and deepstack[1] is not None and i < len(deepstack[1]):
                hidden = _add_deepstack(hidden, deepstack[0], deepstack[1][i])
        return self.norm(hidden)


def _add_deepstack(hidden: torch.Tensor, visual_mask: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """DeepStack: the vision tower's intermediate features are added at the visual positions after
    the first layers (as transformers' Qwen3VLTextModel does)."""
    hidden = hidden.clone()
    hidden[visual_mask, :] = hidden[visual_mask, :] + features.to(hidden.device, hidden.dtype)
    return hidden


class _TextInputsReady(Exception):
    pass


def text_model_inputs(model, input_ids, attention_mask, positions, mm_types, vision):
    """(inputs_embeds, visual position mask, DeepStack features) exactly as transformers' Qwen3VLModel
    hands them to its text model: we run that forward and stop it at the text model's door, so the
    vision tower, the merger and the placeholder scatter are transformers' own code."""
    captured: dict[str, Any] = {}

    def stop(_module, _args, kwargs):
        captured.update(kwargs)
        raise _TextInputsReady

    handle = model.model.language_model.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    mm_token_type_ids=mm_types, **vision)
    except _TextInputsReady:
        pass
    finally:
        handle.remove()
    return captured["inputs_embeds"], captured.get("visual_pos_masks"), captured.get("deepstack_visual_embeds")


# ---------------------------------------------------------------------------------- SDPA backend
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
        from .static_flashinfer import FlashInferAttention
        return FlashInferAttention(text, use_cuda_graph=cuda_graphs)
    raise ConfigError(f"attention_backend: {name!r} is not one of sdpa, flashinfer")


# ---------------------------------------------------------------------------------- step buffers
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


def forward_step(text: QwenTextForward, cache: StaticKVCache, attention, buf: StepBuffers) -> torch.Tensor:
    """The denoise step as a pure function of fixed-shape buffers (what a CUDA graph captures).

    Embeds ``buf.tokens``, writes their K/V into ``buf.slots``, attends through ``attention`` and
    returns the logits of the last ``buf.out_rows`` queries [R, out_rows, V]. No host reads.
    """
    hidden = text.embed_tokens(buf.tokens)
    hidden = text.layers_forward(
        hidden, buf.cos, buf.sin,
        write=lambda i, k, v: cache.write(i, buf.rows, buf.slots, k, v),
        attend=lambda i, attn, q: attention.step(i, attn, q, cache, buf))
    return text.lm_head(hidden[:, hidden.shape[1] - buf.out_rows:])


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


# ---------------------------------------------------------------------------------- prefill
@dataclass
class PromptPlan:
    """Where the prompt's K/V go and how its attention is masked."""

    length: int                         # T, the padded prompt length
    rows: torch.Tensor                  # [M] or [N, T] cache rows of the stored tokens
    slots: torch.Tensor                 # same shape: cache slots
    select: tuple | None                # (row, token) indices of the stored tokens; None = all
    mask: torch.Tensor | None           # [N, 1, T, T] block-causal (SDPA)
    lengths: list[int]                  # host: P_n, real prompt tokens per row
    block_size: int


@dataclass
class StaticPrefix:
    """What the prefill leaves for decoding (rows beyond the batch pad a CUDA graph bucket)."""

    n: int                              # sequences in the batch
    base: list[int]                     # host: first response slot of each row
    base_t: torch.Tensor                # [R] the same on the device
    prompt_valid: torch.Tensor          # [R, slots] prompt slots that may be attended
    next_position: torch.Tensor         # [R] MRoPE position of response offset 0
    last_logits: torch.Tensor           # [N, V] logits at the last prompt token (AR)


@dataclass
class _Run:
    """Per-call choice of cache, row count (a graph bucket or the batch) and execution mode."""

    cache: StaticKVCache
    rows: int
    graphed: bool
    span_bucket: int


# ---------------------------------------------------------------------------------- decoder
class StaticBlockDiffusionDecoder:
    """Block-diffusion (and B = 1 autoregressive) decoding over a static KV cache; see module doc."""

    def __init__(self, model, config: DiffusionConfig, engine: EngineSettings | None = None, *,
                 span_bucket: int | None = None):
        engine = (engine or EngineSettings(implementation="static")).validated()
        if engine.implementation != "static":
            raise ConfigError(f"implementation: {engine.implementation!r} given to the static decoder")
        self.model, self.config, self.engine = model, config, engine
        self.text = QwenTextForward(model)
        self.device = self.text.device
        if engine.attention_backend == "flashinfer" and self.device.type != "cuda":
            raise ConfigError(f"attention_backend: flashinfer needs a CUDA device (model is on {self.device})")
        self.banned = torch.tensor(config.banned_token_ids, dtype=torch.long, device=self.device)
        self.graphs = StepGraphs(self.device, enabled=engine.cuda_graphs)
        self.attention = make_attention(engine.attention_backend, self.text, self.graphs.enabled)
        # SDPA attends to slots [0, span): the exact span eagerly (bit-exact with the plain path), a
        # multiple of GRAPH_SPAN_BUCKET under graphs (one graph per bucket, not one per block).
        # ``span_bucket`` forces a bucket for every call (tests run the graph-shaped step on CPU).
        self.span_bucket = span_bucket
        self.cache: StaticKVCache | None = None          # eager calls (grows between calls only)
        self.graph_cache: StaticKVCache | None = None    # graphed calls (allocated once)
        self.forwards_run = 0                            # model forwards after the prefill, all calls

    # ------------------------------------------------------------ cache and execution mode
    def _new_cache(self, rows: int, slots: int, graphed: bool = False) -> StaticKVCache:
        t = self.text
        return StaticKVCache(t.num_layers, rows, slots, t.num_kv_heads, t.head_dim, t.dtype, self.device,
                             graphed=graphed)

    def _begin(self, n: int, slots: int) -> _Run:
        if self.graphs.enabled:
            rows = batch_bucket(n, self.engine.max_graph_batch)
            if rows is None or slots > self.engine.max_context_tokens:
                log.warning("batch %d x %d slots is outside the CUDA graph buckets (max_graph_batch %d, "
                            "max_context_tokens %d): this call runs eagerly", n, slots,
                            self.engine.max_graph_batch, self.engine.max_context_tokens)
            else:
                if self.graph_cache is None:
                    self.graph_cache = self._new_cache(self.engine.max_graph_batch, self.engine.max_context_tokens,
                                                       graphed=True)
                bucket = GRAPH_SPAN_BUCKET if self.span_bucket is None else self.span_bucket
                return _Run(self.graph_cache, rows, True, bucket)
        if self.cache is None or not self.cache.fits(n, slots):
            old = self.cache                         # grow to cover both calls, never shrink
            self.cache = self._new_cache(max(n, old.rows if old else 0), max(slots, old.slots if old else 0))
        return _Run(self.cache, n, False, self.span_bucket or 0)

    # ------------------------------------------------------------ prefill
    def prefill(self, inputs: Mapping[str, torch.Tensor], block_size: int, run: _Run) -> StaticPrefix:
        input_ids = inputs["input_ids"].to(self.device)
        attention_mask = inputs["attention_mask"].to(self.device)
        mm_types = inputs.get("mm_token_type_ids")
        mm_types = (torch.zeros_like(input_ids) if mm_types is None else mm_types).to(self.device)
        vision = {k: inputs[k].to(self.device) for k in VISION_KEYS if inputs.get(k) is not None}
        if "pixel_values" in vision:
            vision["pixel_values"] = vision["pixel_values"].to(self.model.dtype)
        positions, _ = self.model.model.get_rope_index(
            input_ids, mm_token_type_ids=mm_types, image_grid_thw=vision.get("image_grid_thw"),
            video_grid_thw=vision.get("video_grid_thw"), attention_mask=attention_mask)      # [3, N, T]
        embeds, visual_mask, deepstack = text_model_inputs(self.model, input_ids, attention_mask, positions,
                                                           mm_types, vision)
        n, length = input_ids.shape
        valid = attention_mask.bool()
        lengths = valid.sum(dim=1).tolist()
        plan = self._prompt_plan(valid, lengths, block_size)
        self.attention.begin_prompt(plan, run.cache)
        cos, sin = self.text.rope(positions)
        cache = run.cache

        def write(i, k, v):
            if plan.select is not None:
                k, v = k[plan.select], v[plan.select]
            cache.write(i, plan.rows, plan.slots, k, v)

        hidden = self.text.layers_forward(
            embeds, cos, sin, write=write,
            attend=lambda i, attn, q: self.attention.prompt(i, attn, q, cache, plan),
            deepstack=(visual_mask, deepstack))
        last_logits = self.text.lm_head(hidden[:, -1:])[:, -1]
        next_position = positions.masked_fill(~valid.unsqueeze(0), -1).amax(dim=(0, 2)) + 1      # [N]

        # Rows beyond the batch (a graph bucket) get an empty prompt; their outputs are never read.
        rows, slots = run.rows, cache.slots
        base = ([length] * n) if plan.select is None else list(lengths)
        base += [length] * (rows - n)
        slot = torch.arange(slots, device=self.device)
        prompt_valid = torch.zeros(rows, slots, dtype=torch.bool, device=self.device)
        if plan.select is None:
            prompt_valid[:n, :length] = valid
        else:
            prompt_valid[:n] = slot.unsqueeze(0) < torch.tensor(lengths, device=self.device).unsqueeze(1)
        next_pos = torch.zeros(rows, dtype=next_position.dtype, device=self.device)
        next_pos[:n] = next_position
        return StaticPrefix(n=n, base=base, base_t=torch.tensor(base, device=self.device),
                            prompt_valid=prompt_valid, next_position=next_pos, last_logits=last_logits)

    def _prompt_plan(self, valid: torch.Tensor, lengths: list[int], block_size: int) -> PromptPlan:
        n, length = valid.shape
        dev = self.device
        if not self.attention.packed_prompts:   # left-padded, as the plain path's cache
            rows = torch.arange(n, device=dev).unsqueeze(1).expand(n, length)
            slots = torch.arange(length, device=dev).unsqueeze(0).expand(n, length)
            return PromptPlan(length, rows, slots, None, prompt_block_mask(valid, block_size), lengths, block_size)
        row_idx, tok_idx = valid.nonzero(as_tuple=True)                  # real tokens, row-major
        pad = torch.tensor([length - p for p in lengths], device=dev)
        return PromptPlan(length, row_idx, tok_idx - pad[row_idx], (row_idx, tok_idx), None, lengths, block_size)

    # ------------------------------------------------------------ one forward
    def _plan(self, run: _Run, prefix: StaticPrefix, segments: Sequence[tuple[int, int]]) -> StepBuffers:
        """Fill the fixed buffers of a step over response ``segments`` [(offset, length)]; built once
        per block (per token for AR). Returns the buffers the step (or its graph) reads."""
        rows, slots = run.rows, run.cache.slots
        queries = sum(length for _, length in segments)
        key = (rows, tuple(length for _, length in segments))
        buf = run.cache.step_buffers.get(key)
        dev, text = self.device, self.text
        if buf is None:
            buf = StepBuffers(
                tokens=torch.zeros(rows, queries, dtype=torch.long, device=dev),
                rows=torch.arange(rows, device=dev).unsqueeze(1).expand(rows, queries).contiguous(),
                slots=torch.zeros(rows, queries, dtype=torch.long, device=dev),
                positions=torch.zeros(3, rows, queries, dtype=torch.long, device=dev),
                cos=torch.zeros(rows, queries, text.head_dim, dtype=text.dtype, device=dev),
                sin=torch.zeros(rows, queries, text.head_dim, dtype=text.dtype, device=dev),
                mask=torch.zeros(rows, 1, queries, slots, dtype=torch.bool, device=dev),
                out_rows=segments[-1][1])
            run.cache.step_buffers[key] = buf
        slot = torch.arange(slots, device=dev)
        start, bounds, groups, kv_lengths = 0, [], [], [[] for _ in range(rows)]
        for offset, length in segments:
            stop = start + length
            end = offset + length                                   # response slots visible: [0, end)
            steps = torch.arange(offset, end, device=dev)
            buf.slots[:, start:stop] = prefix.base_t.unsqueeze(1) + steps
            # cos/sin per segment, at the plain path's shapes (elementwise kernels stay bit-identical).
            positions = response_positions(prefix.next_position, offset, length)      # [3, R, length]
            cos, sin = text.rope(positions)
            buf.positions[:, :, start:stop], buf.cos[:, start:stop], buf.sin[:, start:stop] = positions, cos, sin
            visible = prefix.prompt_valid | ((slot >= prefix.base_t.unsqueeze(1))
                                             & (slot < (prefix.base_t + end).unsqueeze(1)))   # [R, slots]
            buf.mask[:, 0, start:stop] = visible.unsqueeze(1)
            span = max(prefix.base) + end
            if run.span_bucket:
                span = min(slots, -(-span // run.span_bucket) * run.span_bucket)
            if groups and groups[-1].span == span:
                groups[-1] = QueryGroup(groups[-1].start, stop, span)
            else:
                groups.append(QueryGroup(start, stop, span))
            for r in range(rows):
                kv_lengths[r].append(prefix.base[r] + end)
            bounds.append((start, stop))
            start = stop
        buf.segments, buf.groups, buf.kv_lengths = tuple(bounds), tuple(groups), kv_lengths
        self.attention.begin(buf, run.cache)
        return buf

    def _forward(self, run: _Run, buf: StepBuffers) -> torch.Tensor:
        self.forwards_run += 1
        cache, attention, text = run.cache, self.attention, self.text
        step = lambda: forward_step(text, cache, attention, buf)   # noqa: E731
        if run.graphed:
            return self.graphs.run(attention.graph_key(buf), step)
        return step()

    # ------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, inputs: Mapping[str, torch.Tensor], settings: DecodingSettings | None = None,
                 generators: Sequence[torch.Generator | None] | None = None) -> DecodeOutput:
        """Decode a (left-padded) processor batch; the same contract as BlockDiffusionDecoder.generate."""
        settings = device_settings(settings or self.config.settings, self.device.type)
        n, length = inputs["input_ids"].shape
        if generators is not None and len(generators) != n:
            raise ValueError(f"generators: expected {n}, got {len(generators)}")
        size = settings.block_size
        answer_slots = settings.max_new_tokens if size == 1 else -(-settings.max_new_tokens // size) * size
        run = self._begin(n, length + answer_slots)
        timer = PhaseTimer(self.device)
        with timer("prefill"):
            prefix = self.prefill(inputs, size, run)
        if size == 1:
            result = self._generate_ar(run, prefix, settings, generators, timer)
        else:
            result = self._generate_blocks(run, prefix, settings, generators, timer)
        for stats in result.stats:
            stats.prefill_ms, stats.denoise_ms, stats.commit_ms = (
                timer.totals["prefill"], timer.totals["denoise"], timer.totals["commit"])
        return result

    def _generate_blocks(self, run: _Run, prefix: StaticPrefix, settings: DecodingSettings,
                         generators, timer: PhaseTimer) -> DecodeOutput:
        n, rows, size = prefix.n, run.rows, settings.block_size
        mask_id, eos_id = self.config.mask_token_id, self.config.eos_token_id
        n_blocks = -(-settings.max_new_tokens // size)
        schedule = transfer_schedule(size, settings.denoising_steps)
        # Random draws are consumed only by sequences that still need them (batch == single), so
        # the host must know those every step when sampling.
        interval = 1 if settings.temperature > 0 else settings.mask_check_interval
        fused = self.engine.fused_commit
        stats = [DecodeStats(block_size=size) for _ in range(n)]
        done = [False] * n
        answer: list[list[int]] = [[] for _ in range(n)]
        previous = None                                     # last block's tokens, not yet committed
        for k in range(n_blocks):
            live = [i for i in range(n) if not done[i]]
            block = torch.full((rows, size), mask_id, dtype=torch.long, device=self.device)
            block[[i for i in range(rows) if i >= n or done[i]]] = eos_id   # nothing to fill there
            if previous is not None and not fused:
                with timer("commit"):
                    buf = self._plan(run, prefix, [((k - 1) * size, size)])
                    buf.tokens.copy_(previous)
                    self._forward(run, buf)
                for i in live:
                    stats[i].commit_forwards += 1
            steps = torch.zeros(rows, dtype=torch.long, device=self.device)
            last_tokens, active, step_buf = block[:n], [True] * n, None
            with timer("denoise"):
                for step in range(settings.denoising_steps):
                    masked = block == mask_id                                       # [R, B]
                    pending = _pending(block, masked, eos_id)                       # [R]
                    if step % interval == 0:
                        active = pending[:n].tolist()
                        if not any(active):
                            break
                    if step == 0 and previous is not None and fused:
                        # Commit of block k-1 + first step of block k: one forward, 2B queries.
                        buf = self._plan(run, prefix, [((k - 1) * size, size), (k * size, size)])
                        buf.tokens[:, :size].copy_(previous)
                        buf.tokens[:, size:].copy_(block)
                    else:
                        if step_buf is None:
                            step_buf = self._plan(run, prefix, [(k * size, size)])
                        buf = step_buf
                        buf.tokens.copy_(block)
                    logits = self._forward(run, buf)[:n]                            # [N, B, V]
                    sample_rows = [i for i in range(n) if active[i]]
                    last_tokens, conf = sample_tokens(logits, settings, self.banned, generators, sample_rows)
                    transfer = choose_transfer(masked[:n], conf, settings, step, schedule)
                    block[:n] = torch.where(transfer, last_tokens, block[:n])
                    steps += pending
                # Positions still masked after S steps take the last step's tokens.
                block[:n] = torch.where(block[:n] == mask_id, last_tokens, block[:n])
            record_block(block[:n].tolist(), steps[:n].tolist(), live, eos_id, stats, answer, done)
            if all(done) or k == n_blocks - 1:
                break
            previous = block
        for i in range(n):
            answer[i] = answer[i][:settings.max_new_tokens]
            stats[i].tokens = len(answer[i])
            stats[i].forwards = stats[i].denoise_steps + stats[i].commit_forwards
        return DecodeOutput(sequences=answer, finished=done, stats=stats)

    def _generate_ar(self, run: _Run, prefix: StaticPrefix, settings: DecodingSettings,
                     generators, timer: PhaseTimer) -> DecodeOutput:
        """B = 1: causal next-token decoding; each forward writes one token's K/V in place."""
        n, eos_id, limit = prefix.n, self.config.eos_token_id, settings.max_new_tokens
        interval = 1 if settings.temperature > 0 else settings.mask_check_interval
        out = torch.full((n, limit), eos_id, dtype=torch.long, device=self.device)
        done = [False] * n
        logits = prefix.last_logits.unsqueeze(1)                                    # [N, 1, V]
        with timer("denoise"):
            for t in range(limit):
                tokens, _ = sample_tokens(logits, settings, self.banned, generators,
                                          [i for i in range(n) if not done[i]])
                out[:, t] = tokens[:, 0]
                if t % interval == 0 or t == limit - 1:
                    done = (out[:, :t + 1] == eos_id).any(dim=1).tolist()
                if all(done) or t == limit - 1:
                    break
                buf = self._plan(run, prefix, [(t, 1)])
                buf.tokens[:n].copy_(out[:, t:t + 1])
                logits = self._forward(run, buf)[:n]
        stats = [DecodeStats(block_size=1) for _ in range(n)]
        sequences, finished = [], []
        for i, row in enumerate(out.tolist()):
            end = row.index(eos_id) if eos_id in row else None
            sequences.append(row if end is None else row[:end])
            finished.append(end is not None)
            produced = limit if end is None else end + 1                  # sampled tokens, EOS included
            s = stats[i]
            s.steps_per_block, s.denoise_steps, s.blocks = [1] * produced, produced, produced
            s.forwards, s.tokens = produced - 1, len(sequences[i])
        return DecodeOutput(sequences=sequences, finished=finished, stats=stats)

    # ------------------------------------------------------------ warm-up
    @torch.no_grad()
    def warmup(self, batch_sizes: Sequence[int] = (1,), prompt_tokens: int = 64,
               settings: DecodingSettings | None = None) -> dict[str, Any]:
        """Run every step shape once per batch size (denoise step, fused commit + step, or the AR step)
        so that CUDA graphs are captured before the first request; a node calls this before it
        reports ready. With SDPA, graphs are per key-span bucket: pass a typical prompt length."""
        settings = settings or self.config.settings
        size = settings.block_size
        shapes = [[(0, 1)]] if size == 1 else [[(0, size)], [(0, size), (size, size)]]
        filler = self.config.eos_token_id
        for batch in batch_sizes:
            prompt = torch.full((batch, prompt_tokens), filler, dtype=torch.long)
            run = self._begin(batch, prompt_tokens + 2 * size)
            prefix = self.prefill({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}, size, run)
            for segments in shapes:
                self._forward(run, self._plan(run, prefix, segments))
        _synchronize(self.device)
        return {"cuda_graphs": self.graphs.enabled, "graphs": len(self.graphs.graphs),
                "graph_fallbacks": dict(self.graphs.failures), "attention_backend": self.attention.name}


def _synchronize(device: torch.device) -> None:
    PhaseTimer(device).sync()


def _pending(block: torch.Tensor, masked: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[R] True where a masked position remains before the first fixed EOS: the row needs more steps.
    (Positions after a fixed EOS cannot change the answer, which is truncated there.)"""
    size = block.shape[1]
    is_eos = block == eos_id
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), size)
    before = torch.arange(size, device=block.device).unsqueeze(0) < first_eos.unsqueeze(1)
    return (masked & before).any(dim=1)
