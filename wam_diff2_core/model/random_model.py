"""Random-weight Qwen3-VL models in the real shapes (or small ones for CPUs): what the benchmark, the
device check and the budget table time when no trained checkpoint is at hand.

    model, config = build_random_model("2b", "cuda", torch.bfloat16, seed=0, logit_scale=24.0)
"""
from __future__ import annotations

from .shapes import MROPE_SECTION, TEXT, VISION, rope_parameters

# Text dimensions (Qwen3-VL-2B-Instruct's config for "2b"); the vision tower is minimal unless a caller
# asks for the real one (VISION_2B: the device check times camera frame -> trajectory through it).
SHAPES = {
    "2b": {**TEXT["2b"], "mrope_section": list(MROPE_SECTION)},
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, mrope_section=[12, 10, 10],
                  tie_word_embeddings=False),
    "tiny": dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, mrope_section=[6, 5, 5],
                 tie_word_embeddings=False),
}

VISION_2B = VISION["2b"]


def random_model_config(shape: str | dict, *, vision: dict | None = None, token_ids: dict | None = None):
    """(Qwen3VLConfig, DiffusionConfig) of :func:`build_random_model`'s model, without building it. ``vision``: the
    vision tower's dimensions (default a minimal one); ``token_ids``: image / video / vision start and end ids
    (``image_token_id`` ...; default the last rows of the vocabulary)."""
    from transformers import Qwen3VLConfig

    from ..config import DecodingSettings, DiffusionConfig

    dims = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    section, tie = dims.pop("mrope_section"), dims.pop("tie_word_embeddings")
    config = Qwen3VLConfig(
        text_config=dict(**dims, max_position_embeddings=262144, rms_norm_eps=1e-6,
                         rope_parameters=rope_parameters(section)),
        vision_config=dict(vision or dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=16,
                                          spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256,
                                          deepstack_visual_indexes=[]), out_hidden_size=dims["hidden_size"]),
        **(token_ids or dict(image_token_id=dims["vocab_size"] - 3, video_token_id=dims["vocab_size"] - 4,
                             vision_start_token_id=dims["vocab_size"] - 5, vision_end_token_id=dims["vocab_size"] - 6)),
        tie_word_embeddings=tie)
    vocab = dims["vocab_size"]
    mask_id, eos_id = vocab - 1, vocab - 2
    # EOS is banned too: every decode runs to --new-tokens, so timings compare like for like.
    diffusion = DiffusionConfig(settings=DecodingSettings(), eos_token_id=eos_id, mask_token_id=mask_id,
                                banned_token_ids=tuple(range(vocab - 6, vocab)), vocab_size=vocab)
    return config, diffusion


def build_random_model(shape: str | dict, device, dtype, seed: int, logit_scale: float, *,
                       vision: dict | None = None, token_ids: dict | None = None):
    """(Qwen3VLForConditionalGeneration with random weights, DiffusionConfig) in a Qwen3-VL shape (a name of
    :data:`SHAPES` or such a dict); ``vision``, ``token_ids``: as :func:`random_model_config`. Logits are scaled
    by ``logit_scale`` through the final norm's weight, not the LM head: with tied embeddings (the 2B shape) that
    would scale the input embeddings too, and lose a trained model's spread of confidences."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    config, diffusion = random_model_config(shape, vision=vision, token_ids=token_ids)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config)
    model = model.to(dtype).eval()
    with torch.no_grad():
        model.model.language_model.norm.weight.mul_(logit_scale)    # logits = lm_head(norm(h)): all x scale
    return model, diffusion
