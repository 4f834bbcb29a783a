"""Qwen3-VL's text decoder run over the model's own modules, K/V going to a StaticKVCache.

The static decoder needs its own forward only to choose where K/V are stored and who computes
attention; every op is transformers' (same modules, same order), so results are bit-identical to
transformers' forward in float32 on CPU (test/core/decoding/test_static_decoder.py). Vision features and
DeepStack come from transformers' own Qwen3VLModel (:func:`text_model_inputs`).

    text = QwenTextForward(model)
    hidden = text.layers_forward(embeds, cos, sin, write=..., attend=...)
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def _rotary():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
    return apply_rotary_pos_emb


class QwenTextForward:
    """Qwen3-VL's text decoder run by hand over the model's own modules (no weight is copied).

    The ops are transformers' Qwen3VLTextDecoderLayer's, in the same order, so results are
    bit-identical in float32 on CPU; what differs is where K/V go (a StaticKVCache, in place) and
    who computes attention (a backend reading that cache).
    """

    def __init__(self, model):
        lm = model.model.language_model
        self.embed_tokens, self.layers, self.norm = lm.embed_tokens, lm.layers, lm.norm
        self.rotary_emb, self.lm_head = lm.rotary_emb, model.lm_head
        cfg = lm.config
        self.num_layers = len(lm.layers)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype, self.device = self.embed_tokens.weight.dtype, self.embed_tokens.weight.device
        self.apply_rotary = _rotary()

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MRoPE cos/sin [N, Q, head_dim] for position ids [3, N, Q] (the model's own rotary module)."""
        return self.rotary_emb(self.embed_tokens.weight, positions)

    def layers_forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       write: Callable, attend: Callable, deepstack=None) -> torch.Tensor:
        """hidden [N, Q, hidden] -> final-normed hidden. ``write(layer, k, v)`` stores the new K/V
        ([N, Q, kv_heads, head_dim]) before ``attend(layer, attn_module, q)`` ([N, H, Q, D] ->
        [N, Q, H, D]) reads them. ``deepstack``: (visual position mask, per-layer features)."""
        n, length = hidden.shape[:2]
        shape = (n, length, -1, self.head_dim)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)      # [N, H, Q, D]
            k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)      # [N, KVH, Q, D]
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = self.apply_rotary(q, k, cos, sin)
            write(i, k.transpose(1, 2), v.transpose(1, 2))
            out = attend(i, attn, q)                                         # [N, Q, H, D]
            hidden = hidden + attn.o_proj(out.reshape(n, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if deepstack is not None and deepstack[1] is not None and i < len(deepstack[1]):
                hidden = _add_deepstack(hidden, deepstack[0], deepstack[1][i])
        return self.norm(hidden)


def _add_deepstack(hidden: torch.Tensor, visual_mask: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """DeepStack: the vision tower's intermediate features are added at the visual positions after
    the first layers (as transformers' Qwen3VLTextModel does)."""
    hidden = hidden.clone()
    hidden[visual_mask, :] = hidden[visual_mask, :] + features.to(hidden.device, hidden.dtype)
    return hidden


class _TextInputsReady(Exception):
    pass


def text_model_inputs(model, input_ids, attention_mask, positions, mm_types, vision):
    """(inputs_embeds, visual position mask, DeepStack features) exactly as transformers' Qwen3VLModel
    hands them to its text model: we run that forward and stop it at the text model's door, so the
    vision tower, the merger and the placeholder scatter are transformers' own code."""
    captured: dict[str, Any] = {}

    def stop(_module, _args, kwargs):
        captured.update(kwargs)
        raise _TextInputsReady

    handle = model.model.language_model.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    mm_token_type_ids=mm_types, **vision)
    except _TextInputsReady:
        pass
    finally:
        handle.remove()
    return captured["inputs_embeds"], captured.get("visual_pos_masks"), captured.get("deepstack_visual_embeds")
