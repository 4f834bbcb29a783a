"""The diffusion objective's inputs, pinned to training/README.md's objective and to the decoder:
stratified noise, EOS padding, labels at the same position, copied MRoPE ids, and a training
mask whose noisy-block logits equal the cached decoder's denoise-step logits."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wam_diff2_core.data.samples import iter_samples, load_images
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.masks import prompt_block_mask
from wam_diff2_core.model.prompt_encoding import encode_prompts
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.training_data import SampleDataset, prompt_batch
from wam_diff2_core.trainer.noise import (PREFIX, Layout, build_batch, noise_generator,
                                          noise_response, stratified_mask_ratios, training_attention_mask)
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset




PIXELS = {"min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data"), num_samples=5)


@pytest.fixture(scope="module")
def examples(tiny_model, data_file):
    ds = SampleDataset(data_file, tiny_model.processor, eos_token_id=tiny_model.config.eos_token_id,
                       data_root=data_file.parent, **PIXELS)
    out = []
    for i in range(len(ds)):
        e = ds[i]
        e.position = i
        out.append(e)
    return out


def _batch(tiny_model, examples, block_size, **kw):
    return build_batch(examples, block_size=block_size, mask_token_id=tiny_model.config.mask_token_id,
                       eos_token_id=tiny_model.config.eos_token_id,
                       rope_index=tiny_model.model.model.get_rope_index, seed=kw.pop("seed", 0), **kw)


# ---------------------------------------------------------------- noise schedule
@pytest.mark.parametrize("num_blocks", [1, 2, 5, 16])
def test_mask_ratios_are_stratified_one_per_interval(num_blocks):
    for seed in range(50):
        t = stratified_mask_ratios(num_blocks, torch.Generator().manual_seed(seed))
        strata = torch.sort(t).values * num_blocks
        lower = torch.arange(num_blocks, dtype=t.dtype)
        # exactly one t in each [i/N, (i+1)/N] (u is clamped to [0.001, 1], so t = (i+1)/N is possible)
        assert ((strata >= lower + 0.001 - 1e-6) & (strata <= lower + 1 + 1e-6)).all()


def test_mask_ratios_are_permuted_over_blocks():
    orders = {tuple(stratified_mask_ratios(4, torch.Generator().manual_seed(s)).argsort().tolist()) for s in range(40)}
    assert len(orders) > 10        # not always the sorted order


def test_masking_rate_follows_the_block_ratio():
    block, num_blocks = 8, 4
    response = torch.arange(block * num_blocks)
    masked_sum = torch.zeros(num_blocks)
    ratio_sum = torch.zeros(num_blocks)
    for seed in range(400):
        noisy, masked, ratios = noise_response(response, block, -1, torch.Generator().manual_seed(seed))
        assert torch.equal(noisy[masked], torch.full((int(masked.sum()),), -1))
        assert torch.equal(noisy[~masked], response[~masked])
        # one ratio per block
        assert (ratios.view(num_blocks, block) == ratios.view(num_blocks, block)[:, :1]).all()
        masked_sum += masked.view(num_blocks, block).float().mean(1)
        ratio_sum += ratios.view(num_blocks, block)[:, 0]
    # E[masked share of a block] = its t: over 400 draws the two means agree closely
    torch.testing.assert_close(masked_sum / 400, ratio_sum / 400, atol=0.03, rtol=0)
    # and the average ratio over blocks is 1/2 (stratified uniform)
    assert abs(float(ratio_sum.mean() / 400) - 0.5) < 0.03


def test_min_ratio_clamp():
    ts = torch.stack([stratified_mask_ratios(1, torch.Generator().manual_seed(s), min_ratio=0.9) for s in range(30)])
    assert (ts >= 0.9 - 1e-6).all()
    assert torch.isclose(ts, torch.tensor(0.9)).any()        # u < 0.9 was clamped up


def test_noise_depends_on_the_sample_visit_not_on_the_batch(tiny_model, examples):
    together = _batch(tiny_model, examples[:3], 4)
    alone = _batch(tiny_model, [examples[1]], 4)
    t = alone.input_ids.shape[1]
    assert torch.equal(together.input_ids[1, :t], alone.input_ids[0])
    assert not torch.equal(_batch(tiny_model, [examples[1]], 4, noise_round=1).input_ids, alone.input_ids)
    g1, g2 = noise_generator(0, 5), noise_generator(0, 6)
    assert not torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))


# ---------------------------------------------------------------- tokenisation and layout
def test_prefix_is_the_inference_prompt_and_response_ends_at_eos(tiny_model, data_file, examples):
    eos = tiny_model.config.eos_token_id
    tok = tiny_model.processor.tokenizer
    samples = [s for s in iter_samples(data_file, data_file.parent)]
    for sample, e in zip(samples, examples):
        prompt = encode_prompts(tiny_model.processor, [sample.prompt_messages], [load_images(sample)], **PIXELS)
        assert torch.equal(prompt["input_ids"][0], e.prefix_ids)
        assert int(e.response_ids[-1]) == eos and int((e.response_ids == eos).sum()) == 1
        assert tok.decode(e.response_ids[:-1]) == sample.answer


@pytest.mark.parametrize("block_size", [4, 8, 32])
def test_layout_labels_and_positions(tiny_model, examples, block_size):
    batch = _batch(tiny_model, examples, block_size)
    eos, mask_id = tiny_model.config.eos_token_id, tiny_model.config.mask_token_id
    seq_len = batch.input_ids.shape[1]
    seen_targets = 0
    for i, e in enumerate(examples):
        p, r = e.prefix_length, e.response_ids.shape[0]
        ell = int(batch.layout.response_lengths[i])
        assert ell % block_size == 0 and ell - block_size < r <= ell          # padded to a multiple of B
        clean = batch.input_ids[i, p:p + ell]
        noisy = batch.input_ids[i, p + ell:p + 2 * ell]
        assert torch.equal(batch.input_ids[i, :p], e.prefix_ids)
        assert torch.equal(clean[:r], e.response_ids) and (clean[r:] == eos).all()   # EOS padding
        masked = noisy == mask_id
        assert torch.equal(noisy[~masked], clean[~masked])
        # positions: the prefix's MRoPE ids, then next_position + j for clean and noisy alike
        pos = batch.position_ids[:, i]
        nxt = int(pos[:, :p].max()) + 1
        expect = (nxt + torch.arange(ell)).expand(3, -1)
        assert torch.equal(pos[:, p:p + ell], expect) and torch.equal(pos[:, p + ell:p + 2 * ell], expect)
        # targets: every masked noisy position, labelled with the clean token at the same offset
        mine = batch.target_sample == i
        idx = batch.target_index[mine] - i * seq_len - (p + ell)
        assert torch.equal(idx, masked.nonzero().squeeze(1))
        assert torch.equal(batch.target_ids[mine], clean[idx])
        torch.testing.assert_close(batch.ce_weight[mine], 1.0 / (batch.mask_ratio[mine] * ell))
        torch.testing.assert_close(batch.kd_weight[mine], torch.full_like(batch.kd_weight[mine], 1.0 / ell))
        assert torch.equal(batch.ar_predecessor_index[mine] - i * seq_len, p - 1 + idx)
        seen_targets += int(mine.sum())
    assert seen_targets == batch.target_ids.numel() == batch.num_targets


def test_block_size_one_is_causal_next_token_training(tiny_model, examples):
    """B = 1 equals transformers' own causal LM loss on prefix || response (per-sample mean)."""
    batch = _batch(tiny_model, examples[:2], 1)
    assert not batch.layout.with_noisy_copy
    causal = torch.tril(torch.ones(batch.input_ids.shape[1], batch.input_ids.shape[1], dtype=torch.bool))
    for i, e in enumerate(examples[:2]):
        n = e.prefix_length + e.response_ids.shape[0]
        assert torch.equal(batch.attention_mask[i, 0, :n, :n], causal[:n, :n])
    from wam_diff2_core.trainer.losses import DiffusionObjective
    from wam_diff2_core.trainer.losses import LossSettings
    with torch.no_grad():
        ours = DiffusionObjective(tiny_model.model, LossSettings())(
            target_index=batch.target_index, target_ids=batch.target_ids, ce_weight=batch.ce_weight,
            **batch.model_inputs())["total"] / 2
        hf = []
        for e in examples[:2]:
            ids = torch.cat([e.prefix_ids, e.response_ids]).unsqueeze(0)
            labels = ids.clone()
            labels[0, :e.prefix_length] = -100
            out = tiny_model.model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                                   mm_token_type_ids=torch.cat([e.mm_token_type_ids,
                                                                torch.zeros_like(e.response_ids)]).unsqueeze(0),
                                   pixel_values=e.pixel_values, image_grid_thw=e.image_grid_thw)
            hf.append(out.loss)
    torch.testing.assert_close(ours, torch.stack(hf).mean(), rtol=1e-5, atol=1e-5)


