"""FlashInfer attention for the static decoder (CUDA, bf16/fp16; ``pip install .[gpu]``, imported lazily).

The StaticKVCache's memory is used as FlashInfer's paged cache (NHD, ``PAGE_SIZE`` slots a page,
row r owning the pages r * slots / PAGE_SIZE onwards). Prompts are stored packed: row r's real
prompt tokens fill slots [0, P_r) and its response block k slots P_r + kB ..., so every request's
keys are a contiguous run of pages and padding is never stored.

- prompt prefill: one request per sequence, its P_r tokens against its P_r keys, under the
  block-causal prompt mask passed as a custom mask (FlashInfer has no block-causal mode);
- denoise step: one request per (sequence, block), B queries against the pages of prefix + blocks
  up to its own, NON-causal: inside a block attention is bidirectional, and ``causal=True`` would be
  token-causal there (wrong). The fused commit + step has two requests per sequence (block b and
  block b + 1) over shared pages;
- CUDA graphs: one wrapper per step shape, built with fixed index buffers (``use_cuda_graph``) and
  re-planned once per block (per token in AR) outside the graph; the graph replays ``run`` only;
- planning reads nothing from the device: the page tables come from the host-side lengths the decoder
  already knows (``kv_lengths``, prompt lengths); indptr and last-page lengths are handed to ``plan`` as
  host tensors (FlashInfer reads those on the host: device tensors there cost a device-to-host copy, a
  sync, each) and the page indices reach the device by an asynchronous copy from pinned memory.

This module never runs on a machine without an NVIDIA GPU; scripts/device_check.sh checks its tokens
against SDPA (CPU tests run its page tables and request layout against a pure-torch stand-in).
"""
from __future__ import annotations

import functools
from itertools import accumulate

import torch

from ..config import ConfigError
from .attention import AttentionBackend

WORKSPACE_BYTES = 256 * 1024 * 1024


def import_flashinfer():
    """The flashinfer module, or ConfigError saying why not: not installed, or installed but failing to
    import (a missing dependency such as ``tvm_ffi``, a library built for another CUDA or torch)."""
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - any import-time failure makes the backend unusable
        if isinstance(exc, ImportError) and getattr(exc, "name", None) == "flashinfer":
            raise ConfigError("attention_backend: flashinfer is not installed (pip install .[gpu], or "
                              "flashinfer-python for this torch/CUDA)") from exc
        raise ConfigError(f"attention_backend: flashinfer is installed but does not import "
                          f"({type(exc).__name__}: {exc})") from exc
    return flashinfer


@functools.cache
def flashinfer_problem() -> str:
    """Why FlashInfer cannot be used in this process ("" when it imports); imported once to find out."""
    try:
        import_flashinfer()
    except ConfigError as exc:
        return str(exc).removeprefix("attention_backend: ")
    return ""


