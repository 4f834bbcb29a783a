"""CUDA graphs for the static decoder's fixed-shape steps (decoding/step.py).

A step shape (batch-size bucket, queries, key span for SDPA; for a whole step also its transfer
rule) is captured the first time it runs,
after ``WARMUP_RUNS`` eager runs on a side stream (allocator and library handles settle, lazy
kernels compile); later runs replay it. The graph reads its inputs from the step's fixed buffers
(tokens, slots, cos/sin, mask; FlashInfer's index buffers are re-planned once per block) and writes
K/V into the one preallocated cache, so replaying is exactly the eager step. Anything that fails
to capture runs eagerly from then on, with the reason logged once and kept in ``failures``.
A whole step also updates the block in place (:class:`MutatingStep`): those tensors are restored after the
warm-up runs and the capture, so the first replay starts from the state the caller left. A sampling step
names its generators: they are registered with the graph (each replay draws from their current state and
advances it, as the eager step would) and, with the device's default generator, put back after the
warm-up runs and the capture, so the draws are those of the plain decoder.

    graphs = StepGraphs(torch.device("cuda"), enabled=True)
    logits = graphs.run(key, lambda: forward_step(text, cache, attention, buffers))
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

log = logging.getLogger(__name__)

WARMUP_RUNS = 2


def batch_bucket(n: int, max_batch: int) -> int | None:
    """Smallest power of two >= n (capped at ``max_batch``, itself always a bucket); None if n > max_batch."""
    if n > max_batch:
        return None
    bucket = 1
    while bucket < n:
        bucket *= 2
    return min(bucket, max_batch)


@dataclass
class MutatingStep:
    """A step that also updates ``mutable`` in place (a whole step: the block buffers) and, when it
    samples, draws from ``generators`` (fixed objects: a graph is bound to the generators it captured)."""

    fn: Callable[[], torch.Tensor]
    mutable: Sequence[torch.Tensor]
    generators: Sequence[torch.Generator] = ()

    def __call__(self) -> torch.Tensor:
        return self.fn()


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    output: torch.Tensor


class StepGraphs:
    """Capture-once, replay-many CUDA graphs keyed by step shape, with an eager fallback."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device = device
        self.graphs: dict[Hashable, _Captured] = {}
        self.failures: dict[str, str] = {}       # str(key) -> why that shape runs eagerly
        self.reason = ""                          # why graphs are off altogether ("" when on)
        self._pool = None
        if enabled and device.type != "cuda":
            self.reason = f"CUDA graphs need a CUDA device (the model is on {device.type})"
            log.warning("cuda_graphs: %s; decoding eagerly", self.reason)
        elif enabled and not torch.cuda.is_available():
            self.reason = "CUDA is not available"
            log.warning("cuda_graphs: %s; decoding eagerly", self.reason)
        self.enabled = enabled and not self.reason

    def run(self, key: Hashable, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Replay the graph of ``key`` (capturing it on first use); eager if capture is impossible.
        A :class:`MutatingStep` names the tensors it updates in place (restored after the capture)."""
        if not self.enabled or str(key) in self.failures:
            return step()
        captured = self.graphs.get(key)
        if captured is None:
            captured = self._capture(key, step, getattr(step, "mutable", ()), getattr(step, "generators", ()))
            if captured is None:
                return step()
        captured.graph.replay()
        return captured.output

    def _capture(self, key: Hashable, step: Callable[[], torch.Tensor], mutable: Sequence[torch.Tensor],
                 generators: Sequence[torch.Generator]) -> _Captured | None:
        # Warm-up runs and the capture repeat the step: each writes the K/V of its tokens into the
        # step's own cache slots, which the replay that follows rewrites; what else the step changes
        # in place (the block, the generators' states) is put back before that replay.
        rngs = [*generators, torch.cuda.default_generators[self.device.index or 0]]
        saved = [t.clone() for t in mutable]
        saved_rngs = [g.get_state() for g in rngs]
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    step()
            torch.cuda.current_stream(self.device).wait_stream(side)
            _restore_rngs(rngs, saved_rngs)
            graph = torch.cuda.CUDAGraph()
            for generator in generators:
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph, pool=self._pool):
                output = step()
            self._pool = graph.pool()
            _restore(mutable, saved)
            _restore_rngs(rngs, saved_rngs)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager, logged
            reason = f"{type(exc).__name__}: {exc}"
            self.failures[str(key)] = reason
            log.warning("CUDA graph capture failed for step %s (%s); this step shape runs eagerly", key, reason)
            try:
                torch.cuda.synchronize(self.device)
            except Exception as late:  # noqa: BLE001 - the failed capture's error can surface here too
                log.warning("CUDA graph capture for step %s: %s: %s after the failure; running eagerly",
                            key, type(late).__name__, late)
            _restore(mutable, saved)
            _restore_rngs(rngs, saved_rngs)
            return None
        captured = _Captured(graph, output)
        self.graphs[key] = captured
        log.info("captured CUDA graph for step %s (%d graphs)", key, len(self.graphs))
        return captured


def _restore(tensors: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    for tensor, value in zip(tensors, saved):
        tensor.copy_(value)


def _restore_rngs(generators: Sequence[torch.Generator], states: Sequence[torch.Tensor]) -> None:
    for generator, state in zip(generators, states):
        generator.set_state(state)
