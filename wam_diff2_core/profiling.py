"""Where a frame's time and memory go: per-stage times of one policy step and the memory peak.

Stages, in pipeline order (milliseconds of wall time; on CUDA / NPU each boundary synchronises
the device, so a stage holds its own kernels):

| stage | what |
|---|---|
| ``image`` | the camera message -> RGB array (the caller's, e.g. ``image_msg_to_rgb``) and RGB -> PIL |
| ``processor`` | chat template, image resize / normalise / patching, tokenisation (``encode_prompts``) |
| ``vision`` | the vision tower and merger (a forward hook on ``model.model.visual``) |
| ``prefill`` | the text model's prompt prefill into the KV cache (the decoder's prefill minus ``vision``) |
| ``denoise`` | denoising forwards and token selection |
| ``commit`` | forwards that write finished blocks into the KV cache |
| ``parse`` | detokenising and parsing the answers |

``other_ms`` is what the step spent outside them (prompt text, checks, Python between stages);
``total_ms`` the whole frame -> trajectory time. A parse retry's stages add to the first decode's.
Memory: the peak during the step (``memory_kind``): the process's peak resident set (``rss``,
reset per step through ``/proc/self/clear_refs``; ``rss_since_start`` where that file cannot be
written) on CPU, torch's peak allocated memory on CUDA / NPU (``cuda_allocated`` / ``npu_allocated``).

    peak = PeakMemory(device); peak.reset()
    stages = StageTimes(processor_ms=..., ...)
    decoded, texts = timed_decode(decoder, tokenizer, inputs, stages, settings)   # vision .. commit, detokenising
    stages.stage_sum_ms
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

STAGES = ("image", "processor", "vision", "prefill", "denoise", "commit", "parse")
STAGE_LABELS = {"image": "image conversion", "processor": "processor", "vision": "vision encoder",
                "prefill": "prefill (text)", "denoise": "denoise", "commit": "commit", "parse": "parse",
                "other": "other", "total": "frame -> trajectory"}
LATENCY_PERCENTILES = (50, 90, 99)


@dataclass
class StageTimes:
    """One frame's stage times (ms) and memory peak; see the module docstring."""

    image_ms: float = 0.0
    processor_ms: float = 0.0
    vision_ms: float = 0.0
    prefill_ms: float = 0.0
    denoise_ms: float = 0.0
    commit_ms: float = 0.0
    parse_ms: float = 0.0
    other_ms: float = 0.0
    total_ms: float = 0.0
    peak_memory_mb: float = 0.0
    memory_kind: str = ""

    @property
    def stage_sum_ms(self) -> float:
        return sum(getattr(self, f"{s}_ms") for s in STAGES)

    def add_decode(self, stats, vision_ms: float) -> None:
        """Add one ``decoder.generate`` call's phases (``stats``) and the vision time measured inside its prefill."""
        self.vision_ms += vision_ms
        self.prefill_ms += max(0.0, stats.prefill_ms - vision_ms)
        self.denoise_ms += stats.denoise_ms
        self.commit_ms += stats.commit_ms

    def finish(self, total_ms: float, memory: "PeakMemory") -> None:
        """Close the frame: its ``total_ms``, what no stage holds (``other_ms``) and the memory peak."""
        self.total_ms, self.other_ms = total_ms, max(0.0, total_ms - self.stage_sum_ms)
        self.peak_memory_mb = memory.peak_mb()

    def with_conversion(self, image_ms: float) -> "StageTimes":
        """This step's stages plus the caller's image conversion before it (frame -> trajectory)."""
        return dataclasses.replace(self, image_ms=self.image_ms + image_ms, total_ms=self.total_ms + image_ms)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageTimes":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _sync(device) -> None:
    import torch

    if device.type in ("cuda", "npu"):          # torch.cuda and torch.npu share this API
        getattr(torch, device.type).synchronize(device)


