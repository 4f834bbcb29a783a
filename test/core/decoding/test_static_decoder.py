"""The static decoder (decoding/static.py) against the plain decoder: same tokens, fewer forwards.

CPU tests pin exactness in float32 (tokens, prefill K/V, step logits) across block sizes,
strategies, thresholds, sampling settings, batches of different prompt lengths and images; the
fused commit; the mask-check interval; the cache that is never reallocated; device selection and
inverse-CDF sampling. GPU tests (CUDA graphs, FlashInfer) skip without CUDA, with the reason.
"""
from __future__ import annotations

import copy
import logging
import types

import pytest
import torch

from test.support.decoder_prompts import encode
from test.support.flashinfer_double import PagedPrefillDouble
from wam_diff2_core.config import ConfigError, EngineSettings
from wam_diff2_core.decoding import make_decoder
from wam_diff2_core.decoding.attention_flashinfer import flashinfer_problem
from wam_diff2_core.decoding.common import PhaseTimer
from wam_diff2_core.decoding.cuda_graphs import batch_bucket
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.kv_cache import StaticKVCache
from wam_diff2_core.decoding.sampling import device_settings
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
from wam_diff2_core.decoding.step import eager_twin_step, forward_step
from wam_diff2_core.decoding.text_forward import QwenTextForward
from wam_diff2_core.decoding.step import pending_rows as _pending

STATIC = EngineSettings(implementation="static")


