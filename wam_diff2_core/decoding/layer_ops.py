"""The fused ops of the static decoder's layers, each one torch operator (``torch.ops.wam_diff2.*``):

- ``rms_norm(x, weight, eps)`` and ``add_rms_norm(x, residual, weight, eps) -> (normed, residual + x)``: the
  layer norms, the residual add folded into the norm that follows it;
- ``qk_norm_rope_store(q, k, v, ..., k_cache, v_cache, rows, slots) -> q``: the q / k norms, rotary on q and k,
  q in the ``[N, H, Q, D]`` layout attention takes, K and V written into the layer's cache;
- ``swiglu(gate, up)``: SiLU(gate) * up.

Each op runs one of two implementations, named by its ``triton`` argument (chosen once per decoder by
:func:`resolve_layer_kernels`):
- torch (``triton=False``): transformers' own ops for the same work, in its order (its RMSNorm, its
  ``apply_rotary_pos_emb``, SiLU then the product), so the static decoder stays bit-identical to the model's
  modules in float32 on CPU;
- triton: one Triton kernel per op (triton_kernels.py), on CUDA (on CPU only under ``TRITON_INTERPRET=1``).
Being one operator each, an op is one entry in a dispatch count whichever runs (benchmark/kernel_count.py
counts kernels on CPU that way), and torch.compile and CUDA graphs see one opaque call.

    x, hidden = torch.ops.wam_diff2.add_rms_norm(delta, hidden, weight, 1e-6, kernels.triton)
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace

import torch
from torch import Tensor
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

from ..config import LAYER_KERNELS, ConfigError

log = logging.getLogger(__name__)


def _norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Qwen3VLTextRMSNorm, op for op."""
    dtype = x.dtype
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(dtype)


@cache
def _triton():
    from . import triton_kernels
    return triton_kernels


def _rms_norm(x: Tensor, weight: Tensor, eps: float, triton: bool) -> Tensor:
    if triton:
        return _triton().add_rms_norm(x, None, weight, eps)[0]
    return _norm(x, weight, eps).contiguous()


def _add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, triton: bool) -> tuple[Tensor, Tensor]:
    if triton:
        return _triton().add_rms_norm(x, residual, weight, eps)
    total = (residual + x).contiguous()
    return _norm(total, weight, eps).contiguous(), total


def _qk_norm_rope_store(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor,
                        sin: Tensor, eps: float, k_cache: Tensor, v_cache: Tensor, rows: Tensor, slots: Tensor,
                        triton: bool) -> Tensor:
    """q, k, v [N, Q, heads * D]; cos, sin [N, Q, D]; caches [rows, slots, KVH, D]; rows, slots [N, Q]."""
    if triton:
        return _triton().qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, eps, k_cache, v_cache, rows, slots)
    n, queries, _ = q.shape
    dim = q_weight.shape[0]
    q = _norm(q.view(n, queries, -1, dim), q_weight, eps).transpose(1, 2)          # [N, H, Q, D]
    k = _norm(k.view(n, queries, -1, dim), k_weight, eps).transpose(1, 2)          # [N, KVH, Q, D]
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k_cache.index_put_((rows, slots), k.transpose(1, 2))
    v_cache.index_put_((rows, slots), v.view(n, queries, -1, dim))
    return q.contiguous()


def _swiglu(gate: Tensor, up: Tensor, triton: bool) -> Tensor:
    if triton:
        return _triton().swiglu(gate, up)
    return (torch.nn.functional.silu(gate) * up).contiguous()


# Defined with torch.library's low-level API (a schema and one CompositeExplicitAutograd kernel each) rather
# than ``custom_op``, whose Python wrappers cost ~30 us a call on CPU, more than a tiny model's op itself.
_LIBRARY = torch.library.Library("wam_diff2", "DEF")
for _schema, _kernel in (
        ("rms_norm(Tensor x, Tensor weight, float eps, bool triton) -> Tensor", _rms_norm),
        ("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, bool triton) -> (Tensor, Tensor)",
         _add_rms_norm),
        ("qk_norm_rope_store(Tensor q, Tensor k, Tensor v, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, "
         "float eps, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor rows, Tensor slots, bool triton) -> Tensor",
         _qk_norm_rope_store),
        ("swiglu(Tensor gate, Tensor up, bool triton) -> Tensor", _swiglu)):
    _LIBRARY.define(_schema)
    _LIBRARY.impl(_schema.split("(")[0], _kernel, "CompositeExplicitAutograd")


@torch.library.register_fake("wam_diff2::rms_norm", lib=_LIBRARY)
def _(x, weight, eps, triton):
    return x.new_empty(x.shape)