def test_distillation_padding_fits_both_block_grids(tiny_model, examples):
    batch = _batch(tiny_model, examples, 4, pad_multiple=12)
    assert (batch.layout.response_lengths % 12 == 0).all()
    with pytest.raises(ValueError):
        _batch(tiny_model, examples, 8, pad_multiple=12)


# ---------------------------------------------------------------- the attention mask
def _reference_mask(p: int, ell: int, seq_len: int, b: int) -> torch.Tensor:
    """The spec's rules, written position by position."""
    first = -(-p // b)
    m = torch.zeros(seq_len, seq_len, dtype=torch.bool)

    def where(x):
        if x < p:
            return "prefix", x // b
        if x < p + ell:
            return "clean", first + (x - p) // b
        if x < p + 2 * ell:
            return "noisy", first + (x - p - ell) // b
        return "pad", None

    for q in range(seq_len):
        sq, gq = where(q)
        for k in range(seq_len):
            sk, gk = where(k)
            if sq == "pad":
                ok = q == k
            elif sq in ("prefix", "clean"):
                ok = sk in ("prefix", "clean") and gk <= gq
            else:
                ok = (sk in ("prefix", "clean") and gk < gq) or (sk == "noisy" and gk == gq)
            m[q, k] = ok
    return m


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 13), blocks=st.integers(1, 3), b=st.sampled_from([1, 2, 3, 4, 8]), pad=st.integers(0, 3))
def test_training_mask_matches_the_spec_rules(p, blocks, b, pad):
    ell = blocks * b
    layout = Layout(prefix_lengths=torch.tensor([p]), response_lengths=torch.tensor([ell]),
                    seq_len=p + 2 * ell + pad, with_noisy_copy=True)
    got = training_attention_mask(layout, b)[0, 0]
    assert torch.equal(got, _reference_mask(p, ell, p + 2 * ell + pad, b))


