"""The Triton kernels of the static decoder's fused layer ops (layer_ops.py): one kernel per op.

Each kernel does its arithmetic in float32 and rounds to the activations' dtype exactly where transformers'
Qwen3-VL modules round (a bf16 op rounds its result), so it differs from the reference ops only in the order
of a reduction. Imported only where Triton is (layer_ops.py decides); on CPU the kernels run under Triton's
interpreter (``TRITON_INTERPRET=1``), which is how CI checks them (test/core/decoding/test_layer_ops.py).
Tensors are ``[N, Q, width]`` with a unit stride along ``width``; the other strides are passed, so the views of a
packed projection's output go in without a copy. Outputs are new contiguous tensors, or the KV cache written
in place.

    out, total = add_rms_norm(x, residual, weight, eps)      # residual + x, and its RMSNorm
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, queries, stride_xn, stride_xq, stride_rn, stride_rq,
                     width, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)      # int64 offsets: a long prefill's tensors pass 2**31 elements
    n, q = token // queries, token % queries
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(x_ptr + n * stride_xn + q * stride_xq + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + n * stride_rn + q * stride_rq + cols, mask=inside, other=0.0).to(tl.float32)
        total = (x + r).to(sum_ptr.dtype.element_ty)            # the residual stream, rounded as stored
        tl.store(sum_ptr + token * width + cols, total, mask=inside)
        x = total.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / width
    normed = (x * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * width + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _qk_norm_rope_store_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr,
                               v_cache_ptr, rows_ptr, slots_ptr, queries, heads, stride_qn, stride_qq, stride_kn,
                               stride_kq, stride_vn, stride_vq, stride_cn, stride_cq, cache_row_stride,
                               cache_slot_stride, eps, HALF: tl.constexpr):
    """Program (token, head): heads [0, H) are query heads, [H, H + KVH) key heads (each also moves its V head)."""
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n, q = token // queries, token % queries
    dtype = q_out_ptr.dtype.element_ty
    lo = tl.arange(0, HALF)
    hi = lo + HALF
    if head < heads:
        src = q_ptr + n * stride_qn + q * stride_qq + head * 2 * HALF
        w_ptr = qw_ptr
    else:
        src = k_ptr + n * stride_kn + q * stride_kq + (head - heads) * 2 * HALF
        w_ptr = kw_ptr
    x1 = tl.load(src + lo).to(tl.float32)
    x2 = tl.load(src + hi).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
    y1 = (tl.load(w_ptr + lo).to(tl.float32) * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    y2 = (tl.load(w_ptr + hi).to(tl.float32) * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    rope = cos_ptr + n * stride_cn + q * stride_cq
    cos1, cos2 = tl.load(rope + lo).to(tl.float32), tl.load(rope + hi).to(tl.float32)
    rope = sin_ptr + n * stride_cn + q * stride_cq
    sin1, sin2 = tl.load(rope + lo).to(tl.float32), tl.load(rope + hi).to(tl.float32)
    # y * cos + rotate_half(y) * sin, rotate_half(y) = (-y2, y1): each product and the sum rounded
    o1 = ((y1 * cos1).to(dtype).to(tl.float32) + (-y2 * sin1).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((y2 * cos2).to(dtype).to(tl.float32) + (y1 * sin2).to(dtype).to(tl.float32)).to(dtype)
    if head < heads:
        dst = q_out_ptr + ((n * heads + head) * queries + q) * 2 * HALF          # [N, H, Q, D]
        tl.store(dst + lo, o1)
        tl.store(dst + hi, o2)
    else:
        kv_head = head - heads
        offset = (tl.load(rows_ptr + token) * cache_row_stride + tl.load(slots_ptr + token) * cache_slot_stride
                  + kv_head * 2 * HALF)
        tl.store(k_cache_ptr + offset + lo, o1)
        tl.store(k_cache_ptr + offset + hi, o2)
        v = v_ptr + n * stride_vn + q * stride_vq + kv_head * 2 * HALF
        tl.store(v_cache_ptr + offset + lo, tl.load(v + lo))
        tl.store(v_cache_ptr + offset + hi, tl.load(v + hi))


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, queries, stride_gn, stride_gq, stride_un, stride_uq, width,
                   BLOCK: tl.constexpr):
    token, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n, q = token // queries, token % queries
    cols = part * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    dtype = out_ptr.dtype.element_ty
    g = tl.load(g_ptr + n * stride_gn + q * stride_gq + cols, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + n * stride_un + q * stride_uq + cols, mask=inside, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)                   # SiLU, rounded as the module's
    tl.store(out_ptr + token * width + cols, (act * u).to(dtype), mask=inside)


def _warps(block: int) -> int:
    return max(1, min(8, block // 256))


def _rows_of(*tensors: torch.Tensor) -> None:
    """The layout the kernels assume: [N, Q, width] with a unit stride along width (the strides of N and Q are
    passed)."""
    for t in tensors:
        if t.dim() != 3 or t.stride(2) != 1:
            raise ValueError(f"triton_kernels: a [N, Q, width] tensor with a unit last stride, got shape "
                             f"{tuple(t.shape)} strides {t.stride()}")


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of ``residual + x`` (of ``x`` when ``residual`` is None): (normed, the sum or None)."""
    _rows_of(x, *([residual] if residual is not None else []), weight.view(1, 1, -1))
    n, queries, width = x.shape
    out = torch.empty((n, queries, width), dtype=x.dtype, device=x.device)
    total = torch.empty_like(out) if residual is not None else None
    block = triton.next_power_of_2(width)
    res = residual if residual is not None else x
    _rms_norm_kernel[(n * queries,)](x, res, weight, out, total if total is not None else out, queries,
                                     x.stride(0), x.stride(1), res.stride(0), res.stride(1), width, eps,
                                     HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block))
    return out, total


def qk_norm_rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                       slots: torch.Tensor) -> torch.Tensor:
    """q, k, v [N, Q, heads * D] -> q normed and rotated [N, H, Q, D]; k normed and rotated and v stored at
    (rows, slots) [N, Q] of the layer's caches [rows, slots, KVH, D]."""
    _rows_of(q, k, v, cos, sin)
    if cos.stride() != sin.stride() or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("triton_kernels.qk_norm_rope_store: cos and sin, and the K and V caches, must share strides "
                         f"(got {cos.stride()} / {sin.stride()}, {k_cache.stride()} / {v_cache.stride()})")
    n, queries, _ = q.shape
    dim = q_weight.shape[0]
    heads, kv_heads = q.shape[2] // dim, k.shape[2] // dim
    out = torch.empty((n, heads, queries, dim), dtype=q.dtype, device=q.device)
    rows, slots = rows.contiguous(), slots.contiguous()
    _qk_norm_rope_store_kernel[(n * queries, heads + kv_heads)](
        q, k, v, q_weight, k_weight, cos, sin, out, k_cache, v_cache, rows, slots, queries, heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), cos.stride(1),
        k_cache.stride(0), k_cache.stride(1), eps, HALF=dim // 2, num_warps=1)
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, [N, Q, width]."""
    _rows_of(gate, up)
    n, queries, width = gate.shape
    out = torch.empty((n, queries, width), dtype=gate.dtype, device=gate.device)
    block = min(1024, triton.next_power_of_2(width))
    _swiglu_kernel[(n * queries, triton.cdiv(width, block))](gate, up, out, queries, gate.stride(0), gate.stride(1),
                                                             up.stride(0), up.stride(1), width, BLOCK=block,
                                                             num_warps=_warps(block))
    return out
