"""The cached block-diffusion decoder against a full-recompute reference, batching, AR = generate."""
from __future__ import annotations

import copy

import pytest
import torch

from test.support.decoder_prompts import encode
from test.support.reference_decoder import full_block_causal_mask, reference_decode
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder


def _gen(seed):
    return torch.Generator().manual_seed(seed) if seed is not None else None


CASES = [
    # block, steps, strategy, threshold, temperature, top_k, top_p, sampler, seed
    (4, 4, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (8, 8, "low_confidence_dynamic", 0.5, 0.0, 0, 1.0, "multinomial", None),
    (16, 16, "low_confidence_dynamic", 0.7, 0.0, 0, 1.0, "multinomial", None),
    (32, 32, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (32, 8, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (32, 32, "low_confidence_dynamic", 0.3, 0.0, 0, 1.0, "multinomial", None),
    (8, 4, "low_confidence_static", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (32, 32, "low_confidence_static", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (16, 5, "sequential", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (32, 32, "sequential", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (8, 8, "low_confidence_dynamic", 0.9, 1.0, 0, 1.0, "multinomial", 1),
    (16, 16, "low_confidence_dynamic", 0.6, 0.7, 20, 0.9, "multinomial", 2),
    (32, 32, "low_confidence_static", 0.9, 1.3, 0, 0.8, "inverse_cdf", 3),
    (4, 4, "low_confidence_dynamic", 0.8, 1.0, 5, 1.0, "inverse_cdf", 4),
    (1, 1, "low_confidence_dynamic", 0.9, 0.0, 0, 1.0, "multinomial", None),
    (1, 1, "low_confidence_dynamic", 0.9, 1.0, 10, 0.9, "multinomial", 5),
]


@pytest.mark.parametrize("block,steps,strategy,threshold,temperature,top_k,top_p,sampler,seed", CASES)
@pytest.mark.parametrize("prompt", [0, 1])
def test_cached_decoder_equals_full_recompute(tiny_model, prompt, block, steps, strategy, threshold,
                                              temperature, top_k, top_p, sampler, seed):
    settings = tiny_model.config.settings.replace(
        block_size=block, denoising_steps=steps, remasking_strategy=strategy, confidence_threshold=threshold,
        temperature=temperature, top_k=top_k, top_p=top_p, sampler=sampler, max_new_tokens=48)
    inputs = encode(tiny_model.processor, [prompt])
    decoder = BlockDiffusionDecoder(tiny_model.model, tiny_model.config)
    out = decoder.generate(inputs, settings, generators=[_gen(seed)])
    confidences: list[float] = []
    expected = reference_decode(tiny_model.model, tiny_model.config, inputs, settings, _gen(seed), confidences)
    assert out.sequences[0] == expected
    assert out.confidences[0] == pytest.approx(confidences, abs=1e-5)     # each token's, when it was fixed
    assert len(expected) > 0


@pytest.mark.parametrize("block", [1, 4, 32])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batch_equals_single(tiny_model, block, temperature):
    settings = tiny_model.config.settings.replace(block_size=block, denoising_steps=block, temperature=temperature,
                                                  confidence_threshold=0.6, max_new_tokens=40)
    decoder = BlockDiffusionDecoder(tiny_model.model, tiny_model.config)
    idx = [0, 1, 2]
    batch = encode(tiny_model.processor, idx)
    assert len(set(batch["attention_mask"].sum(1).tolist())) == 3  # really different lengths
    together = decoder.generate(batch, settings, generators=[_gen(10 + i) for i in idx])
    for row, i in enumerate(idx):
        alone = decoder.generate(encode(tiny_model.processor, [i]), settings, generators=[_gen(10 + i)])
        assert together.sequences[row] == alone.sequences[0]
        a, b = together.stats[row], alone.stats[0]
        assert (a.forwards, a.steps_per_block, a.commit_forwards, a.tokens) == \
               (b.forwards, b.steps_per_block, b.commit_forwards, b.tokens)


@pytest.mark.parametrize("idx", [[0], [1], [0, 1, 2]])
def test_ar_equals_transformers_greedy_generate(tiny_model, idx):
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=1, max_new_tokens=30)
    inputs = encode(tiny_model.processor, idx)
    out = BlockDiffusionDecoder(tiny_model.model, cfg).generate(inputs, settings)
    generated = tiny_model.model.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=cfg.eos_token_id,
                                          pad_token_id=cfg.eos_token_id, suppress_tokens=list(cfg.banned_token_ids),
                                          output_scores=True, return_dict_in_generate=True)
    new = generated.sequences[:, inputs["input_ids"].shape[1]:].tolist()
    # the probability of each chosen token among the allowed ones (transformers' scores: suppressed at -inf)
    chosen = [torch.softmax(scores.float(), dim=-1).max(dim=-1).values for scores in generated.scores]
    for row, seq in enumerate(new):
        expected = seq[:seq.index(cfg.eos_token_id)] if cfg.eos_token_id in seq else seq
        assert out.sequences[row] == expected
        assert out.confidences[row] == pytest.approx([float(p[row]) for p in chosen[:len(expected)]], abs=1e-5)


def _edited_model(tiny_model, token_id: int, boost: float):
    """A copy of the tiny model whose LM head strongly prefers ``token_id``."""
    model = copy.deepcopy(tiny_model.model)
    with torch.no_grad():
        model.lm_head.weight[token_id] = model.lm_head.weight.abs().mean() * 0  # no input dependence
        if model.lm_head.bias is None:
            model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
        model.lm_head.bias[token_id] = boost
    return model


@pytest.mark.parametrize("block", [1, 8, 32])
def test_mask_and_special_tokens_are_never_emitted(tiny_model, block):
    cfg = tiny_model.config
    model = _edited_model(tiny_model, cfg.mask_token_id, 1e4)
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, max_new_tokens=32)
    out = BlockDiffusionDecoder(model, cfg).generate(encode(tiny_model.processor, [1]), settings)
    assert len(out.sequences[0]) == 32
    assert not set(out.sequences[0]) & set(cfg.banned_token_ids)
    assert cfg.mask_token_id in cfg.banned_token_ids and cfg.eos_token_id not in cfg.banned_token_ids


@pytest.mark.parametrize("block", [1, 16])
def test_eos_stops_and_truncates(tiny_model, block):
    cfg = tiny_model.config
    model = _edited_model(tiny_model, cfg.eos_token_id, 1e4)
    settings = cfg.settings.replace(block_size=block, denoising_steps=block, max_new_tokens=64)
    out = BlockDiffusionDecoder(model, cfg).generate(encode(tiny_model.processor, [0, 1]), settings)
    assert out.sequences == [[], []] and out.finished == [True, True]
    for s in out.stats:
        assert s.blocks == 1 and s.commit_forwards == 0 and s.tokens == 0


def test_stats_count_forwards(tiny_model):
    cfg = tiny_model.config
    settings = cfg.settings.replace(block_size=8, denoising_steps=8, max_new_tokens=40)
    out = BlockDiffusionDecoder(tiny_model.model, cfg).generate(encode(tiny_model.processor, [1]), settings)
    s = out.stats[0]
    assert s.blocks == len(s.steps_per_block) and s.denoise_steps == sum(s.steps_per_block)
    assert all(1 <= n <= 8 for n in s.steps_per_block)
    assert s.commit_forwards == (s.blocks - 1)  # none after the last block
    assert s.forwards == s.denoise_steps + s.commit_forwards
    assert s.tokens == len(out.sequences[0]) and s.prefill_ms > 0 and s.denoise_ms > 0
    if not out.finished[0]:
        assert s.tokens == 40 and s.blocks == 5


def test_full_reference_mask_matches_spec():
    # P = 6, B = 4: prompt blocks {0..3}, {4, 5}; response blocks start at id ceil(6/4) = 2.
    m = full_block_causal_mask(6, 8, 4)[0, 0]
    assert m[1, 3] and not m[1, 4]              # inside prompt block 0: bidirectional
    assert m[5, 0] and m[4, 5]                  # partial prompt block sees block 0 and itself
    assert m[6, 5] and m[6, 9] and not m[6, 10]  # response block 0 = positions 6..9
    assert not m[5, 6]                          # prompt never sees the response
