"""The real Qwen3-VL shapes (Qwen3-VL-2B / 8B-Instruct's configs), written once: the benchmark's and
``verify-device``'s random models and ``scripts/model_memory.py`` are built from them.

    from wam_diff2_core.model.shapes import qwen3_vl_config
    Qwen3VLConfig(**qwen3_vl_config("2b"))        # random weights in the real 2B shape
"""
from __future__ import annotations

from typing import Sequence

ROPE_THETA = 5_000_000.0
MROPE_SECTION = (24, 20, 20)
PATCHES = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304)

TEXT = {
    "2b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
               num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
VISION = {
    "2b": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, deepstack_visual_indexes=[5, 11, 17],
               **PATCHES),
    "8b": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, deepstack_visual_indexes=[8, 16, 24],
               **PATCHES),
}


def rope_parameters(section: Sequence[int] = MROPE_SECTION) -> dict:
    """Qwen3-VL's interleaved MRoPE over (t, h, w) sections of the rotary half-dimension."""
    return {"rope_type": "default", "rope_theta": ROPE_THETA, "mrope_section": list(section), "mrope_interleaved": True}


def qwen3_vl_config(name: str) -> dict:
    """``Qwen3VLConfig`` keyword arguments of the named real shape (``2b`` or ``8b``)."""
    text = TEXT[name]
    return dict(text_config=dict(**text, rope_parameters=rope_parameters()),
                vision_config=dict(**VISION[name], out_hidden_size=text["hidden_size"]),
                tie_word_embeddings=text["tie_word_embeddings"])
