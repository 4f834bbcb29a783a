"""Static block-diffusion decoding: the loop over a preallocated KV cache, whole-step graphs, fused commits.

The algorithm, the settings and the tokens are those of the plain decoder (decoder.py; bit-exact in
float32 on CPU, pinned by test/test_static_decoder.py); the cost structure is gpt-fast's. The parts:

- ``kv_cache.py``     :class:`StaticKVCache`, allocated once, written in place;
- ``text_forward.py`` Qwen3-VL's text decoder over the model's own modules (:class:`QwenTextForward`);
- ``attention.py``    the attention backends: SDPA (reference) and FlashInfer (``attention_flashinfer.py``);
- ``step.py``         one step: fixed buffers, :func:`forward_step`, :func:`whole_step`;
- ``cuda_graphs.py``  capture-once, replay-many graphs per step shape, eager fallback;
- this file           the loop:

1. prefill - the prompt runs once through the text forward and its K/V are written in place;
2. denoise - each step is :func:`whole_step`: the forward of the block against prefix + block (its K/V
             into the block's own slots), the token choice, the transfer rule and the "still masked?"
             flag, in fixed shapes on the device, one CUDA graph each (per batch bucket, key span, step
             rule and token choice); greedy, the host reads the flag every ``mask_check_interval`` steps.
             Sampling (temperature > 0) draws only for the rows still decoding (so a sequence decodes
             alone as in any batch), so the host reads the flag every step: while every row still draws,
             the step is one graph, bound to the decoder's own generators, which take the request's
             generator states for the call and hand them back (sampling.bound_generators); once a row has
             finished its block, only the forward is graphed and the draws run eagerly;
3. commit  - fused: the commit of block b and the first denoise step of block b + 1 are ONE forward
             over 2B queries (block b sees the prefix and itself, block b + 1 sees both), so a block
             costs S_b forwards instead of S_b + 1; no commit after the last block;
4. stop    - a sequence stops as soon as EOS is fixed with nothing masked before it.

With ``engine.compile_forward`` every step's forward is :func:`step.compiled_forward_step` (torch.compile,
fullgraph, static shapes), over the graphed path's fixed cache and batch / key-span buckets also without
graphs, so each step shape compiles once (at warm-up); under graphs the compiled forward is what is captured.
On CUDA every SDPA step runs under the pinned kernels of ``attention.SDPA_STEP_BACKENDS``.

B = 1 (autoregressive) is the same loop with one token per step (:func:`ar_step`): the step computes its
own slots, positions and mask from a device counter, so greedy AR decoding is one graph replay per token
(per key-span bucket) and the host reads the EOS flags every ``mask_check_interval`` tokens.

Ascend NPUs run the same code with SDPA, inverse-CDF sampling and NPU synchronisation for timing.

    from wam_diff2_core.decoding import make_decoder
    decoder = make_decoder(loaded.model, loaded.config, implementation="static", cuda_graphs=True)
    decoder.warmup(batch_sizes=(1,))          # captures the graphs before a node reports ready
    out = decoder.generate(processor_batch)   # DecodeOutput, as the plain decoder
    state = decoder.begin(processor_batch, block_size=32, answer_slots=64)   # or one step at a time:
    logits = decoder.forward(state, decoder.plan_step(state, [(0, 32)]))     # [R, 32, V]
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from contextlib import nullcontext
from typing import Any, Callable, Hashable, Mapping, Sequence

import torch

from ..config import ConfigError, DecodingSettings, DiffusionConfig, EngineSettings
from .attention import PromptPlan, make_attention, sdpa_step_backends
from .common import VISION_KEYS, DecodeOutput, DecodeStats, PhaseTimer, record_block
from .cuda_graphs import MutatingStep, StepGraphs, batch_bucket
from .kv_cache import StaticKVCache
from .masks import prompt_block_mask, response_positions
from .sampling import bound_generators, check_greedy_rows, device_settings, sample_tokens, transfer_schedule
from .step import (ARState, BlockState, QueryGroup, StepBuffers, TransferRule, ar_step, compiled_forward_step,
                   forward_step, greedy_pick, whole_step)
from .text_forward import QwenTextForward, text_model_inputs

log = logging.getLogger(__name__)

GRAPH_SPAN_BUCKET = 256  # with CUDA graphs, SDPA attends to slots [0, span) with span a multiple of this
WARMUP_PROMPT_TOKENS = 64  # the warm-up prompt without graphs (or of a backend whose graphs ignore spans)


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
    compiled: bool = False      # steps run the compiled forward (engine.compile_forward, inside the buckets)


@dataclass(frozen=True)
class _Pick:
    """The token choice of a step, the graph tag of its whole step (None: only its forward is graphed)
    and the generators it draws from (registered with that graph)."""

    fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    tag: Hashable | None
    generators: tuple[torch.Generator, ...] = ()


@dataclass
class DecodeState:
    """A prefilled batch, ready for steps (:meth:`StaticBlockDiffusionDecoder.begin`)."""

    run: _Run
    prefix: StaticPrefix

    @property
    def rows(self) -> int:
        return self.run.rows


# ---------------------------------------------------------------------------------- decoder
class StaticBlockDiffusionDecoder:
    """Block-diffusion (and B = 1 autoregressive) decoding over a static KV cache; see module doc."""

    def __init__(self, model, config: DiffusionConfig, engine: EngineSettings | None = None, *,
                 span_bucket: int | None = None, graph_emulation: bool = False):
        engine = (engine or EngineSettings(implementation="static")).validated()
        if engine.implementation != "static":
            raise ConfigError(f"implementation: {engine.implementation!r} given to the static decoder")
        self.model, self.config, self.engine = model, config, engine
        self.text = QwenTextForward(model)
        self.device = self.text.device
        if engine.attention_backend == "flashinfer" and self.device.type != "cuda":
            raise ConfigError(f"attention_backend: flashinfer needs a CUDA device (model is on {self.device})")
        self.banned = torch.tensor(config.banned_token_ids, dtype=torch.long, device=self.device)
        self._greedy = _Pick(greedy_pick(self.banned), "greedy")
        self._own_generators: list[torch.Generator] = []  # sampling graphs draw from these (fixed objects)
        # ``graph_emulation``: the graphed path on any device, each graph a kept closure (cuda_graphs.py;
        # what CI checks the capture rules and fixed buffers with).
        self.graphs = StepGraphs(self.device, enabled=engine.cuda_graphs or graph_emulation, emulate=graph_emulation,
                                 compiles=engine.compile_forward)
        # ``compile_forward``: every step's forward through torch.compile (step.compiled_forward_step), over the
        # fixed cache and the batch / span buckets of the graphed path (one compiled graph per step shape).
        self._compiled_forward = compiled_forward_step(self.device) if engine.compile_forward else None
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
        compiled = self._compiled_forward is not None
        if self.graphs.enabled or compiled:
            rows = batch_bucket(n, self.engine.max_graph_batch)
            if rows is None or slots > self.engine.max_context_tokens:
                log.warning("batch %d x %d slots is outside the CUDA graph / compiled buckets (max_graph_batch %d, "
                            "max_context_tokens %d): this call runs eagerly", n, slots,
                            self.engine.max_graph_batch, self.engine.max_context_tokens)
            else:
                if self.graph_cache is None:
                    self.graph_cache = self._new_cache(self.engine.max_graph_batch, self.engine.max_context_tokens,
                                                       graphed=True)
                bucket = GRAPH_SPAN_BUCKET if self.span_bucket is None else self.span_bucket
                return _Run(self.graph_cache, rows, self.graphs.enabled, bucket, compiled)
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
        return StaticPrefix(n=n, base=base, base_t=_fixed(run, "base", torch.tensor(base, device=self.device)),
                            prompt_valid=_fixed(run, "prompt_valid", prompt_valid),
                            next_position=_fixed(run, "next_position", next_pos), last_logits=last_logits)

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
            span = self._key_span(run, prefix, end)
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

    @staticmethod
    def _key_span(run: _Run, prefix: StaticPrefix, end: int) -> int:
        """Cache slots [0, span) a step attends to when response slots [0, end) are visible: exact
        eagerly, rounded up to the run's span bucket under graphs (a graph key)."""
        span = max(prefix.base) + end
        if run.span_bucket:
            span = min(run.cache.slots, -(-span // run.span_bucket) * run.span_bucket)
        return span

    def _step_forward(self, run: _Run, buf: StepBuffers) -> Callable[[], torch.Tensor]:
        """The forward of a step over ``buf``: :func:`forward_step` (compiled when the run is), SDPA under
        the device's pinned kernels (attention.SDPA_STEP_BACKENDS). A graph captures this call."""
        cache, attention, text = run.cache, self.attention, self.text
        fn = self._compiled_forward if run.compiled else forward_step
        pinned = attention.name == "sdpa"

        def forward() -> torch.Tensor:
            with sdpa_step_backends(self.device) if pinned else nullcontext():
                return fn(text, cache, attention, buf)
        return forward

    def _forward(self, run: _Run, buf: StepBuffers) -> torch.Tensor:
        self.forwards_run += 1
        attention = self.attention
        step = self._step_forward(run, buf)
        if run.graphed:
            return self.graphs.run(attention.graph_key(buf), step)
        return step()

    def _block_state(self, run: _Run, size: int) -> BlockState:
        """The block buffers of this cache and row count (fixed addresses: whole-step graphs use them)."""
        key = ("block", run.rows, size)
        state = run.cache.step_buffers.get(key)
        if state is None:
            state = run.cache.step_buffers[key] = BlockState.empty(run.rows, size, self.device)
        return state

    def _run_step(self, run: _Run, buf: StepBuffers, step, mutable: Sequence[torch.Tensor], tag,
                  pick: _Pick) -> torch.Tensor:
        """One whole step ``step(forward)`` over ``buf`` (:func:`whole_step` or :func:`ar_step`). Under
        CUDA graphs it is one graph keyed by the buffers' shape, ``tag`` and the pick's tag when the pick
        has one, else only its forward is graphed."""
        attention = self.attention
        forward = self._step_forward(run, buf)
        self.forwards_run += 1
        if not run.graphed:
            return step(forward)
        graphed_forward = lambda: self.graphs.run(attention.graph_key(buf), forward)   # noqa: E731
        if pick.tag is None:
            return step(graphed_forward)
        return self.graphs.run((*attention.graph_key(buf), tag, pick.tag),
                               MutatingStep(lambda: step(forward), mutable, pick.generators),
                               fallback=lambda: step(graphed_forward))

    def _denoise_step(self, run: _Run, buf: StepBuffers, block: BlockState, rule: TransferRule,
                      pick: _Pick) -> torch.Tensor:
        """One :func:`whole_step` over ``buf`` (a denoise step, or the fused commit + step); returns the
        [R] still-masked flag on the device."""
        return self._run_step(run, buf, lambda forward: whole_step(forward, pick.fn, buf, block, rule),
                              block.tensors(), rule, pick)

    def _pick(self, settings: DecodingSettings, generators, rows: Sequence[int], n: int,
              greedy_rows: Sequence[int] = ()) -> _Pick:
        """The token choice of a step that draws for ``rows`` of the ``n`` sequences (``greedy_rows`` at
        temperature 0). Greedy steps graph whole; a sampling step does while every sequence still draws
        (the graph's draws are then the plain decoder's) from the device's default generator or from bound
        generators (:meth:`_bind`); with greedy rows beside sampled ones only the forward is graphed."""
        if settings.temperature == 0:
            return self._greedy
        fn = lambda logits: sample_tokens(logits, settings, self.banned, generators, rows, greedy_rows)  # noqa: E731
        own = tuple(generators[:n]) if generators is not None else ()
        if greedy_rows or len(rows) < n or (own and any(g not in self._own_generators for g in own)):
            return _Pick(fn, None)
        tag = ("sample", n, settings.temperature, settings.top_k, settings.top_p, settings.sampler, bool(own))
        return _Pick(fn, tag, own)

    def _bind(self, run: _Run, settings: DecodingSettings, generators):
        """The generators a sampling decode draws from and the context that binds them: under CUDA graphs
        the decoder's own (a graph is bound to fixed generator objects), holding the request's states for
        the call (handed back at its end); otherwise the request's own (also when rows share a generator:
        their draws interleave, which separate bound copies would not)."""
        if (not run.graphed or settings.temperature == 0 or generators is None
                or len({id(g) for g in generators}) < len(generators)
                or any(g is None or g.device.type != self.device.type for g in generators)):
            return generators, nullcontext()
        while len(self._own_generators) < run.rows:
            self._own_generators.append(torch.Generator(device=self.device))
        own = self._own_generators[:len(generators)]
        return own, bound_generators(own, generators)

    # ------------------------------------------------------------ public single-step API
    def begin(self, inputs: Mapping[str, torch.Tensor], block_size: int, answer_slots: int) -> "DecodeState":
        """Allocate (a graph bucket, or an eager cache of the batch) and prefill: the state that
        :meth:`plan_step` and :meth:`forward` work on (what ``generate`` does before its loop)."""
        n, length = inputs["input_ids"].shape
        run = self._begin(n, length + answer_slots)
        return DecodeState(run, self.prefill(inputs, block_size, run))

    def plan_step(self, state: "DecodeState", segments: Sequence[tuple[int, int]]) -> StepBuffers:
        """The fixed buffers of one forward over response ``segments`` [(offset, length)]: [(kB, B)] a
        denoise step of block k, [((k-1)B, B), (kB, B)] the fused commit + step, [(t, 1)] an AR step.
        Write the step's tokens into ``buffers.tokens`` [R, queries]."""
        return self._plan(state.run, state.prefix, segments)

    def forward(self, state: "DecodeState", buf: StepBuffers) -> torch.Tensor:
        """One forward (a CUDA graph replay when the state is graphed): logits [R, out_rows, V]."""
        return self._forward(state.run, buf)

    # ------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, inputs: Mapping[str, torch.Tensor], settings: DecodingSettings | None = None,
                 generators: Sequence[torch.Generator | None] | None = None,
                 greedy_rows: Sequence[int] = ()) -> DecodeOutput:
        """Decode a (left-padded) processor batch; the same contract as BlockDiffusionDecoder.generate."""
        settings = device_settings(settings or self.config.settings, self.device.type)
        n, length = inputs["input_ids"].shape
        if generators is not None and len(generators) != n:
            raise ValueError(f"generators: expected {n}, got {len(generators)}")
        greedy_rows = check_greedy_rows(greedy_rows, n)
        size = settings.block_size
        answer_slots = settings.max_new_tokens if size == 1 else -(-settings.max_new_tokens // size) * size
        run = self._begin(n, length + answer_slots)
        timer = PhaseTimer(self.device)
        with timer("prefill"):
            prefix = self.prefill(inputs, size, run)
        generators, bound = self._bind(run, settings, generators)
        with bound:
            if size == 1:
                result = self._generate_ar(run, prefix, settings, generators, timer, greedy_rows)
            else:
                result = self._generate_blocks(run, prefix, settings, generators, timer, greedy_rows)
        for stats in result.stats:
            stats.prefill_ms, stats.denoise_ms, stats.commit_ms = (
                timer.totals["prefill"], timer.totals["denoise"], timer.totals["commit"])
        return result

    def _generate_blocks(self, run: _Run, prefix: StaticPrefix, settings: DecodingSettings,
                         generators, timer: PhaseTimer, greedy_rows: Sequence[int] = ()) -> DecodeOutput:
        n, rows, size = prefix.n, run.rows, settings.block_size
        mask_id, eos_id = self.config.mask_token_id, self.config.eos_token_id
        n_blocks = -(-settings.max_new_tokens // size)
        schedule = transfer_schedule(size, settings.denoising_steps)
        # Random draws are consumed only by sequences that still need them (batch == single), so
        # the host must know those every step when sampling.
        greedy = settings.temperature == 0
        interval = settings.mask_check_interval if greedy else 1
        fused = self.engine.fused_commit
        stats = [DecodeStats(block_size=size) for _ in range(n)]
        done = [False] * n
        answer: list[list[int]] = [[] for _ in range(n)]
        block = self._block_state(run, size)
        previous = None                                     # last block's tokens, not yet committed
        for k in range(n_blocks):
            live = [i for i in range(n) if not done[i]]
            block.tokens.fill_(mask_id)
            block.tokens[[i for i in range(rows) if i >= n or done[i]]] = eos_id   # nothing to fill there
            block.steps.zero_()
            if previous is not None and not fused:
                with timer("commit"):
                    buf = self._plan(run, prefix, [((k - 1) * size, size)])
                    buf.tokens.copy_(previous)
                    self._forward(run, buf)
                for i in live:
                    stats[i].commit_forwards += 1
            still_masked, active, step_buf = None, [not d for d in done], None
            with timer("denoise"):
                for step in range(settings.denoising_steps):
                    if still_masked is not None and step % interval == 0:
                        active = still_masked[:n].tolist()                          # the one host read
                        if not any(active):
                            break
                    if step == 0 and previous is not None and fused:
                        # Commit of block k-1 + first step of block k: one forward, 2B queries.
                        buf = self._plan(run, prefix, [((k - 1) * size, size), (k * size, size)])
                        buf.tokens[:, :size].copy_(previous)
                    else:
                        if step_buf is None:
                            step_buf = self._plan(run, prefix, [(k * size, size)])
                        buf = step_buf
                    pick = self._pick(settings, generators, [i for i in range(n) if active[i]], n, greedy_rows)
                    rule = TransferRule.at_step(settings, step, schedule, mask_id, eos_id)
                    still_masked = self._denoise_step(run, buf, block, rule, pick)
                # Positions still masked after S steps take the last step's tokens.
                block.tokens.copy_(torch.where(block.tokens == mask_id, block.last, block.tokens))
            record_block(block.tokens[:n].tolist(), block.steps[:n].tolist(), live, eos_id, stats, answer, done)
            if all(done) or k == n_blocks - 1:
                break
            previous = block.tokens.clone()
        for i in range(n):
            answer[i] = answer[i][:settings.max_new_tokens]
            stats[i].tokens = len(answer[i])
            stats[i].forwards = stats[i].denoise_steps + stats[i].commit_forwards
        return DecodeOutput(sequences=answer, finished=done, stats=stats)

    def _ar_state(self, run: _Run) -> ARState:
        key = ("ar", run.rows)
        state = run.cache.step_buffers.get(key)
        if state is None:
            state = run.cache.step_buffers[key] = ARState.empty(run.rows, run.cache.slots, self.device)
        return state

    def _ar_step(self, run: _Run, prefix: StaticPrefix, buf: StepBuffers, ar: ARState, t: int,
                 pick: _Pick) -> torch.Tensor:
        """Feed answer token ``t`` (:func:`ar_step`); the host sets only what it knows without reading
        the device: the key span of token ``t`` (a graph key) and, for FlashInfer, the plan."""
        buf.groups = (QueryGroup(0, 1, self._key_span(run, prefix, t + 1)),)
        buf.kv_lengths = [[b + t + 1] for b in prefix.base]
        self.attention.begin(buf, run.cache)
        args = (self.text, buf, ar, prefix.base_t, prefix.prompt_valid, prefix.next_position, self.config.eos_token_id)
        return self._run_step(run, buf, lambda forward: ar_step(forward, pick.fn, *args), ar.tensors(), "ar", pick)

    def _generate_ar(self, run: _Run, prefix: StaticPrefix, settings: DecodingSettings,
                     generators, timer: PhaseTimer, greedy_rows: Sequence[int] = ()) -> DecodeOutput:
        """B = 1: causal next-token decoding, one :func:`ar_step` per token (a whole-step graph, sampling
        while every sequence still draws); the host reads the EOS flags every ``mask_check_interval``
        tokens (every token when sampling: only sequences still decoding draw random numbers)."""
        n, eos_id, limit = prefix.n, self.config.eos_token_id, settings.max_new_tokens
        greedy = settings.temperature == 0
        interval = settings.mask_check_interval if greedy else 1
        ar = self._ar_state(run)
        ar.reset(eos_id)                                        # rows beyond the batch stay done
        tokens, _ = sample_tokens(prefix.last_logits.unsqueeze(1), settings, self.banned, generators, range(n),
                                  greedy_rows)
        ar.out[:n, 0] = tokens[:, 0]
        ar.done[:n] = tokens[:, 0] == eos_id
        buf = self._plan(run, prefix, [(0, 1)])
        with timer("denoise"):
            for t in range(limit - 1):                          # feed token t, choose token t + 1
                if t % interval == 0:
                    done = ar.done[:n].tolist()                 # the one host read
                    if all(done):
                        break
                pick = self._pick(settings, generators, [i for i in range(n) if not done[i]], n, greedy_rows)
                self._ar_step(run, prefix, buf, ar, t, pick)
        stats = [DecodeStats(block_size=1) for _ in range(n)]
        sequences, finished = [], []
        for i, row in enumerate(ar.out[:n, :limit].tolist()):
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
    def warmup(self, batch_sizes: Sequence[int] = (1,), prompt_tokens: int | None = None,
               settings: DecodingSettings | None = None) -> dict[str, Any]:
        """Run every step shape once per batch size (denoise step, fused commit + step, or the AR step;
        as whole steps, block steps once per transfer rule of ``settings``; sampling, also the bare
        forward that steps run once a row has finished) so that CUDA graphs are captured before the
        first request; a node calls this before it reports ready. Under graphs, ``prompt_tokens=None``
        (the default) warms prompt lengths that reach every key-span bucket up to ``max_context_tokens``
        (:meth:`_warmup_lengths`), so a decode never captures; a length warms only the spans of that
        prompt. Sampling graphs are those of seeded requests (per-sequence generators) and are kept per
        batch size, greedy ones per batch bucket: warm the batch sizes that will come."""
        settings = settings or self.config.settings
        size = settings.block_size
        shapes = [[(0, 1)]] if size == 1 else [[(0, size)], [(0, size), (size, size)]]
        mask_id, eos_id = self.config.mask_token_id, self.config.eos_token_id
        schedule = transfer_schedule(size, settings.denoising_steps)
        rules = {TransferRule.at_step(settings, step, schedule, mask_id, eos_id) for step in range(len(schedule))}
        lengths = [prompt_tokens] if prompt_tokens is not None else self._warmup_lengths(size)
        for batch in batch_sizes:
            for length in lengths:
                prompt = torch.full((batch, length), eos_id, dtype=torch.long)
                run = self._begin(batch, length + 2 * size)
                prefix = self.prefill({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}, size, run)
                generators, bound = self._bind(run, settings,
                                               [torch.Generator(device=self.device) for _ in range(batch)])
                with bound:
                    pick = self._pick(settings, generators, range(batch), batch)
                    for segments in shapes:
                        buf = self._plan(run, prefix, segments)
                        if settings.temperature > 0:
                            self._forward(run, buf)
                        if size == 1:                                  # the AR whole step, from token 0
                            ar = self._ar_state(run)
                            ar.reset(eos_id)
                            self._ar_step(run, prefix, buf, ar, 0, pick)
                            continue
                        block = self._block_state(run, size)
                        for rule in sorted(rules, key=lambda r: r.count):
                            block.tokens.fill_(mask_id)
                            self._denoise_step(run, buf, block, rule, pick)
        _synchronize(self.device)
        return {"cuda_graphs": self.graphs.enabled, "graphs": len(self.graphs.graphs),
                "graph_fallbacks": dict(self.graphs.failures), "attention_backend": self.attention.name}

    def _warmup_lengths(self, size: int) -> list[int]:
        """Prompt lengths whose warm-up steps meet every key span of a decode: per span bucket [top - b, top),
        one length whose steps stay inside it (top - 2B) and one whose fused step reaches into the next
        bucket (top - B). Without graphs (or with a backend whose graphs ignore spans) one typical length."""
        if not (self.graphs.enabled or self._compiled_forward) or self.attention.name != "sdpa":
            return [WARMUP_PROMPT_TOKENS]
        bucket = GRAPH_SPAN_BUCKET if self.span_bucket is None else self.span_bucket
        limit = self.engine.max_context_tokens
        lengths = {top - back for top in range(bucket, limit + 1, bucket) for back in (2 * size, size)}
        return sorted(p for p in lengths if 1 <= p and p + 2 * size <= limit)


def _fixed(run: _Run, name: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` copied into the run's cache's own tensor ``name`` (one per row count; its shape is the
    same every call): a step graph keeps the addresses it captured, so what it reads must not move."""
    key = ("prefix", name, run.rows)
    fixed = run.cache.step_buffers.get(key)
    if fixed is None or fixed.shape != value.shape:
        fixed = run.cache.step_buffers[key] = torch.empty_like(value)
    return fixed.copy_(value)


def _synchronize(device: torch.device) -> None:
    PhaseTimer(device).sync()
