"""A test double of FlashInfer's paged prefill wrapper, so the FlashInfer backend's own logic (packing, page
tables, request layout, the plan's arguments) runs on a CPU without FlashInfer. The real kernels are checked
against the SDPA backend by the device check (scripts/device_check.sh)."""
from __future__ import annotations

import torch


class PagedPrefillDouble:
    """FlashInfer's BatchPrefillWithPagedKVCacheWrapper (NHD pages, per-request custom masks) in plain
    torch, to run the FlashInfer backend's packing, page tables and request layout on CPU."""

    plans = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None, **buffers):
        assert kv_layout == "NHD"
        self.fixed_batch = len(qo_indptr_buf) - 1 if use_cuda_graph else None

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim_qk,
             page_size, custom_mask=None, causal=False, sm_scale=None, q_data_type=None, kv_data_type=None):
        assert not causal, "block attention is bidirectional: never causal=True"
        for t in (qo_indptr, kv_indptr, kv_indices, last_page_len):
            assert t.dtype == torch.int32
        assert bool((last_page_len >= 1).all() and (last_page_len <= page_size).all())
        if self.fixed_batch is not None:
            assert len(qo_indptr) - 1 == self.fixed_batch
        self.qo, self.kv_indptr, self.kv_indices = qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.tolist()
        self.kv_len = [(e - b - 1) * page_size + last for b, e, last in
                       zip(self.kv_indptr, self.kv_indptr[1:], last_page_len.tolist())]
        self.mask, self.scale, self.heads = custom_mask, sm_scale, (num_qo_heads, num_kv_heads)
        PagedPrefillDouble.plans.append(dict(queries=[e - b for b, e in zip(self.qo, self.qo[1:])],
                                             kv=list(self.kv_len), custom=custom_mask is not None))

    def run(self, q, paged_kv_cache):
        k_pages, v_pages = paged_kv_cache
        assert q.shape[0] == self.qo[-1]
        out, offset = torch.empty_like(q), 0
        repeat = self.heads[0] // self.heads[1]
        for r, kv_len in enumerate(self.kv_len):
            pages = self.kv_indices[self.kv_indptr[r]:self.kv_indptr[r + 1]]
            k = k_pages[pages].flatten(0, 1)[:kv_len].transpose(0, 1).repeat_interleave(repeat, 0)
            v = v_pages[pages].flatten(0, 1)[:kv_len].transpose(0, 1).repeat_interleave(repeat, 0)
            qs = q[self.qo[r]:self.qo[r + 1]].transpose(0, 1)
            mask = None
            if self.mask is not None:
                mask = self.mask[offset:offset + qs.shape[1] * kv_len].view(qs.shape[1], kv_len)
                offset += qs.shape[1] * kv_len
            out[self.qo[r]:self.qo[r + 1]] = torch.nn.functional.scaled_dot_product_attention(
                qs, k, v, attn_mask=mask, scale=self.scale).transpose(0, 1)
        return out
