"""The static decoder's graphed path under emulated CUDA graphs (cuda_graphs.StepGraphs(emulate=True)): each
"graph" is the closure of its capture, replayed on the tensors it captured, and every capture first runs
under the host-sync check (HostSyncCheck), so CPU-only CI sees what a GPU would refuse or get wrong.

Both failed on the code before the fix (cuda_graphs.py / sampling.py / static.py of commit 18e4510):
- ``ban_tokens`` stored -inf with ``logits[..., banned] = -inf`` (an ``index_put_`` of a host scalar: a
  blocking host-to-device copy), so the host-sync check refused every whole step (graph fallbacks, and on
  a GPU no whole-step graph would capture);
- with that fixed, the AR whole step read ``prefix.base_t`` / ``prompt_valid`` / ``next_position``, which
  the prefill allocated afresh each call: a replay read the capturing call's prefix, so every B = 1 decode
  after the first (and the first after ``warmup()``) gave other tokens than the plain decoder.
"""
from __future__ import annotations

import logging

import pytest
import torch

from test.support.decoder_prompts import encode
from wam_diff2_core.config import EngineSettings
from wam_diff2_core.decoding.cuda_graphs import CaptureError, HostSyncCheck, KeyedForward, MutatingStep, StepGraphs
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.sampling import ban_tokens, seeded_generators
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder

# Every call below fits one key-span bucket (256 slots): different prompt lengths replay the same graphs.
GRAPHED = EngineSettings(implementation="static", cuda_graphs=True, max_context_tokens=256, max_graph_batch=4)
CALLS = [(0,), (2,), (1,), (0, 1, 2), (1, 2), (0,)]          # prompt lengths 47, 54, 22, 3 x 54, 2 x 54, 47


@pytest.fixture(scope="module")
def batches(tiny_model):
    return {key: encode(tiny_model.processor, key) for key in set(CALLS)}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("block", [1, 8, 32])
def test_emulated_graphs_equal_plain_across_calls(tiny_model, batches, block, temperature):
    """Warm-up, then several calls of different prompt lengths and batch sizes in one bucket: every forward
    is a graph replay (no fallback, no eager step), the tokens are the plain decoder's, call after call."""
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, confidence_threshold=0.7,
                                    max_new_tokens=40, temperature=temperature, top_k=20 if temperature else 0)
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, GRAPHED, graph_emulation=True)
    plain = BlockDiffusionDecoder(tiny_model.model, cfg)
    summary = static.warmup(batch_sizes=(1,), prompt_tokens=47, settings=settings)
    assert summary["cuda_graphs"] and summary["graphs"] > 0 and not summary["graph_fallbacks"]
    for prompts in CALLS:
        batch, n = batches[prompts], len(prompts)
        forwards, replays = static.forwards_run, static.graphs.replays
        got = static.generate(batch, settings, seeded_generators(range(n), "cpu"))
        want = plain.generate(batch, settings, seeded_generators(range(n), "cpu"))
        assert got.sequences == want.sequences and got.finished == want.finished, prompts
        assert static.forwards_run - forwards == static.graphs.replays - replays > 0, prompts
    assert not static.graphs.failures
    assert static.cache is None                                   # nothing ran outside the graph cache