class VisionTimer:
    """Times the vision tower (``model.model.visual``) by forward hooks while installed; ``ms``
    accumulates. Without a vision tower (a text-only model) it times nothing."""

    def __init__(self, model, device):
        self.device = device
        self.visual = getattr(getattr(model, "model", None), "visual", None)
        self.ms = 0.0
        self._handles = []
        self._t0 = 0.0

    def __enter__(self) -> "VisionTimer":
        if self.visual is not None:
            def before(_module, _args):
                _sync(self.device)
                self._t0 = time.perf_counter()

            def after(_module, _args, _output):
                _sync(self.device)
                self.ms += (time.perf_counter() - self._t0) * 1e3

            self._handles = [self.visual.register_forward_pre_hook(before), self.visual.register_forward_hook(after)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class PeakMemory:
    """The memory peak of a stretch of work: ``reset()`` before, ``peak_mb()`` after."""

    CLEAR_REFS = Path("/proc/self/clear_refs")
    STATUS = Path("/proc/self/status")

    def __init__(self, device):
        self.device = device
        self.kind = f"{device.type}_allocated" if device.type in ("cuda", "npu") else "rss"

    def reset(self) -> None:
        import torch

        if self.device.type in ("cuda", "npu"):
            getattr(torch, self.device.type).reset_peak_memory_stats(self.device)
        elif self.kind == "rss":
            try:
                self.CLEAR_REFS.write_text("5")      # resets the kernel's peak RSS (VmHWM) to the current RSS
            except OSError:
                self.kind = "rss_since_start"

    def peak_mb(self) -> float:
        import torch

        if self.device.type in ("cuda", "npu"):
            return getattr(torch, self.device.type).max_memory_allocated(self.device) / 2**20
        try:
            for line in self.STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024          # kB
        except OSError:
            pass
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: kB


def timed_decode(decoder, tokenizer, inputs, stages: StageTimes, settings=None, *, generators=None,
                 greedy_rows: Sequence[int] = (), prompt_rows: Sequence[int] | None = None):
    """One ``decoder.generate`` call of a batch (``prompt_rows``: the shared-prefill rows) and its answers
    detokenised: (the decode output, the texts in row order); adds the vision, prefill, denoise, commit and
    detokenising (``parse_ms``) times to ``stages``. The policy, ``infer`` and ``bench --data`` decode through
    here, so their stage tables measure the same thing."""
    with VisionTimer(decoder.model, decoder.device) as vision:
        decoded = decoder.generate(inputs, settings, generators=generators, greedy_rows=greedy_rows,
                                   prompt_rows=prompt_rows)
    stages.add_decode(decoded.stats[0], vision.ms)
    t = time.perf_counter()
    texts = tokenizer.batch_decode(decoded.sequences, skip_special_tokens=False)
    stages.parse_ms += (time.perf_counter() - t) * 1e3
    return decoded, texts


def distribution(values: Iterable[float], percentiles: Sequence[int] = LATENCY_PERCENTILES) -> dict[str, Any]:
    """Count, mean, ``percentiles`` (numpy's linear interpolation) and max of the finite ``values`` (None without)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in percentiles}, "max": None}
    return {"count": int(len(v)), "mean": float(v.mean()),
            **{f"p{p}": float(np.percentile(v, p)) for p in percentiles}, "max": float(v.max())}


def stage_summary(stages: Sequence[dict[str, Any] | StageTimes]) -> dict[str, Any] | None:
    """Per stage (:data:`STAGES`, then ``other`` and ``total``): count, mean, p50, p95, max in ms over
    the frames (numpy's linear-interpolation percentiles); the largest memory peak (MB) and its
    kind. None without stage times."""
    rows = [s.as_dict() if isinstance(s, StageTimes) else s for s in stages if s]
    if not rows:
        return None
    table = {name: distribution((r.get(f"{name}_ms") for r in rows), (50, 95)) for name in (*STAGES, "other", "total")}
    kinds = sorted({r.get("memory_kind", "") for r in rows} - {""})
    peaks = [r["peak_memory_mb"] for r in rows if r.get("peak_memory_mb")]
    return {"frames": len(rows), "ms": table, "peak_memory_mb": max(peaks) if peaks else None,
            "memory_kind": ",".join(kinds)}


def stage_table(summary: dict[str, Any], indent: str = "  ", total_label: str = STAGE_LABELS["total"]) -> list[str]:
    """The console table of :func:`stage_summary`: p50 / p95 / mean ms and share of the p50 total, memory peak."""
    ms = summary["ms"]
    total = ms["total"]["p50"] or 0.0
    lines = [f"{indent}{'stage (ms)':<18}{'p50':>9}{'p95':>9}{'mean':>9}{'share':>8}"]
    for name in (*STAGES, "other", "total"):
        row = ms[name]
        if not row["count"]:
            continue
        share = f"{100 * row['p50'] / total:7.1f}%" if total and name != "total" else ""
        label = total_label if name == "total" else STAGE_LABELS.get(name, name)
        lines.append(f"{indent}{label:<18}{row['p50']:9.1f}{row['p95']:9.1f}{row['mean']:9.1f}{share:>8}")
    if summary.get("peak_memory_mb"):
        lines.append(f"{indent}peak memory: {summary['peak_memory_mb']:.0f} MB ({summary['memory_kind']}) over "
                     f"{summary['frames']} frames")
    return lines


def stage_markdown(summary: dict[str, Any]) -> list[str]:
    """The same table in Markdown."""
    ms = summary["ms"]
    lines = ["| stage | p50 ms | p95 ms | mean ms | max ms |", "|---|---:|---:|---:|---:|"]
    for name in (*STAGES, "other", "total"):
        row = ms[name]
        if row["count"]:
            lines.append(f"| {STAGE_LABELS.get(name, name)} | {row['p50']:.1f} | {row['p95']:.1f} | "
                         f"{row['mean']:.1f} | {row['max']:.1f} |")
    if summary.get("peak_memory_mb"):
        lines += ["", f"Peak memory: {summary['peak_memory_mb']:.0f} MB ({summary['memory_kind']}; "
                      "the largest per-frame peak)."]
    return lines
