"""Kernels per forward, counted on any device: the operators one forward dispatches (a ``TorchDispatchMode``),
views and allocations left out.

Each counted operator launches one kernel on CUDA: a matmul one cuBLAS call, SDPA one attention kernel, each
of layer_ops.py's fused ops one Triton kernel whichever implementation runs (an op is one operator to the
dispatcher; its torch implementation's inner ops are not seen). So a count on CPU is the count a GPU launches,
up to a layout copy one device makes and another does not; at ~4.5 us a kernel in a CUDA graph on the H200,
the count times that is a floor on a forward's time that the memory floor does not show. ``verify-device`` and
``bench`` print it per variant; test/core/decoding/test_kernel_budget.py bounds it for the default fast path.

    counts = static_forward_kernels(decoder, inputs, block_size=32)    # {"AR": {...}, "Block-32": {...}}
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The default fast path's kernels per layer (AR step, Block-B step) and per 2B forward (28 layers), bounded on CPU
# by test/core/decoding/test_kernel_budget.py and printed beside the counts by verify-device.
LAYER_BUDGET = {"AR": 9, "Block": 10}
FORWARD_TARGET = 450
LAYERS_2B = 28

# operators that launch no kernel besides views (aliases of their input): allocations and autograd bookkeeping
_FREE = {"aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided", "aten::_unsafe_view",
         "aten::detach", "aten::alias", "aten::lift_fresh", "aten::empty_like"}


class KernelCount(TorchDispatchMode):
    """The kernel-launching operators dispatched while active, by name (``aten::mm``, ``wam_diff2::swiglu``)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if not func.is_view and name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count_kernels(fn: Callable[[], object]) -> KernelCount:
    with torch.no_grad(), KernelCount() as counted:
        fn()
    return counted


def static_forward_kernels(decoder, inputs, block_size: int = 32) -> dict[str, dict]:
    """Kernels of one static-decoder forward after the prompt ``inputs``, for the AR step (1 query) and a
    Block-``block_size`` denoise step: the whole forward, and per layer (the forward over the first two layers
    minus the forward over the first one) and outside the layers (embedding, final norm, LM head, the step's
    shared attention masks), eagerly (a CUDA graph replays the same kernels)."""
    from ..decoding.step import forward_step

    with torch.no_grad():
        state = decoder.begin(inputs, block_size, answer_slots=2 * block_size)
    text, cache, attention = decoder.text, state.run.cache, decoder.attention
    counts = {}
    for label, segments in (("AR", [(0, 1)]), (f"Block-{block_size}", [(0, block_size)])):
        buf = decoder.plan_step(state, segments)
        buf.tokens.fill_(decoder.config.mask_token_id)
        total = count_kernels(lambda: forward_step(text, cache, attention, buf))
        row = {"total": total.total, "ops": dict(total.ops)}
        if text.num_layers >= 2:
            one = count_kernels(lambda: forward_step(text.with_layers(1), cache, attention, buf)).total
            two = count_kernels(lambda: forward_step(text.with_layers(2), cache, attention, buf)).total
            row.update(per_layer=two - one, outside=2 * one - two)
        counts[label] = row
    return counts
