"""CUDA graphs for the static decoder's fixed-shape steps (decoding/step.py), and their emulation on any device.

A step shape (batch-size bucket, queries, key span for SDPA; for a whole step also its transfer rule and
token choice) is captured the first time it runs: ``WARMUP_RUNS`` runs on the capture's own side stream,
then the capture on that same stream; later runs replay it. The graph reads its inputs from fixed
buffers (the step's tokens, slots, cos/sin and mask; the prefix's slots, validity and positions; the
block; FlashInfer's index buffers) and writes K/V into the one preallocated cache, so replaying is
exactly the eager step **as long as every tensor the step reads lives at a fixed address across calls**.

Capture rules are checked before capturing, on the warm-up runs (:func:`no_host_sync`; the rules:
:class:`HostSyncCheck`): a step that breaks one is refused with the reason, before a capture could fail
half-way (on torch 2.11.0 a failed ``capture_end`` leaves the caching allocator believing a capture is under
way, so every later capture of the process fails too).
A refused or failed key runs its ``fallback`` from then on (a whole step: a graphed forward and an eager
token choice), the reason logged once and kept in ``failures``; the caller's stream is restored whatever
happens.

A whole step also updates the block in place (:class:`MutatingStep`): those tensors are restored after the
warm-up runs and the capture, so the first replay starts from the state the caller left. A sampling step
names its generators: they are registered with the graph (each replay draws from their current state and
advances it, as the eager step would) and, with the device's default generator, put back after the
warm-up runs and the capture, so the draws are those of the plain decoder.

A compiled forward (``compiles=True``: engine.compile_forward) generates its code on the first run of a
shape (Dynamo, Inductor and, on CUDA, autotuning, which synchronises with the host): that run is made once
before the warm-up runs, outside the capture rules, its in-place effects put back like theirs; the warm-up
runs and the capture then run the compiled code (off CUDA, :class:`HostSyncCheck` runs compiled functions
eagerly, so there the rules see the forward's eager ops; the emulated replays run the compiled code).

Emulation (``emulate=True``, any device; what CI runs): "capture" is the same warm-up runs under the
host-sync check, then one more run whose closure and output are kept; a "replay" reruns *that first
closure* (the tensors it captured, not the caller's new ones) and copies its result into the kept output,
as a graph replays the kernels it recorded on the addresses it recorded. A step that reads a tensor
allocated per call gives wrong results under emulation exactly where it would on a GPU.

    graphs = StepGraphs(torch.device("cuda"), enabled=True)
    logits = graphs.run_step(KeyedForward(key, lambda: forward_step(text, cache, attention, buffers)))
    flags = graphs.run_step(forward, whole_step, pick, buffers, block, rule, whole=(rule, "greedy"),
                            mutable=block.tensors())
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

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


@dataclass(frozen=True)
class KeyedForward:
    """A step's forward and the key of its graph (what the graph depends on); ``key`` None: it runs
    eagerly (graphs are off, or the call is outside the graph buckets)."""

    key: tuple | None
    fn: Callable[[], torch.Tensor]

    def __call__(self) -> torch.Tensor:
        return self.fn()


class CaptureError(RuntimeError):
    """A step breaks a capture rule (found by :class:`HostSyncCheck`)."""


_aten = torch.ops.aten
# Ops that read the device from the host or whose output shape depends on the data: a sync on CUDA.
_SYNCING = {
    _aten._local_scalar_dense: "reads a device value on the host (.item(), .tolist(), bool(), int())",
    _aten.nonzero: "has a data-dependent output shape (nonzero)",
    _aten.masked_select: "has a data-dependent output shape (masked_select)",
    _aten.unique_consecutive: "has a data-dependent output shape (unique_consecutive)",
    _aten._unique2: "has a data-dependent output shape (unique)",
    _aten.unique_dim: "has a data-dependent output shape (unique)",
    _aten.multinomial: "checks its probabilities on the host (multinomial; use sampling.draw_one)",
    _aten.equal: "reads a comparison on the host (equal)",
    _aten.is_nonzero: "reads a device value on the host (is_nonzero)",
}
_INDEX_PUT = {_aten.index_put_, _aten.index_put, _aten._index_put_impl_}


class HostSyncCheck:
    """The CUDA capture rules, checked on any device: code under ``with HostSyncCheck():`` raises
    :class:`CaptureError` naming the call when, on CUDA, it would synchronise with the host or copy a host
    value to the device:

    - host reads of a tensor (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``.numpy()``, ``.cpu()``)
      and the ops of ``_SYNCING`` (data-dependent shapes, multinomial's host-side check);
    - indexing with a boolean mask (a ``nonzero`` inside);
    - a tensor made from host data inside the step (``torch.tensor([...])``: ``lift_fresh`` of a tensor
      of one dimension or more, a host-to-device copy), and a host scalar stored by advanced indexing
      (``t[..., idx] = -inf`` is ``index_put_`` with a host value: a blocking copy; use ``index_fill`` or
      ``masked_fill``, which take the scalar as a kernel argument).

    Not seen here: copies of tensors made on the host before the step (on CPU every tensor is a host
    tensor); the GPU run's ``set_sync_debug_mode("error")`` covers those. Compiled functions run their
    eager code under the check (``torch.compiler.set_stance("force_eager")``: Dynamo does not run under a
    Python dispatch mode, and a fullgraph function would raise instead), so the check sees their ops."""

    def __enter__(self) -> "HostSyncCheck":
        self._modes = (torch.compiler.set_stance("force_eager"), _HostReads(), _DeviceRules())
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


_HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}


class _HostReads(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            raise CaptureError(f"Tensor.{func.__name__} reads a device value on the host")
        return func(*args, **(kwargs or {}))


class _DeviceRules(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _SYNCING:
            raise CaptureError(f"{func} {_SYNCING[packet]}")
        if packet in (_aten.index, *_INDEX_PUT):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise CaptureError(f"{func} indexes with a boolean mask (a nonzero inside: a host sync); "
                                   "use masked_fill / torch.where")
        if packet in _INDEX_PUT:
            values = args[2] if len(args) > 2 else kwargs["values"]
            if values.dim() == 0:
                raise CaptureError(f"{func} stores a host scalar through advanced indexing (a blocking "
                                   "host-to-device copy on CUDA); use index_fill or masked_fill")
        if packet is _aten.lift_fresh and args[0].dim() > 0:
            raise CaptureError(f"{func} makes a tensor from host data inside the step (a host-to-device "
                               "copy on CUDA); make it once, outside the step")
        return func(*args, **kwargs)


@contextmanager
def no_host_sync(device: torch.device) -> Iterator[None]:
    """Code under this must not synchronise with the host: CUDA's own check (errors on a sync) on a
    CUDA device, :class:`HostSyncCheck` elsewhere."""
    if device.type != "cuda":
        with HostSyncCheck():
            yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class _Graph:
    def __init__(self, graph: "torch.cuda.CUDAGraph", output: torch.Tensor):
        self.graph, self.output = graph, output

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class _Emulated:
    """A captured closure: replays rerun it and write into the output of the capture, as a graph does."""

    def __init__(self, step: Callable[[], torch.Tensor], output: torch.Tensor):
        self.step, self.output = step, output

    def replay(self) -> torch.Tensor:
        return self.output.copy_(self.step())


class StepGraphs:
    """Capture-once, replay-many CUDA graphs keyed by step shape, with a fallback per key (module doc)."""

    def __init__(self, device: torch.device, enabled: bool, emulate: bool = False, compiles: bool = False):
        self.device = device
        self.emulate = emulate
        self.compiles = compiles                  # steps compile on their first run (module doc)
        self.graphs: dict[Hashable, _Graph | _Emulated] = {}
        self.failures: dict[str, str] = {}       # str(key) -> why that shape runs its fallback
        self.replays = 0                          # graph replays, all keys
        self.forwards = 0                         # forwards run by run_step, graphed or eager
        self.reason = ""                          # why graphs are off altogether ("" when on)
        self._pool = None
        self._stream = None                       # the side stream of every warm-up and capture
        if enabled and not emulate and device.type != "cuda":
            self.reason = f"CUDA graphs need a CUDA device (the model is on {device.type})"
        elif enabled and not emulate and not torch.cuda.is_available():
            self.reason = "CUDA is not available"
        if self.reason:
            log.warning("cuda_graphs: %s; decoding eagerly", self.reason)
        self.enabled = enabled and not self.reason

    def run(self, key: Hashable, step: Callable[[], torch.Tensor],
            fallback: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """Replay the graph of ``key`` (capturing it on first use); ``fallback`` (default: the step itself,
        eagerly) when graphs are off or this key cannot be captured. A :class:`MutatingStep` names the
        tensors it updates in place and the generators it draws from."""
        fallback = fallback or step
        if not self.enabled or str(key) in self.failures:
            return fallback()
        captured = self.graphs.get(key)
        if captured is None:
            captured = self._capture(key, step)
            if captured is None:
                return fallback()
        self.replays += 1
        return captured.replay()

    def run_step(self, forward: KeyedForward, step: Callable[..., torch.Tensor] | None = None, *args: Any,
                 whole: tuple | None = None, mutable: Sequence[torch.Tensor] = (),
                 generators: Sequence[torch.Generator] = ()) -> torch.Tensor:
        """One step, graphed or eager: ``step(forward, *args)``, or ``forward()`` when no step is given.

        A forward without a key runs eagerly, and so does its step. Otherwise ``whole`` (a key suffix)
        makes the step and its forward one graph, keyed ``(*forward.key, *whole)``, that updates ``mutable``
        in place and draws from ``generators`` (:class:`MutatingStep`); its fallback is the step run
        eagerly around the graphed forward, which is also what runs without ``whole``."""
        self.forwards += 1
        if forward.key is None:
            return forward() if step is None else step(forward, *args)
        graphed = partial(self.run, forward.key, forward)
        if step is None:
            return graphed()
        if whole is None:
            return step(graphed, *args)
        return self.run((*forward.key, *whole), MutatingStep(partial(step, forward, *args), mutable, generators),
                        fallback=partial(step, graphed, *args))

    def _capture(self, key: Hashable, step: Callable[[], torch.Tensor]) -> _Graph | _Emulated | None:
        # Warm-up runs and the capture repeat the step from the caller's state: each writes the K/V of
        # its tokens into the step's own cache slots, which the replay that follows rewrites; what else
        # the step changes in place (the block, the AR counter, the generators' states) is put back after
        # each of them (an AR step run three times from one state never writes past its own slot).
        mutable, generators = getattr(step, "mutable", ()), tuple(getattr(step, "generators", ()))
        default = (torch.cuda.default_generators[self.device.index or 0] if self.device.type == "cuda"
                   else torch.default_generator)
        rngs = [*generators, default]
        saved = [t.clone() for t in mutable]
        saved_rngs = [g.get_state() for g in rngs]

        def warm_up():
            if self.compiles:                     # code generation, outside the capture rules
                step()
                _restore(mutable, saved)
                _restore_rngs(rngs, saved_rngs)
            with no_host_sync(self.device):
                for _ in range(WARMUP_RUNS):
                    step()
                    _restore(mutable, saved)
            _restore_rngs(rngs, saved_rngs)

        try:
            captured = self._emulate(step, warm_up) if self.emulate else self._record(step, generators, warm_up)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back, logged and kept
            reason = f"{type(exc).__name__}: {exc}"
            self.failures[str(key)] = reason
            log.warning("CUDA graph capture failed for step %s (%s); this step shape runs its fallback", key, reason)
            captured = None
        finally:
            _restore(mutable, saved)
            _restore_rngs(rngs, saved_rngs)
        if captured is not None:
            self.graphs[key] = captured
            log.debug("captured %sCUDA graph for step %s (%d graphs)", "an emulated " if self.emulate else "",
                     key, len(self.graphs))
        return captured

    def _emulate(self, step: Callable[[], torch.Tensor], warm_up: Callable[[], None]) -> _Emulated:
        warm_up()
        with no_host_sync(self.device):
            return _Emulated(step, step())

    def _record(self, step: Callable[[], torch.Tensor], generators: Sequence[torch.Generator],
                warm_up: Callable[[], None]) -> _Graph:
        """Warm-up runs and capture on one side stream; the caller's stream is current again afterwards,
        also when the capture fails (``torch.cuda.graph`` does not leave its stream on an error)."""
        previous = torch.cuda.current_stream(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        side = self._stream
        side.wait_stream(previous)
        try:
            with torch.cuda.stream(side):
                warm_up()
                graph = torch.cuda.CUDAGraph()
                for generator in generators:
                    graph.register_generator_state(generator)
                with torch.cuda.graph(graph, pool=self._pool, stream=side):
                    output = step()
        except Exception:
            try:
                torch.cuda.synchronize(self.device)
            except Exception as late:  # noqa: BLE001 - the failed capture's error can surface here too
                log.warning("CUDA graph capture: %s: %s after the failure", type(late).__name__, late)
            raise
        finally:
            torch.cuda.set_stream(previous)
        previous.wait_stream(side)
        self._pool = graph.pool()
        return _Graph(graph, output)


def _restore(tensors: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    for tensor, value in zip(tensors, saved):
        tensor.copy_(value)


def _restore_rngs(generators: Sequence[torch.Generator], states: Sequence[torch.Tensor]) -> None:
    for generator, state in zip(generators, states):
        generator.set_state(state)
