"""The whole denoising step (decoding/step.py: forward + token choice + transfer rule + still-masked flag)
is capturable: torch.compile(fullgraph=True) traces it with zero graph breaks on CPU, and the eager
twin that the static decoder runs is bit-exact to the plain decoder.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

from test.support.decoder_prompts import encode
from wam_diff2_core.config import EngineSettings
from wam_diff2_core.decoding import static as static_module
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
from wam_diff2_core.decoding.sampling import greedy_pick
from wam_diff2_core.decoding.step import ARState, BlockState, TransferRule, ar_step, forward_step, whole_step
from wam_diff2_core.decoding.sampling import transfer_schedule

STATIC = EngineSettings(implementation="static")


def _step_inputs(tiny_model, strategy, fused):
    cfg = tiny_model.config
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    batch = encode(tiny_model.processor, [0, 1])
    size = 8
    state = static.begin(batch, size, answer_slots=4 * size)
    segments = [(0, size), (size, size)] if fused else [(0, size)]
    buf = static.plan_step(state, segments)
    buf.tokens.fill_(cfg.eos_token_id)
    block = BlockState.empty(state.rows, size, static.device)
    block.tokens.fill_(cfg.mask_token_id)
    settings = cfg.settings.replace(block_size=size, denoising_steps=size, remasking_strategy=strategy,
                                    confidence_threshold=0.7)
    rule = TransferRule.at_step(settings, 0, transfer_schedule(size, size), cfg.mask_token_id, cfg.eos_token_id)
    forward = lambda: forward_step(static.text, state.run.cache, static.attention, buf)   # noqa: E731
    return forward, greedy_pick(static.banned), buf, block, rule


@pytest.mark.parametrize("strategy,fused", [("low_confidence_dynamic", False), ("low_confidence_static", True)])
def test_whole_step_compiles_with_no_graph_break(tiny_model, strategy, fused):
    """fullgraph=True raises at the first graph break; the traced step gives the eager step's result.
    The 'eager' backend runs what Dynamo traced without code generation (a few seconds on CPU)."""
    forward, pick, buf, block, rule = _step_inputs(tiny_model, strategy, fused)
    start = [t.clone() for t in block.tensors()]
    torch._dynamo.reset()
    compiled = torch.compile(whole_step, fullgraph=True, backend="eager")
    with torch.no_grad():
        flag = compiled(forward, pick, buf, block, rule)
        traced = [t.clone() for t in block.tensors()]
        for tensor, value in zip(block.tensors(), start):
            tensor.copy_(value)
        eager_flag = whole_step(forward, pick, buf, block, rule)
    assert torch.equal(flag, eager_flag)
    assert all(torch.equal(a, b) for a, b in zip(traced, block.tensors()))
    assert int(block.steps.sum()) == block.steps.shape[0]                  # every row needed this step
    assert bool((block.tokens != rule.mask_id).any())                     # something was fixed
    explained = torch._dynamo.explain(whole_step)(forward, pick, buf, block, rule)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("block,strategy,interval", [(8, "low_confidence_dynamic", 1), (32, "low_confidence_dynamic", 4),
                                                     (16, "low_confidence_static", 3), (4, "sequential", 1)])
def test_greedy_decode_runs_whole_steps_and_equals_plain(tiny_model, monkeypatch, block, strategy, interval):
    """Greedy decoding is nothing but whole steps (one per forward), bit-exact to the plain decoder."""
    calls = []
    real = static_module.whole_step
    monkeypatch.setattr(static_module, "whole_step", lambda *a: (calls.append(1), real(*a))[1])
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, remasking_strategy=strategy,
                                    confidence_threshold=0.7, max_new_tokens=40, mask_check_interval=interval)
    batch = encode(tiny_model.processor, [0, 1, 2])
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    out = static.generate(batch, settings)
    expected = BlockDiffusionDecoder(tiny_model.model, cfg).generate(batch, settings)
    assert out.sequences == expected.sequences and out.finished == expected.finished
    assert len(calls) == static.forwards_run > 0


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static"])
def test_warmup_runs_every_whole_step_a_greedy_decode_needs(tiny_model, monkeypatch, strategy):
    """The graphed path minus the graphs (CPU): after warmup() a decode of a prompt of the warmed
    length needs no step shape or transfer rule that the warm-up did not run (capture) already."""
    from wam_diff2_core.decoding.cuda_graphs import StepGraphs
    keys = []
    monkeypatch.setattr(StepGraphs, "run", lambda self, key, step, fallback=None: (keys.append(key), step())[1])
    cfg = tiny_model.config
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC.replace(cuda_graphs=True))
    static.graphs.enabled = True
    settings = cfg.settings.replace(block_size=8, denoising_steps=8, remasking_strategy=strategy,
                                    confidence_threshold=0.7, max_new_tokens=24)
    batch = encode(tiny_model.processor, [1])
    static.warmup(batch_sizes=(1,), prompt_tokens=batch["input_ids"].shape[1], settings=settings)
    warmed = set(keys)
    keys.clear()
    out = static.generate(batch, settings)
    assert out.sequences == BlockDiffusionDecoder(tiny_model.model, cfg).generate(batch, settings).sequences
    assert keys and set(keys) <= warmed
    assert all(isinstance(key[-2], TransferRule) and key[-1] == "greedy" for key in keys)   # whole steps only


def _graphed_on_cpu(tiny_model, monkeypatch):
    """The static decoder on its graphed path with StepGraphs running each step eagerly (no GPU here):
    records (key, generators) of every step it would capture or replay."""
    from wam_diff2_core.decoding.cuda_graphs import StepGraphs
    steps = []
    monkeypatch.setattr(StepGraphs, "run", lambda self, key, step, fallback=None: (
        steps.append((key, tuple(getattr(step, "generators", ())))), step())[1])
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC.replace(cuda_graphs=True))
    static.graphs.enabled = True
    return static, steps


@pytest.mark.parametrize("block", [8, 1])
def test_seeded_sampling_graphs_whole_steps_on_the_decoders_own_generators_and_equals_plain(
        tiny_model, monkeypatch, block):
    """Sampling under graphs: while every row still draws, each step is a whole-step graph bound to the
    decoder's own generators (the request's states copied in and handed back), after that only the
    forward is graphed; the tokens, and where the request's generators end, are the plain decoder's."""
    from wam_diff2_core.decoding.sampling import seeded_generators
    static, steps = _graphed_on_cpu(tiny_model, monkeypatch)
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, temperature=1.0, top_k=8,
                                    confidence_threshold=0.7, max_new_tokens=24)
    batch = encode(tiny_model.processor, [0, 1, 2])
    request, alone = seeded_generators([5, 6, 7], "cpu"), seeded_generators([5, 6, 7], "cpu")
    out = static.generate(batch, settings, request)
    expected = BlockDiffusionDecoder(tiny_model.model, cfg).generate(batch, settings, alone)
    assert out.sequences == expected.sequences and out.finished == expected.finished
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(request, alone))
    whole = [gens for key, gens in steps if isinstance(key[-1], tuple) and key[-1][:1] == ("sample",)]
    assert whole and all(gens == tuple(static.choices.own[:3]) for gens in whole)
    assert not any(set(map(id, gens)) & set(map(id, request)) for _, gens in steps)


def test_warmup_captures_the_seeded_sampling_steps_of_a_decode(tiny_model, monkeypatch):
    from wam_diff2_core.decoding.sampling import seeded_generators
    static, steps = _graphed_on_cpu(tiny_model, monkeypatch)
    settings = tiny_model.config.settings.replace(block_size=8, denoising_steps=8, temperature=1.0,
                                                  max_new_tokens=24)
    batch = encode(tiny_model.processor, [1])
    static.warmup(batch_sizes=(1,), prompt_tokens=batch["input_ids"].shape[1], settings=settings)
    warmed = {key for key, _ in steps}
    steps.clear()
    static.generate(batch, settings, seeded_generators([3], "cpu"))
    assert steps and {key for key, _ in steps} <= warmed


def test_ar_step_compiles_with_no_graph_break_and_greedy_ar_is_nothing_but_ar_steps(tiny_model, monkeypatch):
    """The AR step plans itself from its device counter (slots, positions, mask): Dynamo traces it as one
    graph, it matches its eager run, and a greedy B = 1 decode is one ar_step per forward, equal to plain."""
    cfg = tiny_model.config
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    batch = encode(tiny_model.processor, [0, 1])
    state = static.begin(batch, 1, answer_slots=16)
    buf = static.plan_step(state, [(0, 1)])
    ar = ARState.empty(state.rows, state.run.cache.slots, static.device)
    ar.out.fill_(cfg.eos_token_id)
    ar.out[:, 0] = 7
    prefix = state.prefix
    forward = lambda: forward_step(static.text, state.run.cache, static.attention, buf)   # noqa: E731
    args = (forward, greedy_pick(static.banned), static.text, buf, ar, prefix, cfg.eos_token_id)
    start = [t.clone() for t in ar.tensors()]
    torch._dynamo.reset()
    with torch.no_grad():
        flag = torch.compile(ar_step, fullgraph=True, backend="eager")(*args).clone()
        traced = [t.clone() for t in ar.tensors()]
        for tensor, value in zip(ar.tensors(), start):
            tensor.copy_(value)
        assert torch.equal(ar_step(*args), flag)
        assert all(torch.equal(a, b) for a, b in zip(traced, ar.tensors()))
        assert int(ar.t) == 1 and bool((ar.out[:, 1] != cfg.eos_token_id).any())     # token 1 chosen
        explained = torch._dynamo.explain(ar_step)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()

    calls = []
    real = static_module.ar_step
    monkeypatch.setattr(static_module, "ar_step", lambda *a: (calls.append(1), real(*a))[1])
    settings = cfg.settings.replace(block_size=1, max_new_tokens=24, mask_check_interval=3)
    batch = encode(tiny_model.processor, [0, 1, 2])
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    out = static.generate(batch, settings)
    expected = BlockDiffusionDecoder(tiny_model.model, cfg).generate(batch, settings)
    assert out.sequences == expected.sequences and out.finished == expected.finished
    assert [s.forwards for s in out.stats] == [s.forwards for s in expected.stats]
    assert len(calls) == static.forwards_run > 0
