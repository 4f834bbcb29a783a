"""Device-side defects a CPU can show: generators on the model's device, inverse-CDF sampling
on Ascend in every decoder, per-rank devices, FlashInfer wrappers per cache, the bench's tied-embedding shape (a
failed CUDA-graph capture: test_graph_emulation.py). Each test fails on the code before its fix.
"""
from __future__ import annotations

import types

import pytest
import torch

from test.support.decoder_prompts import encode
from test.support.flashinfer_double import PagedPrefillDouble
from wam_diff2_core.config import EngineSettings
from wam_diff2_core.decoding import decoder as plain_module
from wam_diff2_core.decoding import sampling
from wam_diff2_core.decoding import static as static_module
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
from wam_diff2_core.decoding.cuda_graphs import StepGraphs

STATIC = EngineSettings(implementation="static")


class _RecordingGenerator:
    """Stands for torch.Generator where no accelerator exists: records the device it was made for."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def manual_seed(self, seed):
        self.seed = seed
        return self


# ---------------------------------------------------------------------------------- 1. generators
def test_infer_makes_generators_on_the_model_device(tiny_model, monkeypatch):
    from wam_diff2_core.cli import infer
    from wam_diff2_core.data.samples import Sample
    from wam_diff2_core.model.prompt_encoding import encode_prompts

    from wam_diff2_core.profiling import StageTimes

    seen = []
    decoder = types.SimpleNamespace(device=torch.device("meta"), model=None)
    decoder.generate = lambda inputs, settings=None, generators=None, greedy_rows=(), prompt_rows=None: (
        seen.extend(generators), _empty(len(generators)))[1]
    monkeypatch.setattr(torch, "Generator", _RecordingGenerator)
    sample = Sample(id="s0", datasource=None, image_paths=[], raw={},
                    messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    args = types.SimpleNamespace(seed=5, min_pixels=None, max_pixels=None, parse="none")
    infer._decode([(3, sample, [])], tiny_model, decoder, tiny_model.tokenizer, args, encode_prompts, StageTimes())
    assert [(g.device.type, g.seed) for g in seen] == [("meta", 8)]


def test_bench_models_makes_generators_on_the_model_device(monkeypatch):
    import numpy as np

    from wam_diff2_core.benchmark import model_comparison
    seen = []
    monkeypatch.setattr(torch, "Generator", _RecordingGenerator)
    from wam_diff2_core.decoding.common import DecodeStats
    monkeypatch.setattr(model_comparison, "decode_one", lambda decoder, tok, inputs, settings, gen, stages: (
        seen.append(gen), ("", DecodeStats(block_size=1), None))[1])
    decoder = types.SimpleNamespace(device=torch.device("meta"), model=None)
    model_comparison.decode_row(decoder, None, "s", {}, np.zeros((8, 2)), None, seed=2)
    assert [(g.device.type, g.seed) for g in seen] == [("meta", 2)]


def test_sampling_names_a_generator_on_another_device(tiny_model):
    settings = tiny_model.config.settings.replace(temperature=1.0)
    logits = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="generator is on meta"):
        sampling.sample_tokens(logits, settings, None, [_RecordingGenerator("meta")])


@pytest.mark.parametrize("vocab", [7, 151])
def test_draw_one_is_torch_multinomial_without_its_host_read(vocab):
    """The capturable draw equals torch.multinomial(p, 1) draw for draw and leaves the generator where
    multinomial leaves it (also where top-k / top-p zeroed tokens out)."""
    torch.manual_seed(0)
    for trial in range(20):
        p = torch.softmax(torch.randn(6, vocab) * (1 + trial % 5), dim=-1)
        p[:, : trial % 4] = 0
        p = p / p.sum(dim=-1, keepdim=True)
        theirs, mine = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert torch.equal(sampling.draw_one(p, mine), torch.multinomial(p, 1, generator=theirs))
        assert torch.equal(mine.get_state(), theirs.get_state())


def test_bound_generators_draw_as_the_request_generators_and_hand_their_state_back():
    request = sampling.seeded_generators([1, 2], "cpu")
    alone = sampling.seeded_generators([1, 2], "cpu")
    own = sampling.seeded_generators([90, 91, 92], "cpu")          # more than the batch: a graph bucket
    with sampling.bound_generators(own, request):
        drawn = [torch.rand(3, generator=g) for g in own[:2]]
    assert all(torch.equal(d, torch.rand(3, generator=g)) for d, g in zip(drawn, alone))
    assert all(torch.equal(torch.rand(2, generator=r), torch.rand(2, generator=a)) for r, a in zip(request, alone))


def _empty(n):
    from wam_diff2_core.decoding.common import DecodeOutput, DecodeStats
    return DecodeOutput(sequences=[[]] * n, finished=[True] * n, stats=[DecodeStats(block_size=1) for _ in range(n)])


# ---------------------------------------------------------------------------------- 2. npu sampling
@pytest.mark.parametrize("module,make", [
    (plain_module, lambda m: BlockDiffusionDecoder(m.model, m.config)),
    (static_module, lambda m: StaticBlockDiffusionDecoder(m.model, m.config, STATIC))], ids=["plain", "static"])
@pytest.mark.parametrize("block", [1, 8])
def test_every_decoder_samples_by_inverse_cdf_on_npu(tiny_model, monkeypatch, module, make, block):
    """Forced to the npu's device settings, neither decoder draws by multinomial (torch.multinomial
    hangs on Ascend; its rule is sampling.draw_one): the tokens are the inverse-CDF sampler's."""
    decoder = make(tiny_model)
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, temperature=1.0,
                                                  max_new_tokens=16)
    batch = encode(tiny_model.processor, [0, 1])
    gens = lambda: sampling.seeded_generators([3, 4], "cpu")   # noqa: E731
    expected = decoder.generate(batch, settings.replace(sampler="inverse_cdf"), gens())
    real = sampling.device_settings
    monkeypatch.setattr(module, "device_settings", lambda s, device_type: real(s, "npu"))

    def hang(*args, **kwargs):
        raise AssertionError("multinomial draw on npu")
    monkeypatch.setattr(sampling, "draw_one", hang)
    assert decoder.generate(batch, settings, gens()).sequences == expected.sequences