@pytest.mark.parametrize("block,temperature", [(8, 0.0), (8, 1.0), (1, 0.0)])
def test_warmup_captures_every_span_bucket_so_decoding_captures_nothing(tiny_model, batches, block, temperature):
    """warmup() without a prompt length reaches every key-span bucket up to max_context_tokens (here two
    buckets of 64 slots; prompts of 22-54 tokens with 40 answer tokens cross into the second): no decode
    captures a graph afterwards, and the tokens are plain's."""
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, confidence_threshold=0.7,
                                    max_new_tokens=40, temperature=temperature)
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, GRAPHED.replace(max_context_tokens=128),
                                         span_bucket=64, graph_emulation=True)
    plain = BlockDiffusionDecoder(tiny_model.model, cfg)
    static.warmup(batch_sizes=(1, 2, 3), settings=settings)          # the batch sizes that come
    captured = dict(static.graphs.graphs)
    spans = {group.span for key in captured for group in key[3]}
    assert spans == {64, 128}
    for prompts in CALLS:
        batch, n = batches[prompts], len(prompts)
        got = static.generate(batch, settings, seeded_generators(range(n), "cpu"))
        assert got.sequences == plain.generate(batch, settings, seeded_generators(range(n), "cpu")).sequences
    assert static.graphs.graphs.keys() == captured.keys() and not static.graphs.failures


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real graphs): scripts/device_check.sh")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("block", [1, 8, 32])
def test_cuda_graphs_equal_plain_across_calls(tiny_checkpoint, block, temperature):
    """The same ladder with real CUDA graphs (float32): captured at warm-up, replayed across calls."""
    from wam_diff2_core.model.checkpoint import load_checkpoint
    m = load_checkpoint(tiny_checkpoint, device="cuda", dtype="float32")
    settings = m.config.settings.replace(block_size=block, denoising_steps=block, confidence_threshold=0.7,
                                         max_new_tokens=40, temperature=temperature, top_k=20 if temperature else 0)
    static = StaticBlockDiffusionDecoder(m.model, m.config, GRAPHED)
    plain = BlockDiffusionDecoder(m.model, m.config)
    assert not static.warmup(batch_sizes=(1,), prompt_tokens=47, settings=settings)["graph_fallbacks"]
    for prompts in CALLS:
        batch, n = encode(m.processor, prompts), len(prompts)
        got = static.generate(batch, settings, seeded_generators(range(n), "cuda"))
        want = plain.generate(batch, settings, seeded_generators(range(n), "cuda"))
        assert got.sequences == want.sequences, prompts
    assert not static.graphs.failures and static.graphs.replays > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real graphs): scripts/device_check.sh")
def test_compiled_forward_in_cuda_graphs_equals_plain_across_calls(tiny_checkpoint):
    """engine.compile_forward inside real CUDA graphs (float32, Block-8 greedy): each step shape compiled
    before the capture rules apply (autotuning synchronises), captured, replayed across calls."""
    from wam_diff2_core.model.checkpoint import load_checkpoint
    m = load_checkpoint(tiny_checkpoint, device="cuda", dtype="float32")
    settings = m.config.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7, max_new_tokens=40)
    static = StaticBlockDiffusionDecoder(m.model, m.config, GRAPHED.replace(compile_forward=True))
    plain = BlockDiffusionDecoder(m.model, m.config)
    assert not static.warmup(batch_sizes=(1,), prompt_tokens=47, settings=settings)["graph_fallbacks"]
    for prompts in CALLS:
        batch = encode(m.processor, prompts)
        assert static.generate(batch, settings).sequences == plain.generate(batch, settings).sequences, prompts
    assert not static.graphs.failures and static.graphs.replays > 0


@pytest.mark.parametrize("statement,op", [
    (lambda x, i: x.index_put_((i,), torch.tensor(0.5)), "index_put_"),
    (lambda x, i: x.__setitem__((Ellipsis, i), float("-inf")), "index_put_"),
    (lambda x, i: x.sum().item(), "item"),
    (lambda x, i: x[0].tolist(), "tolist"),
    (lambda x, i: bool(x.sum() > 0), "__bool__"),
    (lambda x, i: torch.ops.aten._local_scalar_dense(x.sum()), "_local_scalar_dense"),
    (lambda x, i: x + torch.tensor([1.0, 2.0, 3.0]), "lift_fresh"),
    (lambda x, i: x[x > 0], "boolean mask"),
    (lambda x, i: x.masked_fill_(x > 0, 0.0).nonzero(), "nonzero"),
    (lambda x, i: torch.multinomial(x.softmax(-1), 1), "multinomial"),
])
def test_host_sync_check_refuses_what_a_capture_refuses(statement, op):
    x, idx = torch.randn(2, 3), torch.tensor([0, 2])
    with pytest.raises(CaptureError, match=op):
        with HostSyncCheck():
            statement(x, idx)


def test_host_sync_check_lets_capture_safe_code_through():
    x, idx = torch.randn(2, 3), torch.tensor([0, 2])
    with HostSyncCheck():
        y = x.index_fill(-1, idx, float("-inf"))
        y = y.masked_fill(y > 1, 0.0)
        y[..., 1] = 0.25                                            # basic indexing: a fill, no copy
        y = torch.where(y > 0, y, torch.zeros_like(y)) + torch.arange(3)
        y.scatter_(1, idx.unsqueeze(0).expand(2, 2), 1.0)
    assert y.shape == (2, 3)


def test_ban_tokens_is_capture_safe_and_bans():
    logits, banned = torch.randn(2, 4, 10), torch.tensor([3, 7])
    with HostSyncCheck():
        out = ban_tokens(logits, banned)
    assert torch.isinf(out[..., banned]).all() and torch.equal(out[..., :3], logits[..., :3])
    assert not torch.isinf(logits).any()                           # the caller's logits untouched


