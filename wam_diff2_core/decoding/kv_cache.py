"""The static decoder's KV cache: every layer's K/V allocated once, written in place, never concatenated.

    cache = StaticKVCache(layers, rows, slots, kv_heads, head_dim, torch.bfloat16, device)
    cache.k[layer].index_put_((rows_index, slots_index), k)   # in place (layer_ops.qk_norm_rope_store does)
    cache.copy_rows(sources, span)                        # rows sharing a prompt take its prefilled K/V
    keys, values = cache.read(layer, rows, span)          # SDPA views of slots [0, span)
    k_pages, v_pages = cache.pages(layer)                 # the same memory as FlashInfer's paged cache
"""
from __future__ import annotations

import torch

PAGE_SIZE = 16          # cache slots per FlashInfer page; capacities are rounded up to it


class StaticKVCache:
    """K/V of every layer for ``rows`` sequences of ``slots`` tokens, allocated once, written in place.

    Layout [layers, rows, slots, kv_heads, head_dim]: a row's slots are contiguous, so the same memory
    is also a FlashInfer paged cache (NHD) whose row r owns pages r * slots / page_size onwards.
    Unwritten slots hold zeros and are never attended (masks, page tables).
    """

    def __init__(self, layers: int, rows: int, slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, page_size: int = PAGE_SIZE, graphed: bool = False):
        slots = -(-slots // page_size) * page_size
        self.graphed = graphed          # the CUDA-graph cache (allocated once) rather than an eager call's
        shape = (layers, rows, slots, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def slots(self) -> int:
        return self.k.shape[2]

    def read(self, layer: int, rows: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots [0, span) as SDPA wants them: [rows, kv_heads, span, head_dim] views."""
        return self.k[layer, :rows, :span].transpose(1, 2), self.v[layer, :rows, :span].transpose(1, 2)

    def copy_rows(self, sources: torch.Tensor, span: int) -> None:
        """Rows [0, len(sources)) take slots [0, span) of rows ``sources`` [N] (a row may be the source of
        several; all are read before any is written). One layer at a time: the temporary is one layer's."""
        n = sources.shape[0]
        for layer in range(self.k.shape[0]):
            self.k[layer, :n, :span] = self.k[layer, sources, :span]
            self.v[layer, :n, :span] = self.v[layer, sources, :span]

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashInfer's view: (k, v), each [rows * slots / page_size, page_size, kv_heads, head_dim]."""
        _, rows, slots, heads, dim = self.k.shape
        shape = (rows * slots // self.page_size, self.page_size, heads, dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def data_ptrs(self) -> tuple[int, int]:
        return self.k.data_ptr(), self.v.data_ptr()
