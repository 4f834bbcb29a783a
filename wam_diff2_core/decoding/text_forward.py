"""Qwen3-VL's text decoder for the static decoder: the model's own weights, packed projections, fused layer ops.

A layer is ten kernels at a Block-32 step (benchmark/kernel_count.py counts them): the residual add and
RMSNorm as one op, the q/k/v projections as one matmul, q/k norms + rotary + the K/V cache write as one op,
attention (a backend reading the cache), the output projection, the next add + norm, gate and up as one
matmul, SiLU * up as one op, the down projection (whose residual add joins the next layer's norm).
The ops are layer_ops.py's: transformers' own ops in its order (bit-identical to the model's modules in
float32 on CPU: test/core/decoding/test_static_decoder.py) or one Triton kernel each. Projections are packed
by re-pointing the model's q/k/v (gate/up) weights at row blocks of one tensor (:func:`pack_linears`): no
weight is copied, checkpoints and the plain decoder see the same modules, and an optimizer step or
``load_state_dict`` updates both. Vision features and DeepStack come from transformers' own Qwen3VLModel
(:func:`text_model_inputs`).

    text = QwenTextForward(model, kernels)
    hidden = text.layers_forward(embeds, cos, sin, cache, rows, slots, attend=..., last=1)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.nn import functional as F

from .kv_cache import StaticKVCache
from .layer_ops import LayerKernels


QKV, GATE_UP = "_wam_diff2_qkv", "_wam_diff2_gate_up"     # the packed tensors' attribute names on the modules


def pack_linears(owner: torch.nn.Module, name: str, linears: Sequence[torch.nn.Module]) -> torch.Tensor | None:
    """One weight [sum of outputs, inputs] whose row blocks are ``linears``' weights, which are re-pointed at
    those blocks (kept on ``owner`` as attribute ``name``, and reused by the next decoder of the same model).
    None where a linear is not a plain ``nn.Linear`` without bias over a float weight (quantized layers keep
    their own modules)."""
    weights = [m.weight for m in linears]
    if any(type(m) is not torch.nn.Linear or m.bias is not None or type(w.data) is not torch.Tensor
           for m, w in zip(linears, weights)) or len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return None
    packed = owner.__dict__.get(name)
    if packed is not None and _aliases(packed, weights):
        return packed
    with torch.no_grad():
        packed = torch.cat([w.detach() for w in weights])
        start = 0
        for w in weights:
            w.data = packed[start:start + w.shape[0]]
            start += w.shape[0]
    owner.__dict__[name] = packed
    return packed


def _aliases(packed: torch.Tensor, weights: Sequence[torch.Tensor]) -> bool:
    """The weights still lie, in order, in ``packed`` (the model was not moved nor its weights replaced)."""
    offset = 0
    for w in weights:
        if w.data_ptr() != packed[offset:offset + w.shape[0]].data_ptr() or not w.is_contiguous():
            return False
        offset += w.shape[0]
    return offset == packed.shape[0]


@dataclass
class FusedLayer:
    """One decoder layer's weights as the fused forward reads them (the model's tensors, no copies)."""

    attn: torch.nn.Module               # self_attn: o_proj, and q/k/v where not packed
    mlp: torch.nn.Module                # down_proj, and gate/up where not packed
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    eps: float
    qkv: torch.Tensor | None            # [(H + 2 KVH) D, hidden] packed, or None
    gate_up: torch.Tensor | None        # [2 I, hidden] packed, or None
    silu: bool                          # the MLP's activation is SiLU (else the module's MLP runs)

    @classmethod
    def of(cls, layer) -> "FusedLayer":
        attn, mlp = layer.self_attn, layer.mlp
        silu = isinstance(mlp.act_fn, torch.nn.SiLU) or type(mlp.act_fn).__name__ == "SiLUActivation"
        return cls(attn, mlp, layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                   attn.q_norm.weight, attn.k_norm.weight, layer.input_layernorm.variance_epsilon,
                   pack_linears(attn, QKV, [attn.q_proj, attn.k_proj, attn.v_proj]),
                   pack_linears(mlp, GATE_UP, [mlp.gate_proj, mlp.up_proj]) if silu else None, silu)

    def current(self) -> bool:
        a, m = self.attn, self.mlp
        return ((self.qkv is None or _aliases(self.qkv, [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                and (self.gate_up is None or _aliases(self.gate_up, [m.gate_proj.weight, m.up_proj.weight])))


class QwenTextForward:
    """Qwen3-VL's text decoder over the model's own weights with packed projections and fused ops (module doc)."""

    def __init__(self, model, kernels: LayerKernels):
        lm = model.model.language_model
        self.embed_tokens, self.norm, self.rotary_emb, self.lm_head = lm.embed_tokens, lm.norm, lm.rotary_emb, model.lm_head
        cfg = lm.config
        self.kernels, self.ops = kernels, kernels.ops
        self.layers = [FusedLayer.of(layer) for layer in lm.layers]
        self.num_layers = len(self.layers)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = lm.layers[0].self_attn.scaling
        self.dtype, self.device = self.embed_tokens.weight.dtype, self.embed_tokens.weight.device

    def check_weights(self) -> None:
        """Raise if the model's projection weights left the packed tensors (moved or replaced after this
        forward was made): its packed matmuls (and any CUDA graph) would read stale weights. The stale packed
        tensors are dropped from the model's modules, so they go with this forward."""
        if not all(layer.current() for layer in self.layers):
            for layer in self.layers:
                for module, name, packed in ((layer.attn, QKV, layer.qkv), (layer.mlp, GATE_UP, layer.gate_up)):
                    if module.__dict__.get(name) is packed:
                        del module.__dict__[name]
            raise RuntimeError("the model's projection weights were moved or replaced after this decoder was made "
                               "(model.to(...), or parameters assigned anew): make a new decoder")

    def with_layers(self, count: int, ops=None) -> "QwenTextForward":
        """The same forward over the first ``count`` layers, calling ``ops`` (a kernel count per layer compares 1
        and 2 layers, through the operators: torch.ops.wam_diff2)."""
        other = object.__new__(QwenTextForward)
        other.__dict__.update(self.__dict__, layers=self.layers[:count], num_layers=count, ops=ops or self.ops)
        return other

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MRoPE cos/sin [N, Q, head_dim] for position ids [3, N, Q] (the model's own rotary module)."""
        return self.rotary_emb(self.embed_tokens.weight, positions)

    def layers_forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache,
                       rows: torch.Tensor, slots: torch.Tensor, attend: Callable, deepstack=None,
                       last: int | None = None) -> torch.Tensor:
        """hidden [N, Q, hidden] -> the final-normed hidden of the last ``last`` queries (all when None).
        Each layer stores its K/V at (``rows``, ``slots``) [N, Q] of ``cache`` before ``attend(layer, attn_module,
        q)`` ([N, H, Q, D] -> [N, Q, H, D]) reads them. ``deepstack``: (visual position mask, per-layer features)."""
        n, length = hidden.shape[:2]
        ops, triton = self.ops, self.kernels.triton
        delta = None                # the last MLP output, added to ``hidden`` by the next norm
        for i, layer in enumerate(self.layers):
            if delta is None:
                x = ops.rms_norm(hidden, layer.input_norm, layer.eps, triton)
            else:
                x, hidden = ops.add_rms_norm(delta, hidden, layer.input_norm, layer.eps, triton)
            attn = layer.attn
            if layer.qkv is not None:
                q, k, v = F.linear(x, layer.qkv).split(
                    [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2, dim=-1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q = ops.qk_norm_rope_store(q, k, v, layer.q_norm, layer.k_norm, cos, sin, layer.eps, cache.k[i],
                                       cache.v[i], rows, slots, triton)               # [N, H, Q, D]
            out = attend(i, attn, q)                                                  # [N, Q, H, D]
            x, hidden = ops.add_rms_norm(attn.o_proj(out.reshape(n, length, -1)), hidden, layer.post_norm,
                                         layer.eps, triton)
            delta = self._mlp(layer, x, ops, triton)
            if deepstack is not None and deepstack[1] is not None and i < len(deepstack[1]):
                # DeepStack: the vision tower's intermediate features added at the visual positions after the
                # first layers (as transformers' Qwen3VLTextModel does)
                visual, features = deepstack[0], deepstack[1][i]
                hidden = hidden + delta
                hidden[visual, :] = hidden[visual, :] + features.to(hidden.device, hidden.dtype)
                delta = None
        start = length - (length if last is None else last)
        if delta is None:
            return ops.rms_norm(hidden[:, start:], self.norm.weight, self.norm.variance_epsilon, triton)
        return ops.add_rms_norm(delta[:, start:], hidden[:, start:], self.norm.weight, self.norm.variance_epsilon,
                                triton)[0]

    @staticmethod
    def _mlp(layer: FusedLayer, x: torch.Tensor, ops, triton: bool) -> torch.Tensor:
        mlp = layer.mlp
        if not layer.silu:
            return mlp(x)
        if layer.gate_up is not None:
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
        else:
            gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        return mlp.down_proj(ops.swiglu(gate, up, triton))


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