# ---------------------------------------------------------------------------------- 8. per-rank devices
@pytest.mark.parametrize("kind", ["npu", "cuda"])
def test_each_rank_gets_its_own_accelerator(monkeypatch, kind):
    from wam_diff2_core.model import devices
    calls = []
    monkeypatch.setattr(devices, "resolve_device", lambda device: types.SimpleNamespace(type=device.split(":")[0]))
    monkeypatch.setattr(torch, kind, types.SimpleNamespace(set_device=calls.append), raising=False)
    assert devices.rank_device(kind, 3) == f"{kind}:3"
    assert devices.rank_device(f"{kind}:1", 3) == f"{kind}:1"
    assert calls == [3, 1]
    assert devices.rank_device("cpu", 3) == "cpu" and calls == [3, 1]


# ---------------------------------------------------------------------------------- 5. FlashInfer wrappers
class _FixedBufferStandIn(PagedPrefillDouble):
    """As FlashInfer: a CUDA-graph wrapper plans into index buffers of a fixed size and refuses more."""

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indices_buf=None, **buffers):
        super().__init__(workspace, kv_layout, use_cuda_graph, qo_indptr_buf, **buffers)
        self.capacity = len(paged_kv_indices_buf) if use_cuda_graph else None

    def plan(self, qo_indptr, kv_indptr, kv_indices, *args, **kwargs):
        if self.capacity is not None and len(kv_indices) > self.capacity:
            raise RuntimeError(f"plan: {len(kv_indices)} page indices for a buffer of {self.capacity}")
        super().plan(qo_indptr, kv_indptr, kv_indices, *args, **kwargs)


def test_flashinfer_request_past_the_graph_cache_runs_eagerly(tiny_model, monkeypatch):
    """Batch 1 fits a graph bucket; a request longer than max_context_tokens runs eagerly in its own
    cache, with its own (non-graph) wrapper, instead of the graph wrapper sized for the graph cache."""
    from wam_diff2_core.decoding.attention_flashinfer import FlashInferAttention
    monkeypatch.setattr(StepGraphs, "run", lambda self, key, step, fallback=None: step())
    engine = STATIC.replace(cuda_graphs=True, max_context_tokens=96, max_graph_batch=2)
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, engine)
    static.graphs.enabled = True                       # as on a GPU, with eager "replays"
    kernels = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_FixedBufferStandIn)
    static.attention = FlashInferAttention(static.text, use_cuda_graph=True, kernels=kernels)
    plain = BlockDiffusionDecoder(tiny_model.model, tiny_model.config)
    batch = encode(tiny_model.processor, [1])
    assert batch["input_ids"].shape[1] + 16 <= 96 < batch["input_ids"].shape[1] + 96
    for new_tokens in (16, 96):                        # in the graph cache, then past it
        settings = tiny_model.config.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7,
                                                      max_new_tokens=new_tokens)
        assert static.generate(batch, settings).sequences == plain.generate(batch, settings).sequences
    assert static.cache is not None and static.cache.slots > engine.max_context_tokens


