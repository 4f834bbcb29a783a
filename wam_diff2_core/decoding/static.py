"""Static block-diffusion decoding: the loop over a preallocated KV cache, whole-step graphs, fused commits.

The algorithm, the settings and the tokens are those of the plain decoder (decoder.py; bit-exact in
float32 on CPU, pinned by test/core/decoding/test_static_decoder.py); the cost structure is gpt-fast's. Its parts are
the cache (kv_cache.py), the text forward (text_forward.py), the attention backends (attention.py), one
step (step.py) and its graphs (cuda_graphs.py: every step goes through ``StepGraphs.run_step``, graphed or
eager); this file is the loop:

1. prefill - the prompt runs once through the text forward and its K/V are written in place; rows that
             continue one prompt (``prompt_rows``: candidate plans of a frame) share its prefill, whose K/V
             are then copied to each of them;
2. denoise - each step is :func:`whole_step`: the forward of the block against prefix + block (its K/V
             into the block's own slots), the token choice, the transfer rule and the "still masked?"
             flag, in fixed shapes on the device, one CUDA graph each (per batch bucket, key span, step
             rule and token choice); greedy, the host reads the flag every ``mask_check_interval`` steps.
             Sampling draws only for the rows still decoding (so a sequence decodes alone as in any
             batch), so the host reads the flag every step; the step is one graph while every row still
             draws (on the decoder's own generators: sampling.TokenChoices), else only its forward is;
3. commit  - fused: the commit of block b and the first denoise step of block b + 1 are ONE forward
             over 2B queries (block b sees the prefix and itself, block b + 1 sees both), so a block
             costs S_b forwards instead of S_b + 1; no commit after the last block;
4. stop    - a sequence stops as soon as EOS is fixed with nothing masked before it.

B = 1 (autoregressive) is the same loop with one token per step (:func:`ar_step`, one graph replay per
token). With ``engine.compile_forward`` every step's forward is :func:`step.compiled_forward_step`, over the
graphed path's fixed cache and buckets also without graphs (each step shape compiles once, at warm-up);
under graphs the compiled forward is what is captured. Every layer is text_forward.py's fused forward; on
CUDA every SDPA step pins the kernels of ``attention.SDPA_STEP_BACKENDS`` itself.
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
from functools import partial
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar
from weakref import WeakKeyDictionary

import torch

from ..config import ConfigError, DecodingSettings, DiffusionConfig, EngineSettings
from .attention import AttentionBackend, PromptPlan, SdpaAttention
from .common import DecodeOutput, DecodeStats, PhaseTimer, check_rows, finish_blocks, prompt_inputs, record_block
from .cuda_graphs import KeyedForward, StepGraphs, batch_bucket
from .kv_cache import StaticKVCache
from .layer_ops import resolve_layer_kernels
from .sampling import TokenChoices, device_settings, sample_tokens, transfer_schedule
from .step import (ARState, BlockState, QueryGroup, StaticPrefix, StepBuffers, TransferRule, ar_step,
                   compiled_forward_step, forward_step, whole_step)
from .text_forward import QwenTextForward, text_model_inputs

log = logging.getLogger(__name__)

GRAPH_SPAN_BUCKET = 256  # with CUDA graphs, SDPA attends to slots [0, span) with span a multiple of this
WARMUP_PROMPT_TOKENS = 64  # the warm-up prompt without graphs (or of a backend whose graphs ignore spans)

Fixed = TypeVar("Fixed", StepBuffers, BlockState, ARState, torch.Tensor)


@dataclass
class _Run:
    """Per-call choice of cache, row count (a graph bucket or the batch) and execution mode."""

    cache: StaticKVCache
    memo: dict[Hashable, StepBuffers | BlockState | ARState | torch.Tensor]   # the cache's fixed tensors
    rows: int
    graphed: bool
    span_bucket: int
    compiled: bool = False      # steps run the compiled forward (engine.compile_forward, inside the buckets)

    def fixed(self, key: Hashable, make: Callable[[], Fixed]) -> Fixed:
        """The cache's tensor(s) ``key``, made once: a step graph keeps the addresses it captured, so what
        it reads (step buffers, block and AR state, the prefix's tensors) must not move between calls."""
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = make()
        return value

    def fixed_copy(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` copied into the fixed tensor ``name`` of its shape (:meth:`fixed`; the same every call)."""
        return self.fixed(("prefix", name, tuple(value.shape)), partial(torch.empty_like, value)).copy_(value)


@dataclass
class DecodeState:
    """A prefilled batch, ready for steps (:meth:`StaticBlockDiffusionDecoder.begin`)."""

    run: _Run
    prefix: StaticPrefix

    @property
    def rows(self) -> int:
        return self.run.rows


class StaticBlockDiffusionDecoder:
    """Block-diffusion (and B = 1 autoregressive) decoding over a static KV cache; see module doc."""

    def __init__(self, model, config: DiffusionConfig, engine: EngineSettings | None = None, *,
                 span_bucket: int | None = None, graph_emulation: bool = False):
        engine = (engine or EngineSettings(implementation="static")).validated()
        if engine.implementation != "static":
            raise ConfigError(f"implementation: {engine.implementation!r} given to the static decoder")
        self.model, self.config, self.engine = model, config, engine
        device = next(model.parameters()).device
        head_dim = model.model.language_model.layers[0].self_attn.head_dim
        self.layer_kernels = resolve_layer_kernels(engine.layer_kernels, device, model.dtype, head_dim)
        self.text = QwenTextForward(model, self.layer_kernels)
        self.device = self.text.device
        self.banned = torch.tensor(config.banned_token_ids, dtype=torch.long, device=self.device)
        self.choices = TokenChoices(self.banned, self.device)
        # ``graph_emulation``: the graphed path on any device, each graph a kept closure (cuda_graphs.py;
        # what CI checks the capture rules and fixed buffers with).
        self.graphs = StepGraphs(self.device, enabled=engine.cuda_graphs or graph_emulation, emulate=graph_emulation,
                                 compiles=engine.compile_forward)
        self._compiled_forward = compiled_forward_step(engine.compile_mode) if engine.compile_forward else None
        if engine.attention_backend == "flashinfer":
            from .attention_flashinfer import FlashInferAttention
            self.attention: AttentionBackend = FlashInferAttention(self.text, use_cuda_graph=self.graphs.enabled)
        else:
            self.attention = SdpaAttention(self.text.num_heads // self.text.num_kv_heads)
        # SDPA attends to slots [0, span): the exact span eagerly (bit-exact with the plain path), a
        # multiple of GRAPH_SPAN_BUCKET under graphs (one graph per bucket, not one per block).
        # ``span_bucket`` forces a bucket for every call (tests run the graph-shaped step on CPU).
        self.span_bucket = span_bucket
        self.graph_span_bucket = GRAPH_SPAN_BUCKET if span_bucket is None else span_bucket
        self.cache: StaticKVCache | None = None          # eager calls (grows between calls only)
        self.graph_cache: StaticKVCache | None = None    # graphed calls (allocated once)
        self._memo: WeakKeyDictionary[StaticKVCache, dict] = WeakKeyDictionary()   # _Run.memo, by cache

    @property
    def forwards_run(self) -> int:
        """Model forwards after the prefill, all calls."""
        return self.graphs.forwards

    def _new_cache(self, rows: int, slots: int, graphed: bool = False) -> StaticKVCache:
        t = self.text
        cache = StaticKVCache(t.num_layers, rows, slots, t.num_kv_heads, t.head_dim, t.dtype, self.device,
                              graphed=graphed)
        self._memo[cache] = {}
        return cache

    def _begin(self, n: int, slots: int) -> _Run:
        self.text.check_weights()
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
                return _Run(self.graph_cache, self._memo[self.graph_cache], rows, self.graphs.enabled,
                            self.graph_span_bucket, compiled)
        if self.cache is None or n > self.cache.rows or slots > self.cache.slots:
            old = self.cache                         # grow to cover both calls, never shrink
            self.cache = self._new_cache(max(n, old.rows if old else 0), max(slots, old.slots if old else 0))
        return _Run(self.cache, self._memo[self.cache], n, False, self.span_bucket or 0)

    def prefill(self, inputs: Mapping[str, torch.Tensor], block_size: int, run: _Run,
                prompt_rows: Sequence[int] | None = None) -> StaticPrefix:
        """The prompts through the text forward, K/V into cache rows [0, prompts); with ``prompt_rows``
        (common.check_rows) row i then holds a copy of prompt ``prompt_rows[i]``'s K/V, mask and position."""
        prompt = prompt_inputs(self.model, inputs, self.device)
        embeds, visual_mask, deepstack = text_model_inputs(self.model, prompt.input_ids, prompt.attention_mask,
                                                           prompt.positions, prompt.mm_types, prompt.vision)
        length = prompt.input_ids.shape[1]
        valid = prompt.valid
        lengths = valid.sum(dim=1).tolist()
        plan = PromptPlan.of(valid, lengths, block_size, self.attention.packed_prompts)
        cache = run.cache
        self.attention.begin_prompt(plan, cache)
        cos, sin = self.text.rope(prompt.positions)
        hidden = self.text.layers_forward(embeds, cos, sin, cache, plan.rows, plan.slots,
                                          attend=partial(self.attention.prompt, cache=cache, plan=plan),
                                          deepstack=(visual_mask, deepstack), last=1)
        last_logits = self.text.lm_head(hidden)[:, -1]
        next_position = prompt.next_position
        if prompt_rows is not None:
            index = torch.tensor(prompt_rows, dtype=torch.long, device=self.device)       # [N]
            cache.copy_rows(index, length)          # packed prompts lie inside slots [0, T) too
            valid, next_position, last_logits = valid[index], next_position[index], last_logits[index]
            lengths = [lengths[i] for i in prompt_rows]
        n, rows = valid.shape[0], run.rows

        # Rows beyond the batch (a graph bucket) get an empty prompt; their outputs are never read.
        prompt_valid = torch.zeros(rows, cache.slots, dtype=torch.bool, device=self.device)
        if plan.select is None:
            base = [length] * rows
            prompt_valid[:n, :length] = valid
        else:                                       # packed: row i's prompt in slots [0, P_i)
            base = lengths + [length] * (rows - n)
            slot = torch.arange(cache.slots, device=self.device)
            prompt_valid[:n] = slot < torch.tensor(lengths, device=self.device).unsqueeze(1)
        next_pos = torch.nn.functional.pad(next_position, (0, rows - n))       # [R], 0 beyond the batch
        return StaticPrefix(n=n, base=base, base_t=run.fixed_copy("base", torch.tensor(base, device=self.device)),
                            prompt_valid=run.fixed_copy("prompt_valid", prompt_valid),
                            next_position=run.fixed_copy("next_position", next_pos), last_logits=last_logits)

    def plan_step(self, state: DecodeState, segments: Sequence[tuple[int, int]]) -> StepBuffers:
        """The fixed buffers of one forward over response ``segments`` [(offset, length)], filled once per block
        (per token for AR): [(kB, B)] a denoise step of block k, [((k-1)B, B), (kB, B)] the fused commit + step,
        [(t, 1)] an AR step. Write the step's tokens into ``buffers.tokens`` [R, queries]."""
        run, text = state.run, self.text
        queries = sum(length for _, length in segments)
        buf = run.fixed((run.rows, tuple(length for _, length in segments)),
                        partial(StepBuffers.empty, run.rows, queries, run.cache.slots, segments[-1][1], text.head_dim,
                                text.dtype, self.device))
        buf.fill(text, state.prefix, segments, partial(self._key_span, state))
        self.attention.begin(buf, run.cache)
        return buf

    def _plan_token(self, state: DecodeState, buf: StepBuffers, t: int) -> None:
        """The host's part of the AR step feeding answer token ``t`` (:func:`ar_step` plans the rest from
        its device counter): only what the host knows without reading the device, the key span of token
        ``t`` (a graph key) and, for FlashInfer, the plan."""
        buf.groups = (QueryGroup(0, 1, self._key_span(state, t + 1)),)
        buf.kv_lengths = [[b + t + 1] for b in state.prefix.base]
        self.attention.begin(buf, state.run.cache)

    @staticmethod
    def _key_span(state: DecodeState, end: int) -> int:
        """Cache slots [0, span) a step attends to when response slots [0, end) are visible: exact
        eagerly, rounded up to the run's span bucket under graphs (a graph key)."""
        span, run = max(state.prefix.base) + end, state.run
        if run.span_bucket:
            span = min(run.cache.slots, -(-span // run.span_bucket) * run.span_bucket)
        return span

    def _step_forward(self, run: _Run, buf: StepBuffers) -> KeyedForward:
        """The forward of a step over ``buf`` (what a graph captures), keyed when the run is graphed:
        :func:`forward_step`, compiled when the run is."""
        cache, attention, text = run.cache, self.attention, self.text
        fn = self._compiled_forward if run.compiled else forward_step
        return KeyedForward(attention.graph_key(buf) if run.graphed else None,
                            lambda: fn(text, cache, attention, buf))

    def _block_step(self, run: _Run, buf: StepBuffers, block: BlockState, pick, rule: TransferRule) -> torch.Tensor:
        """One denoising step of ``block`` over ``buf`` (:func:`whole_step`: the forward, the token choice and the
        transfer rule, one graph while the choice graphs); [R] "still masked?" after it."""
        return self.graphs.run_step(self._step_forward(run, buf), whole_step, pick.fn, buf, block, rule,
                                    whole=pick.whole(rule), mutable=block.tensors(), generators=pick.generators)

    def _ar_step(self, state: DecodeState, buf: StepBuffers, ar: ARState, pick) -> torch.Tensor:
        """One AR token (:func:`ar_step`, one graph while the choice graphs); [R] "EOS produced?" after it."""
        return self.graphs.run_step(self._step_forward(state.run, buf), ar_step, pick.fn, self.text, buf, ar,
                                    state.prefix, self.config.eos_token_id, whole=pick.whole("ar"),
                                    mutable=ar.tensors(), generators=pick.generators)

    def _block_state(self, run: _Run, size: int) -> BlockState:
        return run.fixed(("block", run.rows, size), partial(BlockState.empty, run.rows, size, self.device))

    def _ar_state(self, run: _Run) -> ARState:
        return run.fixed(("ar", run.rows), partial(ARState.empty, run.rows, run.cache.slots, self.device))

    def begin(self, inputs: Mapping[str, torch.Tensor], block_size: int, answer_slots: int) -> DecodeState:
        """Allocate (a graph bucket, or an eager cache of the batch) and prefill: the state that
        :meth:`plan_step` and :meth:`forward` work on (what ``generate`` does before its loop)."""
        n, length = inputs["input_ids"].shape
        run = self._begin(n, length + answer_slots)
        return DecodeState(run, self.prefill(inputs, block_size, run))

    def forward(self, state: DecodeState, buf: StepBuffers) -> torch.Tensor:
        """One forward (a CUDA graph replay when the state is graphed): logits [R, out_rows, V]."""
        return self.graphs.run_step(self._step_forward(state.run, buf))

    @torch.no_grad()
    def generate(self, inputs: Mapping[str, torch.Tensor], settings: DecodingSettings | None = None,
                 generators: Sequence[torch.Generator | None] | None = None,
                 greedy_rows: Sequence[int] = (), prompt_rows: Sequence[int] | None = None) -> DecodeOutput:
        """Decode a (left-padded) processor batch; the same contract as BlockDiffusionDecoder.generate."""
        settings = device_settings(settings or self.config.settings, self.device.type)
        prompts, length = inputs["input_ids"].shape
        prompt_rows, n, greedy_rows = check_rows(prompts, prompt_rows, generators, greedy_rows)
        size = settings.block_size
        answer_slots = settings.max_new_tokens if size == 1 else -(-settings.max_new_tokens // size) * size
        run = self._begin(n, length + answer_slots)
        timer = PhaseTimer(self.device)
        with timer("prefill"):
            state = DecodeState(run, self.prefill(inputs, size, run, prompt_rows))
        generators, bound = self.choices.bind(run.graphed, run.rows, settings, generators)
        with bound:
            decode = self._generate_ar if size == 1 else self._generate_blocks
            result = decode(state, settings, generators, timer, greedy_rows)
        timer.stamp(result.stats)
        return result

    def _generate_blocks(self, state: DecodeState, settings: DecodingSettings, generators, timer: PhaseTimer,
                         greedy_rows: Sequence[int]) -> DecodeOutput:
        run, n, size = state.run, state.prefix.n, settings.block_size
        mask_id, eos_id = self.config.mask_token_id, self.config.eos_token_id
        n_blocks = -(-settings.max_new_tokens // size)
        schedule = transfer_schedule(size, settings.denoising_steps)
        # Random draws are consumed only by sequences that still need them (batch == single), so
        # the host must know those every step when sampling.
        interval = settings.mask_check_interval if settings.temperature == 0 else 1
        fused = self.engine.fused_commit
        stats = [DecodeStats(block_size=size) for _ in range(n)]
        done = [False] * n
        answer: list[list[int]] = [[] for _ in range(n)]
        confidences: list[list[float]] = [[] for _ in range(n)]
        block = self._block_state(run, size)
        previous = None                                     # last block's tokens, not yet committed
        for k in range(n_blocks):
            live = [i for i in range(n) if not done[i]]
            block.tokens.fill_(mask_id)
            block.tokens[[i for i in range(run.rows) if i >= n or done[i]]] = eos_id   # nothing to fill there
            block.steps.zero_()
            block.conf.fill_(1.0)
            if previous is not None and not fused:
                with timer("commit"):
                    buf = self.plan_step(state, [((k - 1) * size, size)])
                    buf.tokens.copy_(previous)
                    self.graphs.run_step(self._step_forward(run, buf))
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
                        buf = self.plan_step(state, [((k - 1) * size, size), (k * size, size)])
                        buf.tokens[:, :size].copy_(previous)
                    else:
                        if step_buf is None:
                            step_buf = self.plan_step(state, [(k * size, size)])
                        buf = step_buf
                    pick = self.choices.pick(settings, generators, [i for i in range(n) if active[i]], n,
                                             greedy_rows)
                    rule = TransferRule.at_step(settings, step, schedule, mask_id, eos_id)
                    still_masked = self._block_step(run, buf, block, pick, rule)
                # Positions still masked after S steps take the last step's tokens.
                still = block.tokens == mask_id
                block.tokens.copy_(torch.where(still, block.last, block.tokens))
                block.conf.copy_(torch.where(still, block.last_conf, block.conf))
            record_block(block.tokens[:n].tolist(), block.conf[:n].tolist(), block.steps[:n].tolist(), live, eos_id,
                         stats, answer, confidences, done)
            if all(done) or k == n_blocks - 1:
                break
            previous = block.tokens.clone()
        return finish_blocks(answer, confidences, stats, done, settings.max_new_tokens)

    def _generate_ar(self, state: DecodeState, settings: DecodingSettings, generators, timer: PhaseTimer,
                     greedy_rows: Sequence[int]) -> DecodeOutput:
        """B = 1: causal next-token decoding, one :func:`ar_step` per token (a whole-step graph, sampling
        while every sequence still draws); the host reads the EOS flags every ``mask_check_interval``
        tokens (every token when sampling: only sequences still decoding draw random numbers)."""
        n, eos_id, limit = state.prefix.n, self.config.eos_token_id, settings.max_new_tokens
        interval = settings.mask_check_interval if settings.temperature == 0 else 1
        ar = self._ar_state(state.run)
        ar.reset(eos_id)                                        # rows beyond the batch stay done
        tokens, conf = sample_tokens(state.prefix.last_logits.unsqueeze(1), settings, self.banned, generators,
                                     range(n), greedy_rows)
        ar.out[:n, 0] = tokens[:, 0]
        ar.conf[:n, 0] = conf[:, 0]
        ar.done[:n] = tokens[:, 0] == eos_id
        buf = self.plan_step(state, [(0, 1)])
        with timer("denoise"):
            for t in range(limit - 1):                          # feed token t, choose token t + 1
                if t % interval == 0:
                    done = ar.done[:n].tolist()                 # the one host read
                    if all(done):
                        break
                pick = self.choices.pick(settings, generators, [i for i in range(n) if not done[i]], n,
                                         greedy_rows)
                self._plan_token(state, buf, t)
                self._ar_step(state, buf, ar, pick)
        sequences, finished, confidences, stats = [], [], [], []
        for row, probs in zip(ar.out[:n, :limit].tolist(), ar.conf[:n, :limit].tolist()):
            end = row.index(eos_id) if eos_id in row else limit
            sequences.append(row[:end])
            confidences.append(probs[:end])
            finished.append(end < limit)
            produced = min(limit, end + 1)                                # sampled tokens, EOS included
            stats.append(DecodeStats(block_size=1, forwards=produced - 1, denoise_steps=produced, blocks=produced,
                                     tokens=end, steps_per_block=[1] * produced))
        return DecodeOutput(sequences=sequences, finished=finished, stats=stats, confidences=confidences)

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
                state = self.begin({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}, size, 2 * size)
                run = state.run
                generators, bound = self.choices.bind(run.graphed, run.rows, settings,
                                                      [torch.Generator(device=self.device) for _ in range(batch)])
                with bound:
                    pick = self.choices.pick(settings, generators, range(batch), batch)
                    for segments in shapes:
                        buf = self.plan_step(state, segments)
                        if settings.temperature > 0:
                            self.graphs.run_step(self._step_forward(run, buf))
                        if size == 1:                                  # the AR whole step, from token 0
                            ar = self._ar_state(run)
                            ar.reset(eos_id)
                            self._plan_token(state, buf, 0)
                            self._ar_step(state, buf, ar, pick)
                            continue
                        block = self._block_state(run, size)
                        for rule in sorted(rules, key=lambda r: r.count):
                            block.tokens.fill_(mask_id)
                            self._block_step(run, buf, block, pick, rule)
        PhaseTimer(self.device).sync()
        return {"cuda_graphs": self.graphs.enabled, "graphs": len(self.graphs.graphs),
                "graph_fallbacks": dict(self.graphs.failures), "attention_backend": self.attention.name}

    def _warmup_lengths(self, size: int) -> list[int]:
        """Prompt lengths whose warm-up steps meet every key span of a decode: per span bucket [top - b, top),
        one length whose steps stay inside it (top - 2B) and one whose fused step reaches into the next
        bucket (top - B). Without graphs (or with a backend whose graphs ignore spans) one typical length."""
        if not (self.graphs.enabled or self._compiled_forward) or self.attention.name != "sdpa":
            return [WARMUP_PROMPT_TOKENS]
        bucket, limit = self.graph_span_bucket, self.engine.max_context_tokens
        lengths = {top - back for top in range(bucket, limit + 1, bucket) for back in (2 * size, size)}
        return sorted(p for p in lengths if 1 <= p and p + 2 * size <= limit)
