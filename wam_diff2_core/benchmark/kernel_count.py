"""Kernels per forward, counted on any device: the operators one forward dispatches (a ``TorchDispatchMode``),
views and allocations left out.

Each counted operator launches one kernel on CUDA: a matmul one cuBLAS call, SDPA one attention kernel, each of
layer_ops.py's fused ops, counted as its operator (``ops=layer_ops.ops``), the one Triton kernel it launches. So
a count on CPU is the count a GPU with the Triton ops launches, up to a layout copy one device makes and another
does not; at ~4.5 us a kernel in a CUDA graph on the H200, it is a floor on a forward's time that the memory floor
does not show. By default a count is of what the decoder really calls (with the torch layer ops, each of their
aten ops). ``verify-device`` and ``bench`` print it per variant; test/core/decoding/test_kernel_budget.py bounds
the default fast path.

    counts = static_forward_kernels(decoder, inputs, block_size=32)    # {"AR": {...}, "Block-32": {...}, ...}
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .timing import forward_steps, step_shapes
from .variants import random_prompt

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


def static_forward_kernels(decoder, inputs, block_size: int = 32, ops=None) -> dict[str, dict]:
    """Kernels of one static-decoder forward after the prompt ``inputs``, per step shape (timing.step_shapes:
    AR, Block-``block_size``, the fused commit + step): the whole forward, and per layer (the forward over the
    first two layers minus the forward over the first one) and outside the layers (embedding, final norm, LM
    head, the step's shared attention masks), eagerly (a CUDA graph replays the same kernels). ``ops``: the layer
    ops to count through, by default those the decoder calls (with the torch implementation, each of their aten
    ops); ``layer_ops.ops`` counts each fused op as the one kernel the Triton implementation launches."""
    from ..decoding.step import forward_step

    with torch.no_grad():
        state = decoder.begin(inputs, block_size, answer_slots=2 * block_size)
    text, cache, attention = decoder.text, state.run.cache, decoder.attention
    ops = ops or text.ops
    counts = {}
    for label, _, segments in step_shapes(block_size):
        buf = decoder.plan_step(state, segments)
        buf.tokens.fill_(decoder.config.mask_token_id)
        total = count_kernels(lambda: forward_step(text.with_layers(text.num_layers, ops), cache, attention, buf))
        row = {"total": total.total, "ops": dict(total.ops), "layer_kernels": decoder.layer_kernels.name}
        if text.num_layers >= 2:
            one = count_kernels(lambda: forward_step(text.with_layers(1, ops), cache, attention, buf)).total
            two = count_kernels(lambda: forward_step(text.with_layers(2, ops), cache, attention, buf)).total
            row.update(per_layer=two - one, outside=2 * one - two)
        counts[label] = row
    return counts


def add_kernel_counts(rows: list[dict], variants: dict, config, bench, device) -> None:
    """Each forward row of timing.time_forwards gets ``kernels``: what one forward of its variant and step launches
    ("-" for a compiled forward, whose kernels Inductor generates, and where a variant cannot be counted), and
    ``layer_kernels``: the static decoder's layer ops (triton or torch)."""
    counted: dict[tuple, object] = {}
    for row in rows:
        name, length = row["variant"], row["prompt"]
        key = (name, length)
        if key not in counted:
            decoder = variants[name]
            if "-compiled" in name or "flashinfer" in name:     # Inductor's kernels; FlashInfer's calls bypass dispatch
                counted[key] = {}
            elif name == "plain":       # the timed forwards themselves: transformers over a DynamicCache
                counted[key] = {step["step"]: count_kernels(fn).total
                                for step, fn in forward_steps(name, decoder, config, bench, device, length)}
            else:
                inputs = random_prompt(config.vocab_size, bench.batch, length, bench.seed, device)
                counted[key] = {label: c["total"] for label, c in
                                static_forward_kernels(decoder, inputs, bench.block_size).items()}
        row["kernels"] = counted[key].get(row["step"], "-")
        row["layer_kernels"] = getattr(getattr(variants[name], "layer_kernels", None), "name", "-")
