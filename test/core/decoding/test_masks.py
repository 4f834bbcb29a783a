"""Block-causal masks and response positions, pinned against hand-written expectations."""
from __future__ import annotations

import torch

from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.masks import (block_query_mask, first_response_block_id, prompt_block_mask,
                                           response_positions)


def test_prompt_blocks_start_at_position_zero():
    m = prompt_block_mask(torch.ones(1, 6, dtype=torch.long), 4)[0, 0].int()
    expected = torch.tensor([
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],   # the partial last block (positions 4, 5) sees block 0 and itself
        [1, 1, 1, 1, 1, 1],
    ])
    assert torch.equal(m, expected)


def test_block_size_one_is_causal():
    m = prompt_block_mask(torch.ones(1, 5, dtype=torch.long), 1)[0, 0]
    assert torch.equal(m, torch.tril(torch.ones(5, 5, dtype=torch.bool)))


def test_left_padding_shifts_blocks_with_the_tokens_and_is_never_attended():
    padded = prompt_block_mask(torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]]), 4)[0, 0]
    alone = prompt_block_mask(torch.ones(1, 6, dtype=torch.long), 4)[0, 0]
    assert torch.equal(padded[2:, 2:], alone)             # blocks counted from the first real token
    assert not padded[2:, :2].any()                       # padding is never a key for real tokens
    assert torch.equal(padded[:2, :2], torch.eye(2, dtype=torch.bool))  # pad rows: self only (no empty softmax)


def test_first_response_block_follows_every_prompt_block():
    assert first_response_block_id(6, 4) == 2      # prompt blocks 0 and 1 (partial)
    assert first_response_block_id(8, 4) == 2      # exact multiple
    assert first_response_block_id(1, 32) == 1
    assert first_response_block_id(33, 32) == 2


def test_block_query_mask_sees_valid_prefix_and_whole_block():
    prefix_valid = torch.tensor([[False, True, True], [True, True, True]])
    m = block_query_mask(prefix_valid, 2)
    assert m.shape == (2, 1, 2, 5)
    assert torch.equal(m[0, 0], torch.tensor([[False, True, True, True, True]] * 2))
    assert m[1].all()


def test_response_positions_use_the_rope_delta_on_all_axes():
    pos = response_positions(torch.tensor([10, 3]), offset=32, length=4)
    assert pos.shape == (3, 2, 4)
    assert torch.equal(pos[:, 0], torch.tensor([[42, 43, 44, 45]] * 3))
    assert torch.equal(pos[:, 1], torch.tensor([[35, 36, 37, 38]] * 3))


def test_prefill_next_position_is_prompt_length_plus_rope_delta(tiny_model, rgb_frame):
    from PIL import Image

    from wam_diff2_core.model.prompt_encoding import encode_prompts
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "where to?"}]}]
    inputs = encode_prompts(tiny_model.processor, [conv], [[Image.fromarray(rgb_frame)]])
    _, rope_delta = tiny_model.model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"])
    prefix = BlockDiffusionDecoder(tiny_model.model, tiny_model.config).prefill(inputs, 32)
    p = inputs["input_ids"].shape[1]
    assert int(rope_delta) < 0                           # an image compresses positions
    assert prefix.next_position.tolist() == [p + int(rope_delta)]