@torch.library.register_fake("wam_diff2::add_rms_norm", lib=_LIBRARY)
def _(x, residual, weight, eps, triton):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.register_fake("wam_diff2::qk_norm_rope_store", lib=_LIBRARY)
def _(q, k, v, q_weight, k_weight, cos, sin, eps, k_cache, v_cache, rows, slots, triton):
    n, queries, _ = q.shape
    dim = q_weight.shape[0]
    return q.new_empty((n, q.shape[2] // dim, queries, dim))


@torch.library.register_fake("wam_diff2::swiglu", lib=_LIBRARY)
def _(gate, up, triton):
    return gate.new_empty(gate.shape)


ops = torch.ops.wam_diff2
rms_norm, add_rms_norm, qk_norm_rope_store, swiglu = (ops.rms_norm, ops.add_rms_norm, ops.qk_norm_rope_store,
                                                      ops.swiglu)
# The torch implementations called directly, without the dispatcher's round trip (~10 us an op, 4 % of the demo
# model's CPU forward): what a forward with the torch ops runs; a kernel count runs the operators instead.
DIRECT = SimpleNamespace(rms_norm=_rms_norm, add_rms_norm=_add_rms_norm, qk_norm_rope_store=_qk_norm_rope_store,
                         swiglu=_swiglu)


@dataclass(frozen=True)
class LayerKernels:
    """Which implementation the layer ops run (``triton``), and why (logged, reported by the warm-up)."""

    triton: bool
    reason: str

    @property
    def name(self) -> str:
        return "triton" if self.triton else "torch"

    @property
    def ops(self):
        """The ops a forward calls: the operators (Triton kernels behind them), or the torch ones directly."""
        return ops if self.triton else DIRECT


def triton_problem(device: torch.device, head_dim: int) -> str | None:
    """Why the Triton kernels cannot run here (None: they can)."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device.type != "cuda" and not (device.type == "cpu" and interpreted):
        return f"Triton kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {device.type}"
    if head_dim % 2 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two (the rotary kernel's halves)"
    try:
        _triton()
    except Exception as exc:  # noqa: BLE001 - an import failure of any kind means: not here
        return f"triton does not import: {type(exc).__name__}: {exc}"
    return None


def resolve_layer_kernels(setting: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> LayerKernels:
    """``engine.layer_kernels`` made concrete: ``torch``; ``triton`` (a ConfigError where it cannot run); ``auto``:
    Triton on CUDA when it imports and :func:`self_check` passes on this device, else torch (the reason logged)."""
    if setting not in LAYER_KERNELS:
        raise ConfigError(f"layer_kernels: {setting!r} is not one of {', '.join(LAYER_KERNELS)}")
    if setting == "torch":
        return LayerKernels(False, "layer_kernels torch")
    problem = triton_problem(device, head_dim)
    if setting == "triton":
        if problem:
            raise ConfigError(f"layer_kernels: triton: {problem}")
        return LayerKernels(True, "layer_kernels triton")
    if device.type != "cuda":
        return LayerKernels(False, f"layer_kernels auto: torch ops on {device.type}")
    problem = problem or self_check(device, dtype, head_dim)
    if problem:
        log.warning("layer_kernels auto: the torch ops instead of Triton: %s", problem)
        return LayerKernels(False, f"layer_kernels auto: torch ops ({problem})")
    return LayerKernels(True, "layer_kernels auto: Triton (self-check passed)")


@cache
def self_check(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Every op once through Triton and once through torch on small random inputs of this device and dtype
    (compiling the kernels, seconds the first time, then cached by Triton on disk): None when they agree to the
    dtype's rounding, else what went wrong. Run by ``auto`` before it picks Triton, once per process and case."""
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        return next((f"{name}: {problem}" for name, problem in
                     compare_implementations(device, dtype, head_dim, gen).items() if problem), None)
    except Exception as exc:  # noqa: BLE001 - a kernel that fails to compile or launch is a reason, not a crash
        return f"{type(exc).__name__}: {exc}"


# float32: reduction order only; bf16 / fp16: also one rounding of an output that sits at a rounding boundary
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def compare_implementations(device: torch.device, dtype: torch.dtype, head_dim: int, gen: torch.Generator,
                            n: int = 2, queries: int = 3, heads: int = 4, kv_heads: int = 2) -> dict[str, str | None]:
    """Each op's Triton result against its torch result on random inputs laid out as the decoder passes them
    (views of one packed projection output, caches written at scattered slots): op -> None, or the mismatch."""
    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    width, inter = heads * head_dim, 3 * head_dim
    problems: dict[str, str | None] = {}

    def same(name: str, got: Tensor, want: Tensor) -> None:
        err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        scale = max(1.0, want.float().abs().max().item())
        problems[name] = None if got.shape == want.shape and err <= TOLERANCE[dtype] * scale else (
            f"{tuple(got.shape)} vs {tuple(want.shape)}, max error {err:.3g} (scale {scale:.3g})")

    packed = rand(n, queries, width + 2 * kv_heads * head_dim)              # [N, Q, (H + 2 KVH) D]
    q, k, v = packed.split([width, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    weight = rand(width)
    residual = rand(n, queries, width)
    same("rms_norm", rms_norm(q, weight, 1e-6, True), rms_norm(q, weight, 1e-6, False))
    got, want = add_rms_norm(q, residual, weight, 1e-6, True), add_rms_norm(q, residual, weight, 1e-6, False)
    same("add_rms_norm", got[0], want[0])
    same("add_rms_norm (sum)", got[1], want[1])
    angles = torch.rand(n, queries, head_dim // 2, generator=gen, device=device) * 6.0
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    rows = torch.arange(n, device=device).unsqueeze(1).expand(n, queries)
    slots = torch.randperm(4 * queries, generator=gen, device=device)[:queries].unsqueeze(0).expand(n, queries)
    caches = [torch.zeros(n, 4 * queries, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(4)]
    q_weight, k_weight = rand(head_dim), rand(head_dim)
    got_q = qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, 1e-6, caches[0], caches[1], rows, slots, True)
    want_q = qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, 1e-6, caches[2], caches[3], rows, slots, False)
    same("qk_norm_rope_store (q)", got_q, want_q)
    same("qk_norm_rope_store (k cache)", caches[0], caches[2])
    same("qk_norm_rope_store (v cache)", caches[1], caches[3])
    gate_up = rand(n, queries, 2 * inter)
    gate, up = gate_up.split(inter, dim=-1)
    same("swiglu", swiglu(gate, up, True), swiglu(gate, up, False))
    return problems