@pytest.mark.parametrize("p,b", [(7, 4), (8, 4), (5, 8), (13, 2)])
def test_training_mask_and_inference_masks_agree(p, b):
    """Prefix rows = decoding's prompt mask; a committed (clean) block k sees the prefix and
    blocks < k and itself, as its commit forward does; noisy block k sees what a denoise step does."""
    blocks = 3
    ell = blocks * b
    layout = Layout(prefix_lengths=torch.tensor([p]), response_lengths=torch.tensor([ell]),
                    seq_len=p + 2 * ell, with_noisy_copy=True)
    mask = training_attention_mask(layout, b)[0, 0]
    segment, _ = layout.segments()
    assert torch.equal(mask[:p, :p], prompt_block_mask(torch.ones(1, p, dtype=torch.long), b)[0, 0])
    for k in range(blocks):
        for copy in (0, 1):                                          # the clean copy, then the noisy one
            rows = torch.arange(p + copy * ell + k * b, p + copy * ell + (k + 1) * b)
            seen = mask[rows].any(0)
            expect = torch.zeros(p + 2 * ell, dtype=torch.bool)
            expect[:p] = True                                        # the cached prefix
            expect[p:p + k * b] = True                               # committed blocks before k
            expect[rows] = True                                      # the block itself
            assert torch.equal(seen, expect), (copy, k)
            assert mask[rows][:, rows].all()                          # bidirectional inside the block
    assert not mask[p:p + ell, p + ell:].any()                        # clean never sees noisy (no leak)
    assert (segment[0, :p] == PREFIX).all()


def test_teacher_mask_uses_its_own_block_size(tiny_model, examples):
    batch = _batch(tiny_model, examples[:2], 8)
    torch.testing.assert_close(batch.mask_for(8), batch.attention_mask)
    assert torch.equal(batch.mask_for(4), training_attention_mask(batch.layout, 4))
    assert not torch.equal(batch.mask_for(4), batch.attention_mask)


@pytest.mark.parametrize("block_size", [4, 8])
def test_noisy_block_logits_equal_the_decoders_denoise_step(tiny_model, examples, block_size):
    """One forward of prefix || clean || noisy under the training mask gives, for every noisy
    block, the logits the cached decoder computes for that block after committing the clean
    blocks before it. Also pins the copied MRoPE ids. The reference's leaky mask fails it."""
    model = tiny_model.model
    batch = _batch(tiny_model, examples[:3], block_size)
    with torch.no_grad():
        logits = model(**batch.model_inputs(), use_cache=False).logits
        leaky = batch.attention_mask.clone()
        # the reference also lets clean block j see noisy blocks <= j
        for i, e in enumerate(examples[:3]):
            p, ell = e.prefix_length, int(batch.layout.response_lengths[i])
            for j in range(ell // block_size):
                rows = slice(p + j * block_size, p + (j + 1) * block_size)
                leaky[i, 0, rows, p + ell:p + ell + (j + 1) * block_size] = True
        leaky_logits = model(**batch.model_inputs(leaky), use_cache=False).logits
    decoder = BlockDiffusionDecoder(model, tiny_model.config)
    worst = worst_leaky = 0.0
    for i, e in enumerate(examples[:3]):
        p, ell = e.prefix_length, int(batch.layout.response_lengths[i])
        with torch.no_grad():
            prefix = decoder.prefill(prompt_batch([e], 0), block_size)
            for k in range(ell // block_size):
                noisy = batch.input_ids[i, p + ell + k * block_size:p + ell + (k + 1) * block_size]
                step_logits = decoder.forward_block(prefix, noisy.unsqueeze(0), k * block_size, keep=False)[0]
                rows = slice(p + ell + k * block_size, p + ell + (k + 1) * block_size)
                worst = max(worst, float((step_logits - logits[i, rows]).abs().max()))
                worst_leaky = max(worst_leaky, float((step_logits - leaky_logits[i, rows]).abs().max()))
                clean = batch.input_ids[i, p + k * block_size:p + (k + 1) * block_size]
                decoder.forward_block(prefix, clean.unsqueeze(0), k * block_size, keep=True)
    assert worst < 1e-3
    assert worst_leaky > 1e-2