@pytest.mark.parametrize("block,prompts", [(8, (0, 1)), (1, (1, 2))])
def test_flashinfer_plans_from_host_lengths_that_match_the_device_buffers(tiny_model, monkeypatch, block, prompts):
    """Planning reads nothing from the device (no host sync per AR token): the page tables come
    from host-side lengths. At every step forward they must equal the tables derived from the step's own
    device buffers (packed rows: a segment sees its row's slots [0, last slot it writes + 1)), for the
    denoise step, the fused commit + step and every AR token (whose slots the step computes on the device)."""
    from wam_diff2_core.decoding import attention_flashinfer
    from wam_diff2_core.decoding.attention_flashinfer import FlashInferAttention
    static = StaticBlockDiffusionDecoder(tiny_model.model, tiny_model.config, STATIC)
    kernels = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=PagedPrefillDouble)
    static.attention = FlashInferAttention(static.text, use_cuda_graph=False, kernels=kernels)
    checked = []
    real_step = FlashInferAttention.step

    def step(self, layer, attn, q, cache, buf, shared=None):
        if layer == 0:
            wrapper = self._wrappers[self._wrapper_key(buf, cache)]
            per_row, size = cache.slots // cache.page_size, cache.page_size
            ends = (buf.slots[:, [stop - 1 for _, stop in buf.segments]] + 1).tolist()        # device-derived
            indptr, indices, lengths = [0], [], []
            for row, row_ends in enumerate(ends):
                for kv in row_ends:
                    pages = torch.unique((row * per_row * size + torch.arange(kv)) // size).tolist()
                    indices += pages
                    indptr.append(indptr[-1] + len(pages))
                    lengths.append(kv)
            assert (wrapper.kv_indptr, wrapper.kv_indices, wrapper.kv_len) == (indptr, indices, lengths)
            queries = buf.segments[0][1] - buf.segments[0][0]                    # every segment's length
            assert wrapper.qo == [i * queries for i in range(len(ends) * len(buf.segments) + 1)]
            checked.append(len(buf.segments))
        return real_step(self, layer, attn, q, cache, buf, shared)
    monkeypatch.setattr(FlashInferAttention, "step", step)
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, confidence_threshold=0.7,
                                                  max_new_tokens=24)
    batch = encode(tiny_model.processor, prompts)
    want = BlockDiffusionDecoder(tiny_model.model, tiny_model.config).generate(batch, settings)
    assert static.generate(batch, settings).sequences == want.sequences
    assert len(checked) == static.forwards_run > 0 and (block == 1 or 2 in checked)     # fused steps too

    # What FlashInfer's plan reads on the host is a host tensor whatever the device (a device tensor there is
    # a device-to-host copy, a sync); the page indices go to the device (here "meta": no data, no CPU).
    text = types.SimpleNamespace(device=torch.device("meta"))
    monkeypatch.setattr(attention_flashinfer, "WORKSPACE_BYTES", 16)
    meta = FlashInferAttention(text, use_cuda_graph=False, kernels=kernels)
    indptr, indices, last = meta._pages(static.cache, [(0, 17), (1, 16)])
    assert indptr.device.type == last.device.type == "cpu" and indices.device.type == "meta"
    assert (indptr.tolist(), last.tolist(), indices.shape[0]) == ([0, 2, 3], [1, 16], 3)


# ---------------------------------------------------------------------------------- 6. bench shape
def test_bench_logit_scale_leaves_tied_embeddings_alone():
    """With tied embeddings (as the 2B shape) the logit scale must not scale the input embeddings."""
    from wam_diff2_core.model.random_model import SHAPES, build_random_model
    assert SHAPES["2b"]["tie_word_embeddings"] and SHAPES["2b"]["head_dim"] == 128
    dims = {**SHAPES["tiny"], "tie_word_embeddings": True}
    scaled, _ = build_random_model(dims, "cpu", torch.float32, seed=0, logit_scale=24.0)
    unscaled, _ = build_random_model(dims, "cpu", torch.float32, seed=0, logit_scale=1.0)
    assert scaled.lm_head.weight is scaled.model.language_model.embed_tokens.weight
    assert torch.equal(scaled.model.language_model.embed_tokens.weight,
                       unscaled.model.language_model.embed_tokens.weight)
    ids = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        a, b = scaled(input_ids=ids).logits, unscaled(input_ids=ids).logits
    torch.testing.assert_close(a, 24.0 * b, rtol=1e-4, atol=1e-4)