class FlashInferAttention(AttentionBackend):
    """FlashInfer over the cache's pages (module doc); prompts stored packed."""

    name = "flashinfer"
    packed_prompts = True

    def __init__(self, text, use_cuda_graph: bool, kernels=None):
        """``kernels``: a module with FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` API; default
        the flashinfer package (CUDA, bf16/fp16). Tests pass a pure-torch stand-in to run on CPU."""
        if kernels is None:
            if text.device.type != "cuda":
                raise ConfigError(f"attention_backend: flashinfer needs a CUDA device (model is on {text.device})")
            if text.dtype not in (torch.bfloat16, torch.float16):
                raise ConfigError(f"attention_backend: flashinfer needs bfloat16 or float16 weights, not "
                                  f"{text.dtype} (use --dtype bfloat16, or attention_backend sdpa)")
            kernels = import_flashinfer()
        self.flashinfer = kernels
        self.text = text
        self.device = text.device
        self.use_cuda_graph = use_cuda_graph
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._prompt_wrapper = None
        self._wrappers: dict[tuple, object] = {}     # step shape -> wrapper (fixed buffers under graphs)

    def _host(self, values: list[int]) -> torch.Tensor:
        """int32 host tensor of ``values`` (pinned on CUDA, so a copy from it to the device is asynchronous)."""
        tensor = torch.tensor(values, dtype=torch.int32)
        return tensor.pin_memory() if self.device.type == "cuda" else tensor

    def _pages(self, cache, requests: list[tuple[int, int]]):
        """(row, kv_length) per request, known on the host -> indptr and last_page_len (int32 host tensors,
        as FlashInfer's plan reads them) and indices (int32 on the device, copied without a sync)."""
        indptr, indices, last = page_table(cache.slots // cache.page_size, cache.page_size, requests)
        return self._host(indptr), self._host(indices).to(self.device, non_blocking=True), self._host(last)

    def _plan_kwargs(self, cache) -> dict:
        t = self.text
        return dict(num_qo_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim_qk=t.head_dim,
                    page_size=cache.page_size, sm_scale=t.scaling, q_data_type=t.dtype, kv_data_type=t.dtype)

    def begin_prompt(self, plan, cache) -> None:
        lengths, size = plan.lengths, plan.block_size
        if self._prompt_wrapper is None:
            self._prompt_wrapper = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        qo_indptr = self._host(list(accumulate(lengths, initial=0)))
        kv_indptr, kv_indices, last = self._pages(cache, list(enumerate(lengths)))
        masks = []
        for p in lengths:          # block-causal: query block id >= key block id (ids = pos // B)
            block = torch.arange(p, device=self.device) // size
            masks.append((block.unsqueeze(1) >= block.unsqueeze(0)).flatten())
        self._prompt_wrapper.plan(qo_indptr, kv_indptr, kv_indices, last, custom_mask=torch.cat(masks),
                                  causal=False, **self._plan_kwargs(cache))

    def prompt(self, layer: int, attn, q: torch.Tensor, cache, plan) -> torch.Tensor:
        """q [N, H, T, D] (left-padded) -> [N, T, H, D]; padding positions get zeros (never read)."""
        rows, tokens = plan.select
        queries = q.transpose(1, 2)[rows, tokens]                                # [M, H, D] real tokens
        out = self._prompt_wrapper.run(queries, cache.pages(layer))
        full = q.new_zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3])
        full[rows, tokens] = out
        return full

    def graph_key(self, buf) -> tuple:
        return (self.name, tuple(buf.tokens.shape), tuple(e - s for s, e in buf.segments))

    def _wrapper_key(self, buf, cache) -> tuple:
        # A graph-mode wrapper's index buffers are sized for the graph cache: a call that runs eagerly
        # (a request longer than max_context_tokens, in its own cache) needs its own plain wrapper.
        return (*self.graph_key(buf), self.use_cuda_graph and cache.graphed)

    def _wrapper(self, buf, cache, requests: int):
        key = self._wrapper_key(buf, cache)
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            fixed = {}                  # a graph-mode wrapper's index buffers, sized for the graph cache
            if key[-1]:
                per_row = cache.slots // cache.page_size
                i32 = dict(dtype=torch.int32, device=self.device)
                fixed = dict(use_cuda_graph=True, qo_indptr_buf=torch.zeros(requests + 1, **i32),
                             paged_kv_indptr_buf=torch.zeros(requests + 1, **i32),
                             paged_kv_indices_buf=torch.zeros(requests * per_row, **i32),
                             paged_kv_last_page_len_buf=torch.zeros(requests, **i32))
            wrapper = self._wrappers[key] = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", **fixed)
        return wrapper

    def begin(self, buf, cache) -> None:
        """Plan the step's attention (host side, once per block): request (row, segment) has the
        segment's queries and the row's visible slots [0, kv_lengths[row][segment])."""
        rows = buf.tokens.shape[0]
        requests = [(r, buf.kv_lengths[r][j]) for r in range(rows) for j in range(len(buf.segments))]
        sizes = [stop - start for start, stop in buf.segments] * rows
        qo_indptr = self._host(list(accumulate(sizes, initial=0)))
        kv_indptr, kv_indices, last = self._pages(cache, requests)
        wrapper = self._wrapper(buf, cache, len(requests))
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, last, causal=False, **self._plan_kwargs(cache))

    def step_inputs(self, buf) -> None:
        return None             # the planned wrapper holds what every layer reads

    def step(self, layer: int, attn, q: torch.Tensor, cache, buf, shared=None) -> torch.Tensor:
        """q [R, H, Q, D] -> [R, Q, H, D]; requests are row-major (row, segment), as q's rows."""
        rows, heads, queries, dim = q.shape
        flat = q.transpose(1, 2).reshape(rows * queries, heads, dim)
        wrapper = self._wrappers[self._wrapper_key(buf, cache)]
        return wrapper.run(flat, cache.pages(layer)).view(rows, queries, heads, dim)


def page_table(pages_per_row: int, page_size: int, requests: list[tuple[int, int]]):
    """FlashInfer's page table, on the host, of requests (cache row, visible slots [0, kv_length)) over a
    StaticKVCache whose row r owns pages r * pages_per_row onwards: (indptr, page indices, last page length)."""
    indptr, indices, last = [0], [], []
    for row, kv_length in requests:
        pages = -(-kv_length // page_size)
        indices.extend(range(row * pages_per_row, row * pages_per_row + pages))
        indptr.append(indptr[-1] + pages)
        last.append(kv_length - (pages - 1) * page_size)
    return indptr, indices, last