def _gens(seed, n):
    return None if seed is None else [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.fixture(scope="module")
def decoders(tiny_model):
    m = tiny_model
    return types.SimpleNamespace(
        plain=BlockDiffusionDecoder(m.model, m.config),
        fused=StaticBlockDiffusionDecoder(m.model, m.config, STATIC),
        unfused=StaticBlockDiffusionDecoder(m.model, m.config, STATIC.replace(fused_commit=False)),
        # the graphed path with emulated graphs (test_graph_emulation.py), shared: later cases replay
        # what earlier ones captured, as a long-lived node does
        graphed=StaticBlockDiffusionDecoder(m.model, m.config, STATIC.replace(cuda_graphs=True, max_context_tokens=256,
                                                                              max_graph_batch=4), graph_emulation=True),
        batches={key: encode(m.processor, key) for key in ((0,), (1,), (2,), (0, 1, 2), (1, 2))})


def _assert_same(plain_out, static_out):
    assert static_out.sequences == plain_out.sequences
    assert static_out.finished == plain_out.finished
    assert [len(c) for c in static_out.confidences] == [len(s) for s in plain_out.sequences]
    for want, got in zip(plain_out.confidences, static_out.confidences):
        assert got == pytest.approx(want, abs=1e-5)
        assert all(0.0 < c <= 1.0 for c in got)
    for a, b in zip(plain_out.stats, static_out.stats):
        assert (b.tokens, b.blocks) == (a.tokens, a.blocks)
        # Identical except that the static path may stop a block early once EOS is fixed with
        # nothing masked before it (the answer is truncated there anyway).
        assert b.steps_per_block[:-1] == a.steps_per_block[:-1]
        assert b.steps_per_block[-1] <= a.steps_per_block[-1]


CASES = [
    # block, steps, strategy, threshold, temperature, top_k, top_p, sampler, seed, prompts
    (4, 4, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None, (0,)),
    (8, 8, "low_confidence_dynamic", 0.5, 0.0, 0, 1.0, "multinomial", None, (0, 1, 2)),
    (16, 16, "low_confidence_dynamic", 0.7, 0.0, 0, 1.0, "multinomial", None, (1,)),
    (32, 32, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None, (0, 1, 2)),
    (32, 8, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None, (2,)),
    (32, 32, "low_confidence_dynamic", 0.3, 0.0, 0, 1.0, "multinomial", None, (1, 2)),
    (8, 4, "low_confidence_static", 0.9, 0.0, 0, 1.0, "multinomial", None, (0, 1, 2)),
    (32, 32, "low_confidence_static", 0.9, 0.0, 0, 1.0, "multinomial", None, (1,)),
    (16, 5, "sequential", 0.9, 0.0, 0, 1.0, "multinomial", None, (0, 1, 2)),
    (4, 4, "sequential", 0.9, 0.0, 0, 1.0, "multinomial", None, (2,)),
    (8, 8, "low_confidence_dynamic", 0.9, 1.0, 0, 1.0, "multinomial", 1, (0, 1, 2)),
    (16, 16, "low_confidence_dynamic", 0.6, 0.7, 20, 0.9, "multinomial", 2, (1,)),
    (32, 32, "low_confidence_static", 0.9, 1.3, 0, 0.8, "inverse_cdf", 3, (0, 1, 2)),
    (4, 4, "low_confidence_dynamic", 0.8, 1.0, 5, 1.0, "inverse_cdf", 4, (0,)),
    (1, 1, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None, (0, 1, 2)),
    (1, 1, "low_confidence_dynamic", 0.9, 1.0, 10, 0.9, "multinomial", 5, (1, 2)),
    (1, 1, "low_confidence_dynamic", 0.9, 0.8, 0, 1.0, "inverse_cdf", 6, (0,)),
]


@pytest.mark.parametrize("block,steps,strategy,threshold,temperature,top_k,top_p,sampler,seed,prompts", CASES)
def test_static_equals_plain(tiny_model, decoders, block, steps, strategy, threshold, temperature, top_k, top_p,
                             sampler, seed, prompts):
    settings = tiny_model.config.settings.replace(
        block_size=block, denoising_steps=steps, remasking_strategy=strategy, confidence_threshold=threshold,
        temperature=temperature, top_k=top_k, top_p=top_p, sampler=sampler, max_new_tokens=40)
    batch = decoders.batches[prompts]
    expected = decoders.plain.generate(batch, settings, _gens(seed, len(prompts)))
    got = decoders.fused.generate(batch, settings, _gens(seed, len(prompts)))
    _assert_same(expected, got)
    assert any(len(s) > 0 for s in expected.sequences)
    _assert_same(expected, decoders.graphed.generate(batch, settings, _gens(seed, len(prompts))))
    assert not decoders.graphed.graphs.failures and decoders.graphed.graphs.replays > 0


@pytest.mark.parametrize("block,prompts", [(8, (0, 1, 2)), (1, (1, 2))])
def test_two_threads(tiny_model, decoders, block, prompts):
    """The suite runs on one thread (conftest); kernels split work differently on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block,
                                                      confidence_threshold=0.6, max_new_tokens=32)
        batch = decoders.batches[prompts]
        _assert_same(decoders.plain.generate(batch, settings), decoders.fused.generate(batch, settings))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [1, 4, 8, 16, 32])
def test_static_equals_plain_sampling_seeds(tiny_model, decoders, seed, block):
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, temperature=0.9,
                                                  top_k=50, confidence_threshold=0.5, max_new_tokens=40)
    batch = decoders.batches[(1, 2)]
    _assert_same(decoders.plain.generate(batch, settings, _gens(100 + seed, 2)),
                 decoders.fused.generate(batch, settings, _gens(100 + seed, 2)))


@pytest.mark.parametrize("block", [4, 8, 32])
def test_fused_commit_equals_unfused_and_costs_s_b_forwards_per_block(tiny_model, decoders, block):
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block,
                                                  confidence_threshold=0.6, max_new_tokens=48)
    batch = decoders.batches[(0,)]
    before_f, before_u = decoders.fused.forwards_run, decoders.unfused.forwards_run
    fused = decoders.fused.generate(batch, settings)
    unfused = decoders.unfused.generate(batch, settings)
    assert fused.sequences == unfused.sequences
    f, u = fused.stats[0], unfused.stats[0]
    assert f.steps_per_block == u.steps_per_block and f.blocks >= 2
    # Fused: S_b forwards per block, nothing else; unfused: S_b + 1, none after the last block.
    assert decoders.fused.forwards_run - before_f == sum(f.steps_per_block) == f.forwards
    assert f.commit_forwards == 0
    assert decoders.unfused.forwards_run - before_u == sum(u.steps_per_block) + u.blocks - 1 == u.forwards
    assert u.commit_forwards == u.blocks - 1


@pytest.mark.parametrize("strategy,temperature", [("low_confidence_dynamic", 0.0), ("low_confidence_static", 0.0),
                                                  ("low_confidence_dynamic", 1.0)])
def test_mask_check_interval_does_not_change_tokens(tiny_model, decoders, strategy, temperature):
    base = tiny_model.config.settings.replace(block_size=8, denoising_steps=8, remasking_strategy=strategy,
                                              temperature=temperature, confidence_threshold=0.6, max_new_tokens=32)
    batch = decoders.batches[(0, 1, 2)]
    reference = decoders.fused.generate(batch, base, _gens(7, 3))
    for interval in (2, 3, 8):
        before = decoders.fused.forwards_run
        out = decoders.fused.generate(batch, base.replace(mask_check_interval=interval), _gens(7, 3))
        assert out.sequences == reference.sequences
        assert [s.steps_per_block for s in out.stats] == [s.steps_per_block for s in reference.stats]
        assert decoders.fused.forwards_run - before >= max(s.forwards for s in reference.stats)


@pytest.mark.parametrize("block", [1, 8])
def test_ar_interval_does_not_change_tokens(tiny_model, decoders, block):
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, max_new_tokens=24)
    batch = decoders.batches[(0, 1, 2)]
    a = decoders.fused.generate(batch, settings)
    b = decoders.fused.generate(batch, settings.replace(mask_check_interval=5))
    assert a.sequences == b.sequences and [_counts(s) for s in a.stats] == [_counts(s) for s in b.stats]


def _counts(stats):
    return {k: v for k, v in stats.as_dict().items() if not k.endswith("_ms")}


def _eos_model(tiny_model):
    """The tiny model with an LM head that always prefers EOS."""
    model = copy.deepcopy(tiny_model.model)
    eos = tiny_model.config.eos_token_id
    with torch.no_grad():
        model.lm_head.weight[eos] = 0
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
        model.lm_head.bias[eos] = 1e4
    return model


def test_stops_once_eos_is_fixed_with_nothing_masked_before_it(tiny_model):
    cfg = tiny_model.config
    model = _eos_model(tiny_model)
    settings = cfg.settings.replace(block_size=16, denoising_steps=16, remasking_strategy="sequential",
                                    max_new_tokens=64)
    batch = encode(tiny_model.processor, [1])
    plain = BlockDiffusionDecoder(model, cfg).generate(batch, settings)
    static = StaticBlockDiffusionDecoder(model, cfg, STATIC)
    out = static.generate(batch, settings)
    assert out.sequences == plain.sequences == [[]] and out.finished == [True]
    assert plain.stats[0].steps_per_block == [16]          # sequential: one position per step
    assert out.stats[0].steps_per_block == [1] and static.forwards_run == 1


def test_pending_rows():
    eos, mask = 9, 7
    block = torch.tensor([[1, eos, mask, mask],     # EOS fixed, masks only after it: done
                          [1, mask, eos, mask],     # a mask before EOS: pending
                          [1, 2, 3, 4],             # nothing masked
                          [mask, mask, mask, mask]])
    assert _pending(block, block == mask, eos).tolist() == [False, True, False, True]


def test_own_prefill_equals_transformers_prefill(tiny_model):
    """The static prefill (our text forward over the HF modules, images + DeepStack) writes exactly
    the K/V transformers computes, in the same left-padded layout."""
    cfg = tiny_model.config
    batch = encode(tiny_model.processor, [0, 1, 2])
    plain = BlockDiffusionDecoder(tiny_model.model, cfg)
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    with torch.no_grad():
        ref = plain.prefill(batch, 8)
        run = static._begin(3, batch["input_ids"].shape[1] + 32)
        got = static.prefill(batch, 8, run)
    length = batch["input_ids"].shape[1]
    for layer, cached in enumerate(ref.cache.layers):
        assert torch.equal(run.cache.k[layer, :3, :length], cached.keys.transpose(1, 2))
        assert torch.equal(run.cache.v[layer, :3, :length], cached.values.transpose(1, 2))
    assert torch.equal(got.last_logits, ref.last_logits)
    assert torch.equal(got.next_position, ref.next_position)
    assert got.base == [length] * 3
    assert torch.equal(got.prompt_valid[:, :length], ref.valid)


@pytest.mark.parametrize("span_bucket", [None, 64])
def test_step_function_equals_eager_twin(tiny_model, span_bucket):
    """forward_step (the function CUDA graphs capture) against the same step run by transformers
    over a DynamicCache: bit-identical with exact key spans, within float32 rounding when keys are
    padded to span buckets (the graph-shaped attention)."""
    cfg = tiny_model.config
    batch = encode(tiny_model.processor, [0, 1, 2])
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC, span_bucket=span_bucket)
    size = 8
    with torch.no_grad():
        state = static.begin(batch, size, answer_slots=256)
        run, prefix = state.run, state.prefix
        buf = static.plan_step(state, [(size, size)])            # block 1, as if block 0 were committed
        first = prefix.base[0]
        for layer in range(run.cache.k.shape[0]):                # fill block 0's slots with something
            run.cache.k[layer, :, first:first + size] = run.cache.k[layer, :, first - size:first]
            run.cache.v[layer, :, first:first + size] = run.cache.v[layer, :, first - size:first]
        buf.tokens.copy_(torch.randint(0, 300, buf.tokens.shape, generator=torch.Generator().manual_seed(0)))
        twin = eager_twin_step(tiny_model.model, run.cache, buf, rows=3)
        step = forward_step(static.text, run.cache, static.attention, buf)
    assert step.shape == twin.shape == (3, size, cfg.vocab_size)
    if span_bucket is None:
        assert torch.equal(step, twin)
    else:
        assert buf.groups[0].span % span_bucket == 0 and buf.groups[0].span >= first + 2 * size
        torch.testing.assert_close(step, twin, rtol=1e-5, atol=1e-5)
        assert torch.equal(step.argmax(-1), twin.argmax(-1))


@pytest.mark.parametrize("block,prompts", [(8, (0, 1, 2)), (32, (1,)), (1, (1, 2))])
def test_graph_shaped_attention_gives_the_same_tokens(tiny_model, decoders, block, prompts):
    """Key spans padded to buckets (what CUDA graphs replay) decode the same tokens as the plain path."""
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC, span_bucket=48)
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block,
                                                  confidence_threshold=0.7, max_new_tokens=32)
    batch = decoders.batches[prompts]
    _assert_same(decoders.plain.generate(batch, settings), static.generate(batch, settings))


@pytest.mark.parametrize("block", [8, 1])
def test_graph_mode_bookkeeping(tiny_model, decoders, monkeypatch, block):
    """The graphed path minus the graphs (CPU): batch padded to a bucket, one cache allocated once,
    key spans in buckets, so a decode needs a handful of step shapes, not one per block."""
    from wam_diff2_core.decoding.cuda_graphs import StepGraphs
    keys = []
    monkeypatch.setattr(StepGraphs, "run", lambda self, key, step, fallback=None: (keys.append(key), step())[1])
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC.replace(cuda_graphs=True))
    static.graphs.enabled = True                        # as on a GPU: graphed calls, eager "replays"
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block,
                                                  confidence_threshold=0.7, max_new_tokens=48)
    for prompts in ((0, 1, 2), (1,)):
        batch = decoders.batches[prompts]
        _assert_same(decoders.plain.generate(batch, settings), static.generate(batch, settings))
    cache = static.graph_cache
    assert static.cache is None and cache.rows == STATIC.max_graph_batch and cache.slots == STATIC.max_context_tokens
    assert {key[1][0] for key in keys} == {4, 1}                     # batch 3 runs in the bucket of 4
    assert len(set(keys)) <= (2 if block == 1 else 4)               # shapes x span buckets, not blocks


def test_cache_is_written_in_place_and_never_reallocated(tiny_model, decoders, monkeypatch):
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC)
    seen = []
    real_forward = QwenTextForward.layers_forward

    def recording_forward(self, hidden, cos, sin, cache, *args, **kwargs):     # every forward writes its K/V here
        seen.append(cache.data_ptrs())
        return real_forward(self, hidden, cos, sin, cache, *args, **kwargs)

    monkeypatch.setattr(QwenTextForward, "layers_forward", recording_forward)
    settings = tiny_model.config.settings.replace(block_size=8, denoising_steps=8, max_new_tokens=40)
    static.generate(decoders.batches[(0, 1, 2)], settings)
    first = static.cache
    assert len(seen) > 10 and set(seen) == {first.data_ptrs()}
    # A call that fits reuses the same memory (smaller batch, shorter answer).
    static.generate(decoders.batches[(1,)], settings.replace(max_new_tokens=16))
    assert static.cache is first and set(seen) == {first.data_ptrs()}
    # Writes go to the slots of the block being decoded: nothing past the last block is touched.
    length = decoders.batches[(0, 1, 2)]["input_ids"].shape[1]
    assert first.slots >= length + 40 and first.k[:, :, length + 40:].abs().sum() == 0
    # A call that does not fit grows the cache before decoding (to cover both calls), not during it.
    seen.clear()
    longer = settings.replace(max_new_tokens=120)
    out = static.generate(decoders.batches[(1,)], longer)
    assert static.cache is not first and static.cache.rows == 3 and set(seen) == {static.cache.data_ptrs()}
    assert out.sequences == decoders.plain.generate(decoders.batches[(1,)], longer).sequences


def test_cache_views():
    cache = StaticKVCache(layers=2, rows=3, slots=20, kv_heads=2, head_dim=4, dtype=torch.float32,
                          device=torch.device("cpu"), page_size=8)
    assert cache.slots == 24                                  # rounded up to whole pages
    k = torch.randn(3, 5, 2, 4)
    rows = torch.arange(3).unsqueeze(1).expand(3, 5)
    slots = torch.arange(10, 15).unsqueeze(0).expand(3, 5)
    cache.k[1].index_put_((rows, slots), k)            # as a step's qk_norm_rope_store writes it
    cache.v[1].index_put_((rows, slots), -k)
    keys, values = cache.read(1, rows=3, span=15)
    assert keys.shape == (3, 2, 15, 4) and torch.equal(keys[:, :, 10:], k.transpose(1, 2))
    assert torch.equal(values[:, :, 10:], -k.transpose(1, 2)) and keys[:, :, :10].abs().sum() == 0
    pages_k, _ = cache.pages(1)
    assert pages_k.shape == (9, 8, 2, 4) and torch.equal(pages_k[3 + 1, 2:7], k[1])   # row 1 owns pages 3..5


def test_batch_buckets():
    assert [batch_bucket(n, 8) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    assert batch_bucket(5, 6) == 6


# ---------------------------------------------------------------------------------- FlashInfer logic on CPU
@pytest.mark.parametrize("use_cuda_graph", [False, True])
@pytest.mark.parametrize("block,prompts", [(8, (0, 1, 2)), (16, (1, 2)), (1, (0, 1, 2))])
def test_flashinfer_backend_logic_with_a_stand_in(tiny_model, decoders, use_cuda_graph, block, prompts):
    """Packed prompts (no padding stored), page tables, one request per (sequence, block), two per
    sequence for the fused commit, a block-causal custom mask for the prompt: same tokens as plain."""
    from wam_diff2_core.decoding.attention_flashinfer import FlashInferAttention
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC)
    kernels = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=PagedPrefillDouble)
    static.attention = FlashInferAttention(static.text, use_cuda_graph=use_cuda_graph, kernels=kernels)
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block,
                                                  confidence_threshold=0.7, max_new_tokens=24)
    batch = decoders.batches[prompts]
    PagedPrefillDouble.plans.clear()
    _assert_same(decoders.plain.generate(batch, settings), static.generate(batch, settings))
    plans = PagedPrefillDouble.plans
    lengths = batch["attention_mask"].sum(1).tolist()
    assert plans[0] == dict(queries=lengths, kv=lengths, custom=True)           # packed prompt prefill
    if block > 1:
        assert plans[1] == dict(queries=[block] * len(prompts), kv=[p + block for p in lengths], custom=False)
        fused = plans[2]                                                      # block 0 commit + block 1
        assert fused["queries"] == [block] * 2 * len(prompts) and not fused["custom"]
        assert fused["kv"] == [p + k * block for p in lengths for k in (1, 2)]


def test_both_attention_backends_define_every_method_of_the_backend_protocol():
    """Both backends declare attention.AttentionBackend; a method one did not define would be the protocol's
    empty stub (returning None, silently), so each defines every method and the attributes the decoder reads."""
    from wam_diff2_core.decoding.attention import AttentionBackend, SdpaAttention
    from wam_diff2_core.decoding.attention_flashinfer import FlashInferAttention
    methods = {name for name, value in vars(AttentionBackend).items() if callable(value) and not name.startswith("_")}
    assert methods == {"begin_prompt", "prompt", "begin", "graph_key", "step_inputs", "step"}
    for backend in (SdpaAttention, FlashInferAttention):
        assert AttentionBackend in backend.__mro__                        # declared, not only matching
        assert all(getattr(backend, name) is not getattr(AttentionBackend, name) for name in methods), backend
        assert isinstance(backend.name, str) and isinstance(backend.packed_prompts, bool)


# ---------------------------------------------------------------------------------- devices, factory
def test_npu_samples_by_inverse_cdf(tiny_model):
    settings = tiny_model.config.settings.replace(temperature=1.0)
    assert device_settings(settings, "npu").sampler == "inverse_cdf"
    assert device_settings(settings, "cpu") is settings and device_settings(settings, "cuda") is settings
    greedy = settings.replace(temperature=0.0)
    assert device_settings(greedy, "npu") is greedy


def test_npu_timing_synchronizes_the_npu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(synchronize=lambda device: calls.append(device)),
                        raising=False)
    device = types.SimpleNamespace(type="npu")
    with PhaseTimer(device)("denoise"):
        pass
    assert calls == [device, device]


def test_device_selection():
    from wam_diff2_core.model.devices import resolve_device
    assert resolve_device("cpu").type == "cpu"
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="torch-npu"):
            resolve_device("npu")
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "npu")
        with pytest.raises(ConfigError, match="CUDA"):
            resolve_device("cuda")


def test_factory(tiny_model, caplog):
    m = tiny_model
    assert isinstance(make_decoder(m.model, m.config), StaticBlockDiffusionDecoder)     # auto, on CPU
    assert isinstance(make_decoder(m.model, m.config, "plain"), BlockDiffusionDecoder)
    assert isinstance(make_decoder(m.model, m.config, "static"), StaticBlockDiffusionDecoder)
    with pytest.raises(ConfigError, match="implementation"):
        make_decoder(m.model, m.config, "plain", cuda_graphs=True)
    with pytest.raises(ConfigError, match="attention_backend"):
        make_decoder(m.model, m.config, "static", attention_backend="flash")
    with pytest.raises(ConfigError, match="flashinfer"):
        make_decoder(m.model, m.config, "static", attention_backend="flashinfer")   # CPU model
    with pytest.raises(ConfigError, match="cuda_graphs"):
        EngineSettings(implementation="static", cuda_graphs=1).validated()
    if not torch.cuda.is_available():
        with caplog.at_level(logging.WARNING):
            graphed = make_decoder(m.model, m.config, "static", cuda_graphs=True)
        assert not graphed.graphs.enabled and "CUDA graphs need a CUDA device" in caplog.text
        settings = m.config.settings.replace(block_size=8, denoising_steps=8, max_new_tokens=16)
        batch = encode(m.processor, [1])
        summary = graphed.warmup(batch_sizes=(1, 2), prompt_tokens=20, settings=settings)
        assert summary["cuda_graphs"] is False and summary["graphs"] == 0
        assert graphed.generate(batch, settings).sequences == \
            BlockDiffusionDecoder(m.model, m.config).generate(batch, settings).sequences


# ---------------------------------------------------------------------------------- GPU
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA device (CUDA graphs, FlashInfer): run scripts/device_check.sh")


@pytest.fixture(scope="module")
def cuda_model(tiny_checkpoint):
    from wam_diff2_core.model.checkpoint import load_checkpoint
    return {dtype: load_checkpoint(tiny_checkpoint, device="cuda", dtype=dtype) for dtype in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def cuda_model_head_dim_128(tmp_path_factory):
    """bf16 on CUDA with head_dim 128 (the 2B / 8B size; FlashInfer's prebuilt kernels do not cover 32)."""
    from wam_diff2_core.model.checkpoint import load_checkpoint
    from wam_diff2_core.model.tiny import build_qwen_layout_checkpoint
    ckpt = build_qwen_layout_checkpoint(tmp_path_factory.mktemp("hd128") / "ckpt", hidden_size=256)
    return load_checkpoint(ckpt, device="cuda", dtype="bfloat16")


def _cuda_gens(seed, n):
    return None if seed is None else [torch.Generator("cuda").manual_seed(seed + i) for i in range(n)]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_graph_replay_equals_eager_step(cuda_model, dtype):
    m = cuda_model[dtype]
    graphed = StaticBlockDiffusionDecoder(m.model, m.config, STATIC.replace(cuda_graphs=True))
    assert graphed.graphs.enabled, graphed.graphs.reason
    batch = encode(m.processor, [0, 1, 2])
    with torch.no_grad():
        state = graphed.begin(batch, 16, answer_slots=64)
        for segments in ([(0, 16)], [(0, 16), (16, 16)]):
            buf = graphed.plan_step(state, segments)
            buf.tokens.random_(0, 300)
            eager = forward_step(graphed.text, state.run.cache, graphed.attention, buf).clone()
            replayed = graphed.forward(state, buf).clone()          # captures, then replays
            again = graphed.forward(state, buf).clone()
            assert torch.equal(replayed, eager) and torch.equal(again, eager)
    assert not graphed.graphs.failures and len(graphed.graphs.graphs) == 2


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("block,temperature", [(8, 0.0), (32, 0.0), (1, 0.0)])
def test_gpu_graphs_float32_tokens_equal_plain(cuda_model, block, temperature):
    m = cuda_model["float32"]
    settings = m.config.settings.replace(block_size=block, denoising_steps=block, temperature=temperature,
                                         confidence_threshold=0.7, max_new_tokens=48)
    batch = encode(m.processor, [0, 1, 2])
    plain = BlockDiffusionDecoder(m.model, m.config).generate(batch, settings, _cuda_gens(3, 3))
    graphed = make_decoder(m.model, m.config, "static", cuda_graphs=True)
    graphed.warmup(batch_sizes=(4,), prompt_tokens=batch["input_ids"].shape[1], settings=settings)
    out = graphed.generate(batch, settings, _cuda_gens(3, 3))
    assert out.sequences == plain.sequences
    assert not graphed.graphs.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(bool(flashinfer_problem()), reason=f"FlashInfer: {flashinfer_problem()}")
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_gpu_flashinfer_matches_sdpa(cuda_model_head_dim_128, cuda_graphs):
    m = cuda_model_head_dim_128
    assert m.model.config.text_config.head_dim == 128
    settings = m.config.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7,
                                         max_new_tokens=48)
    sdpa = make_decoder(m.model, m.config, "static")
    flash = make_decoder(m.model, m.config, "static", attention_backend="flashinfer", cuda_graphs=cuda_graphs)
    same = total = 0
    for idx in ([0], [1], [2], [0, 1, 2]):
        batch = encode(m.processor, idx)
        a, b = sdpa.generate(batch, settings), flash.generate(batch, settings)
        same += sum(x == y for x, y in zip(a.sequences, b.sequences))
        total += len(idx)
    # bf16 attention kernels differ in rounding: allow a rare divergence, report the rate.
    assert same >= total - 1, f"flashinfer == sdpa on {same}/{total} sequences"


@pytest.mark.parametrize("heads,kv_heads,queries", [(16, 8, 32), (2, 1, 1), (8, 1, 64), (4, 4, 16)])
def test_grouped_sdpa_equals_transformers_repeat_kv(heads, kv_heads, queries):
    """Grouped heads folded into the query axis (no K/V copy) under the folded additive mask give transformers'
    repeat_kv numbers under the boolean mask exactly."""
    import types as _types

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from wam_diff2_core.decoding.attention import folded_bias, grouped_sdpa
    gen = torch.Generator().manual_seed(heads + queries)
    q = torch.randn(3, heads, queries, 32, generator=gen)
    k, v = torch.randn(2, 3, kv_heads, 90, 32, generator=gen)
    mask = torch.rand(3, 1, queries, 90, generator=gen) > 0.3
    module = _types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=False, training=False)
    want = sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=32 ** -0.5)[0]
    # the additive mask made once per step gives SDPA's own numbers for the boolean mask
    assert torch.equal(grouped_sdpa(q, k, v, folded_bias(mask, heads // kv_heads, q.dtype), 32 ** -0.5), want)


@pytest.mark.parametrize("block", [1, 8, 32])
@pytest.mark.parametrize("kind", ["plain", "fused", "graphed"])
def test_greedy_row_beside_sampled_rows_decodes_as_alone(tiny_model, decoders, kind, block):
    """Candidate selection's batch: row 0 greedy, the others sampled, each as it decodes alone (the greedy
    row as a temperature-0 decode, a sampled row with its own generator)."""
    decoder = getattr(decoders, kind)
    sampled = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, temperature=1.0,
                                                 top_p=0.9, confidence_threshold=0.5, max_new_tokens=40)
    greedy = sampled.replace(temperature=0.0)
    one = decoders.batches[(1,)]
    three = {key: torch.cat([one[key]] * 3) for key in one}
    together = decoder.generate(three, sampled, _gens(7, 3), greedy_rows=[0])
    assert together.sequences[0] == decoder.generate(one, greedy).sequences[0]
    for row in (1, 2):
        alone = decoder.generate(one, sampled, [torch.Generator().manual_seed(7 + row)])
        assert together.sequences[row] == alone.sequences[0]
    assert together.sequences[1] != together.sequences[0] or together.sequences[2] != together.sequences[0]
    with pytest.raises(ValueError, match="greedy_rows"):
        decoder.generate(three, sampled, _gens(7, 3), greedy_rows=[3])


@pytest.mark.parametrize("block", [1, 8])
@pytest.mark.parametrize("kind", ["plain", "fused", "graphed"])
def test_rows_sharing_a_prompt_prefill_once_and_decode_as_with_their_own_prefill(tiny_model, decoders, kind, block):
    """Candidate plans of a frame: rows continuing one prompt (``prompt_rows``) share its prefill (the prompt
    and image run once, the K/V copied to each row) and decode to the tokens of a batch that prefills every row
    itself; a sampled row beside a greedy one, prompts of different lengths, with and without an image."""
    decoder = getattr(decoders, kind)
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, temperature=1.0,
                                                  top_p=0.9, confidence_threshold=0.5, max_new_tokens=24)
    rows = [2, 0, 2, 1]
    shared = decoder.generate(decoders.batches[(0, 1, 2)], settings, _gens(3, 4), greedy_rows=[0], prompt_rows=rows)
    separate = decoder.generate(encode(tiny_model.processor, rows), settings, _gens(3, 4), greedy_rows=[0])
    assert shared.sequences == separate.sequences and shared.finished == separate.finished
    assert shared.sequences[0] != shared.sequences[2]             # the same prompt, sampled apart
    identity = decoder.generate(decoders.batches[(1, 2)], settings, _gens(5, 2), prompt_rows=[0, 1])
    assert identity.sequences == decoder.generate(decoders.batches[(1, 2)], settings, _gens(5, 2)).sequences
    for bad in ([], [0, 3], [-1]):
        with pytest.raises(ValueError, match="prompt_rows"):
            decoder.generate(decoders.batches[(0, 1, 2)], settings, prompt_rows=bad)
    with pytest.raises(ValueError, match="generators: expected 4"):
        decoder.generate(decoders.batches[(0, 1, 2)], settings, _gens(3, 3), prompt_rows=rows)