def test_a_refused_step_runs_its_fallback_with_state_and_draws_put_back(caplog):
    """A step that reads the device from the host is refused before capture; the key runs its fallback
    from then on, and what the warm-up runs changed (block in place, generator draws) is put back, so the
    fallback draws what the plain decoder would."""
    graphs = StepGraphs(torch.device("cpu"), enabled=True, emulate=True)
    block, gen, alone = torch.zeros(3), torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    ran = []

    def body():
        ran.append("step")
        block.add_(1)
        draw = torch.rand(3, generator=gen)
        return draw if draw.sum().item() >= 0 else -draw            # a host read: refused

    step = MutatingStep(body, (block,), (gen,))
    fallback = lambda: (ran.append("fallback"), torch.rand(3, generator=gen))[1]   # noqa: E731
    with caplog.at_level(logging.WARNING):
        out = graphs.run(("step", 1), step, fallback)
    assert torch.equal(out, torch.rand(3, generator=alone)) and torch.equal(block, torch.zeros(3))
    assert "Tensor.item" in graphs.failures[str(("step", 1))] and "runs its fallback" in caplog.text
    graphs.run(("step", 1), step, fallback)
    assert ran == ["step", "fallback", "fallback"] and not graphs.graphs and graphs.replays == 0
    assert torch.equal(gen.get_state(), (torch.rand(3, generator=alone), alone.get_state())[1])


def test_an_emulated_replay_reads_the_captured_tensors_and_draws_as_eager():
    """Replays rerun the capture's closure into the capture's output: a step that reads a tensor made per
    call keeps reading the first call's (what a real graph does), and sampling replays draw what successive
    eager steps would (warm-up draws put back)."""
    graphs = StepGraphs(torch.device("cpu"), enabled=True, emulate=True)
    gen = torch.Generator().manual_seed(3)
    fixed = torch.zeros(2)
    outputs = []
    for call in range(3):
        per_call = torch.full((2,), float(call))                    # a new tensor every call
        out = graphs.run(("sample", 2), MutatingStep(lambda p=per_call: p + fixed + torch.rand(2, generator=gen), (), (gen,)))
        outputs.append(out.clone())
        assert out is graphs.graphs[("sample", 2)].output          # one output tensor, rewritten by replays
    alone = torch.Generator().manual_seed(3)
    assert all(torch.equal(o, torch.rand(2, generator=alone)) for o in outputs)   # per_call of call 0 = 0
    assert graphs.replays == 3 and not graphs.failures


def test_graphs_stay_off_on_cpu_without_emulation():
    graphs = StepGraphs(torch.device("cpu"), enabled=True)
    assert not graphs.enabled and "CUDA device" in graphs.reason
    assert graphs.run("k", lambda: torch.ones(1)).item() == 1 and not graphs.graphs


def test_run_step_runs_a_step_eagerly_whole_or_around_a_graphed_forward():
    """StepGraphs.run_step, the one graph-or-eager dispatch of the decoders' steps: an unkeyed forward runs
    eagerly with its step; ``whole`` makes step + forward one graph keyed (*forward key, *whole) that puts
    its in-place updates back after capturing; without ``whole`` only the forward is a graph and the step
    around it runs every call. Every call counts one forward."""
    graphs = StepGraphs(torch.device("cpu"), enabled=True, emulate=True)
    source, state = torch.arange(3.0), torch.zeros(3)

    def step(forward, scale):                       # a whole step: forward, then an in-place update
        out = forward() * scale
        state.add_(out)
        return out

    forward = KeyedForward(("fwd",), lambda: source + 1)
    assert torch.equal(graphs.run_step(KeyedForward(None, forward.fn), step, 2.0), (source + 1) * 2)
    assert not graphs.graphs and torch.equal(state, (source + 1) * 2)
    state.zero_()
    for _ in range(2):
        graphs.run_step(forward, step, 2.0, whole=("rule", "greedy"), mutable=(state,))
    assert list(graphs.graphs) == [("fwd", "rule", "greedy")] and torch.equal(state, (source + 1) * 4)
    state.zero_()
    for _ in range(2):
        graphs.run_step(forward, step, 3.0)
    assert ("fwd",) in graphs.graphs and torch.equal(state, (source + 1) * 6)
    assert torch.equal(graphs.run_step(forward), source + 1)
    assert graphs.forwards == 6 and graphs.replays == 5          # a capture is replayed at once
