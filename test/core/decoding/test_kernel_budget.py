"""The kernel budget of the default fast path, checked on CPU (benchmark/kernel_count.py): a step's forward
dispatches at most LAYER_BUDGET kernels per layer, so a 2B forward (28 layers) stays within FORWARD_TARGET, and
a change that adds kernels to a layer fails here without a GPU. Each fused layer op is counted as its operator,
the one kernel the Triton implementation launches (the default on CUDA)."""
from __future__ import annotations

import torch

from test.support.decoder_prompts import encode
from wam_diff2_core.benchmark.kernel_count import (FORWARD_TARGET, LAYER_BUDGET, LAYERS_2B, count_kernels,
                                                   static_forward_kernels)
from wam_diff2_core.decoding import make_decoder
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.layer_ops import ops


def test_default_fast_path_kernels_per_layer_and_per_2b_forward(tiny_model):
    m = tiny_model
    batch = encode(m.processor, [1])
    decoder = make_decoder(m.model, m.config)                         # the default: auto
    counts = static_forward_kernels(decoder, batch, block_size=32, ops=ops)      # as the Triton ops launch them
    for label in ("AR", "Block-32"):
        row = counts[label]
        budget = LAYER_BUDGET["AR" if label == "AR" else "Block"]
        assert row["per_layer"] <= budget, (label, row)
        assert row["outside"] + LAYERS_2B * row["per_layer"] <= FORWARD_TARGET, (label, row)
        assert row["total"] == row["outside"] + m.model.config.text_config.num_hidden_layers * row["per_layer"]
        # per layer: one op each for the norms, q/k norm + rotary + K/V write, SiLU * up; 4 matmuls; attention
        layers = m.model.config.text_config.num_hidden_layers
        assert row["ops"]["wam_diff2::qk_norm_rope_store"] == layers and row["ops"]["aten::mm"] == 4 * layers + 1
        assert row["ops"]["wam_diff2::add_rms_norm"] == 2 * layers and row["ops"]["wam_diff2::swiglu"] == layers
    # the counter sees what a layer of unfused ops costs: transformers' own forward of the same step
    plain = BlockDiffusionDecoder(m.model, m.config)
    with torch.no_grad():
        prefix = plain.prefill(batch, 32)
        block = torch.full((1, 32), m.config.mask_token_id)
        unfused = count_kernels(lambda: plain.forward_block(prefix, block, 0, keep=False)).total
    assert unfused > 3 * counts["Block-32"]["total"]
