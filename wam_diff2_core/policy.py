"""The driving policy: RGB frame + ego state + command -> waypoints and/or boxes + statistics. The ROS planner
node and the offline bag evaluator both call :meth:`DrivingPolicy.step`, so offline numbers are the node's.

    policy = DrivingPolicy.from_checkpoint("ckpt/", tasks=("plan",))
    out = policy.step(frame_rgb, EgoMotion(velocity=(4.66, -0.09), acceleration=(0.17, -1.53)), "right")
    out.plan.waypoints      # [8, 2] metres, ego frame (x forward, y left), or None when invalid

An answer that does not parse is decoded once more with ``parse_retry`` (a remasking strategy, default left to
right: a block's parallel fill can leave malformed numbers, ``10.0,,4.80``, that a sequential fill does not);
both decodes' cost is in ``stats`` (``stats.retries`` = 1), the answer is the retry's. The fast path proves
itself at configure (:meth:`check_fast_path`; docs/decoding.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .candidate_selection import CandidateSettings, OnlineScene, Selection, online_scene
from .config import (DEFAULT_PARSE_RETRY, FAST_PATH_MIN_AGREEMENT, PARSE_RETRIES, ConfigError, EngineSettings,
                     apply_cpu_threads)
from .decoding import make_decoder, resolve_engine
from .decoding.common import DecodeStats
from .decoding.sampling import seeded_generators
from .geometry import EgoMotion
from .model.checkpoint import LoadedModel, load_checkpoint
from .model.prompt_encoding import encode_prompts
from .outputs.parsing import DEFAULT_MAX_WAYPOINT_ABS_M, Box, parse_boxes, parse_waypoints, token_char_confidences
from .outputs.prompts import (COMMANDS, DEFAULT_DETECTION_CLASSES, DEFAULT_DETECTION_EVERY_N_FRAMES,
                              DETECTION_TEMPLATE, NUM_WAYPOINTS, TASKS, chat_content, check_detection_every,
                              format_detection_prompt, format_planning_prompt)
from .profiling import PeakMemory, StageTimes, timed_decode

# The start-up decodes (check_fast_path, warmup) stop after this many blocks: the prefill, a block's denoise
# steps and commit, and a block after a commit are every step shape a decode runs (with CUDA graphs the
# decoder's own warm-up captures every key-span bucket), so a checkpoint that never stops early (a random
# one) does not make start-up three full answers long.
STARTUP_BLOCKS = 2


@dataclass
class TaskResult:
    """One decoded answer; ``valid`` False means: do not use (reason in ``invalid_reason``)."""

    valid: bool
    invalid_reason: str
    raw_text: str
    stats: DecodeStats
    waypoints: np.ndarray | None = None            # plan: [8, 2] metres
    boxes: list[Box] = field(default_factory=list)  # detect: source-image pixels


@dataclass
class PolicyOutput:
    command: str
    plan: TaskResult | None
    detections: TaskResult | None
    latency_ms: float                               # whole step: encode + decode + parse
    stages: StageTimes | None = None                # where latency_ms went, and the memory peak
    candidates: int = 1                             # plan candidates decoded (rows of the plan)
    selection: Selection | None = None              # the choice among them (None: one candidate, or none valid)
    plan_candidates: tuple[TaskResult, ...] = ()    # every candidate decoded (candidates > 1), in row order

    @property
    def valid_candidates(self) -> int:
        """Candidates that parsed (with one candidate: 1 when the plan is valid)."""
        if self.selection is not None:
            return self.selection.valid
        return int(self.plan is not None and self.plan.valid)


class DrivingPolicy:
    """Builds the prompts, decodes planning and detection together as one batch, parses."""

    def __init__(self, loaded: LoadedModel, *, tasks: Sequence[str] = ("plan",),
                 detection_classes: Sequence[str] = DEFAULT_DETECTION_CLASSES,
                 detection_template: str = DETECTION_TEMPLATE,
                 min_pixels: int | None = None, max_pixels: int | None = None,
                 max_waypoint_abs_m: float = DEFAULT_MAX_WAYPOINT_ABS_M, parse_retry: str = DEFAULT_PARSE_RETRY,
                 engine: EngineSettings | None = None, candidates: CandidateSettings | None = None,
                 detection_every_n_frames: int = DEFAULT_DETECTION_EVERY_N_FRAMES):
        unknown = [t for t in tasks if t not in TASKS]
        if not tasks or unknown:
            raise ValueError(f"tasks: {list(tasks)!r} must be a non-empty subset of {TASKS}")
        check_detection_every(detection_every_n_frames, tasks)
        if parse_retry not in PARSE_RETRIES:
            raise ValueError(f"parse_retry: {parse_retry!r} is not one of {', '.join(PARSE_RETRIES)}")
        self.loaded = loaded
        self.tasks = tuple(tasks)
        self.detection_every_n_frames = detection_every_n_frames
        self.frames = 0                              # frames stepped (the detection schedule counts them)
        self.detection_prompt = format_detection_prompt(detection_classes, detection_template)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.max_waypoint_abs_m = max_waypoint_abs_m
        self.parse_retry = parse_retry
        self.candidates = candidates or CandidateSettings()
        if self.candidates.count > 1 and "plan" not in self.tasks:
            raise ValueError(f"candidates: {self.candidates.count} plan candidates need the plan task, tasks are "
                             f"{list(self.tasks)}")
        engine = engine or EngineSettings()
        if engine.quantization not in ("none", loaded.quantization):
            raise ConfigError(f"quantization: the engine asks for {engine.quantization} and the model was loaded "
                              f"as {loaded.quantization}; load it with load_checkpoint(..., quantization="
                              f"{engine.quantization!r}) or DrivingPolicy.from_checkpoint")
        self.engine = resolve_engine(engine.replace(quantization=loaded.quantization), loaded.model)
        if next(loaded.model.parameters()).device.type == "cpu":
            apply_cpu_threads(self.engine.cpu_threads)
        self.decoder = make_decoder(loaded.model, loaded.config, engine=self.engine)

    @classmethod
    def from_checkpoint(cls, path, *, device: str = "auto", dtype: str = "auto",
                        overrides: Mapping[str, Any] | None = None, **kwargs) -> "DrivingPolicy":
        engine = kwargs.get("engine") or EngineSettings()     # quantization is applied at load, once
        return cls(load_checkpoint(path, device=device, dtype=dtype, overrides=overrides,
                                   quantization=engine.quantization), **kwargs)

    @property
    def settings(self):
        return self.loaded.config.settings

    def update_settings(self, **overrides: Any) -> None:
        """Change decoding settings (validated) for the following steps; ids stay the checkpoint's."""
        self.loaded.config = self.decoder.config = self.loaded.config.with_settings(**overrides)

    def _conversation(self, text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": chat_content(text, max_images=1)}]

    def step(self, frame_rgb: np.ndarray, ego: EgoMotion, command: str,
             generator: torch.Generator | None = None, scene: OnlineScene | None = None) -> PolicyOutput:
        """Plan (and/or detect) for one frame. ``frame_rgb``: [H, W, 3] uint8 RGB. With ``candidates.count``
        N > 1 the plan is decoded N times in the same batch (row 1 with the decoding settings, rows 2..N
        sampled at the candidate temperature / top-p) and the candidate ``scene`` scores best is the plan
        (:mod:`~wam_diff2_core.candidate_selection`; None: the ego's speed alone, no route, no objects).
        With both tasks and ``detection_every_n_frames`` N > 1, the boxes come on steps 1, N+1, 2N+1, ...
        (``detections`` is None on the others)."""
        from PIL import Image

        t0 = time.perf_counter()
        memory = PeakMemory(self.loaded.device)
        memory.reset()
        if frame_rgb.ndim != 3 or frame_rgb.shape[2] != 3 or frame_rgb.dtype != np.uint8 or 0 in frame_rgb.shape:
            raise ValueError(f"frame must be a non-empty [H, W, 3] uint8 RGB array, got {frame_rgb.shape} {frame_rgb.dtype}")
        if command not in COMMANDS:
            raise ValueError(f"command: {command!r} is not one of {', '.join(COMMANDS)}")
        ego.check()
        stages = StageTimes(memory_kind=memory.kind)
        t_image = time.perf_counter()
        image = Image.fromarray(frame_rgb)
        stages.image_ms = (time.perf_counter() - t_image) * 1e3
        prompts = {}
        if "plan" in self.tasks:
            prompts["plan"] = format_planning_prompt(command, ego.velocity, ego.acceleration)
        if "detect" in self.tasks and self.frames % self.detection_every_n_frames == 0:
            prompts["detect"] = self.detection_prompt
        self.frames += 1
        count = self.candidates.count if "plan" in prompts else 1
        results, plans = self._decode(prompts, image, self.settings, generator, stages, count)
        selection = None
        if count > 1:
            scene = scene or online_scene((0.0, 0.0), 0.0, ego.velocity[0], ego.acceleration[0],
                                          lane_width_m=self.candidates.lane_width_m)
            # scoring the candidates is in stages.other_ms (no stage of its own in StageTimes)
            selection = scene.select([p.waypoints if p.valid else None for p in plans],
                                     self.candidates.progress_reference)
            if selection is not None:
                results["plan"] = plans[selection.index]
        retry = self._retry_settings()
        failed = {task: prompts[task] for task, result in results.items() if not result.valid}
        if failed and retry is not None:
            for task, again in self._decode(failed, image, retry, generator, stages)[0].items():
                again.stats = results[task].stats.then_retried(again.stats)
                results[task] = again
        latency_ms = (time.perf_counter() - t0) * 1e3
        stages.finish(latency_ms, memory)
        return PolicyOutput(command=command, plan=results.get("plan"), detections=results.get("detect"),
                            latency_ms=latency_ms, stages=stages, candidates=count, selection=selection,
                            plan_candidates=tuple(plans) if count > 1 else ())

    def _inputs(self, prompts: Sequence[str], image):
        return encode_prompts(self.loaded.processor, [self._conversation(p) for p in prompts],
                              [[image] for _ in prompts], min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def _decode(self, prompts: Mapping[str, str], image, settings, generator, stages: StageTimes,
                candidates: int = 1) -> tuple[dict[str, TaskResult], list[TaskResult]]:
        """One batched decode of ``{task: prompt}`` on one image (each prompt prefilled once), each answer parsed,
        its stage times added to ``stages``; the plan takes ``candidates`` rows (:func:`candidate_rows`).
        Returns ({task: the first row's answer}, every plan row's answer)."""
        tasks = list(prompts)
        rows = [task for task in tasks for _ in range(candidates if task == "plan" else 1)]
        t = time.perf_counter()
        inputs = self._inputs([prompts[task] for task in tasks], image)
        stages.processor_ms += (time.perf_counter() - t) * 1e3
        gens = [generator] * len(rows) if generator is not None else None
        greedy_rows: tuple[int, ...] = ()
        if candidates > 1:
            settings, gens, greedy_rows = candidate_rows(rows, settings, self.candidates, self.loaded.device)
        decoded, texts = timed_decode(self.decoder, self.loaded.tokenizer, inputs, stages, settings,
                                      generators=gens, greedy_rows=greedy_rows,
                                      prompt_rows=[tasks.index(task) for task in rows])
        t = time.perf_counter()
        results: dict[str, TaskResult] = {}
        plans: list[TaskResult] = []
        for row, (task, text, stats) in enumerate(zip(rows, texts, decoded.stats)):
            if task == "plan":
                parsed = parse_waypoints(text, NUM_WAYPOINTS, self.max_waypoint_abs_m)
                answer = {"waypoints": parsed.waypoints if parsed.ok else None}
            else:
                confidence = token_char_confidences(self.loaded.tokenizer, decoded.sequences[row],
                                                    decoded.confidences_of(row), text)
                parsed = parse_boxes(text, image.size, char_confidence=confidence)
                answer = {"boxes": list(parsed.boxes)}
            result = TaskResult(valid=parsed.ok, invalid_reason="" if parsed.ok else str(parsed.error),
                                raw_text=text, stats=stats, **answer)
            results.setdefault(task, result)
            if task == "plan":
                plans.append(result)
        stages.parse_ms += (time.perf_counter() - t) * 1e3
        return results, plans

    def _retry_settings(self):
        """Settings of the one re-decode of an answer that did not parse, or None when it would be the
        same decode again (no retry, block size 1, or the same strategy without sampling)."""
        s = self.settings
        if self.parse_retry == "none" or s.block_size == 1 or (
                self.parse_retry == s.remasking_strategy and s.temperature == 0.0):
            return None
        return s.replace(remasking_strategy=self.parse_retry)

    def _warmup_prompts(self):
        """The warm-up image (grey, 64 x 64) and its prompts, {task: prompt} for this policy's tasks."""
        from PIL import Image
        prompts = {"plan": format_planning_prompt("straight", (0.0, 0.0), (0.0, 0.0)), "detect": self.detection_prompt}
        return Image.fromarray(np.full((64, 64, 3), 128, np.uint8)), {task: prompts[task] for task in self.tasks}

    def startup_settings(self):
        """The decoding settings of the start-up decodes: this policy's, at most STARTUP_BLOCKS blocks long."""
        s = self.settings
        return s.replace(max_new_tokens=min(s.max_new_tokens, STARTUP_BLOCKS * s.block_size))

    def warmup(self) -> None:
        """One decode (startup_settings) on a grey frame so the first real frame pays no one-off costs; with CUDA
        graphs or a compiled forward also every step shape of this policy's batch, captured / compiled now."""
        image, prompts = self._warmup_prompts()
        self._decode(prompts, image, self.startup_settings(), None, StageTimes(), self.candidates.count)
        if self.engine.cuda_graphs or self.engine.compile_forward:
            rows = len(self.tasks) + self.candidates.count - 1
            settings = self.settings if self.candidates.count == 1 else candidate_rows(
                ["plan"] * rows, self.settings, self.candidates, self.loaded.device)[0]
            self.decoder.warmup([rows], settings=settings)

    def check_fast_path(self) -> str | None:
        """Decode the warm-up prompts (startup_settings) with this policy's decoder and the plain one; where their
        tokens agree at fewer positions than FAST_PATH_MIN_AGREEMENT[dtype], or the fast path fails, switch to the
        plain decoder and return a diagnostic saying why; None when they agree (or the decoder is plain)."""
        if self.engine.implementation == "plain":
            return None
        image, prompts = self._warmup_prompts()
        inputs = self._inputs(list(prompts.values()), image)
        fast_name = describe_engine(self.engine)
        plain_engine = self.engine.replace(implementation="plain", cuda_graphs=False, compile_forward=False,
                                           attention_backend="sdpa")
        plain_decoder = make_decoder(self.loaded.model, self.loaded.config, engine=plain_engine)
        settings = self.startup_settings()
        try:
            fast = self.decoder.generate(inputs, settings).sequences
        except Exception as exc:  # noqa: BLE001 - a fast path that cannot run on this device is not used
            self.engine, self.decoder = plain_engine, plain_decoder
            return (f"fast path ({fast_name}) failed on the warm-up prompt ({type(exc).__name__}: {exc}); "
                    "decoding with the plain decoder")
        plain = plain_decoder.generate(inputs, settings).sequences
        same, total, first = token_agreement(fast, plain)
        dtype = str(self.loaded.dtype).replace("torch.", "")
        needed = FAST_PATH_MIN_AGREEMENT.get(dtype, 1.0)
        share = same / total if total else 1.0
        if share >= needed:
            return None
        self.engine, self.decoder = plain_engine, plain_decoder
        row, position, a, b = first
        return (f"fast path ({fast_name}) diverges from the plain decoder on the warm-up prompt: {same}/{total} "
                f"tokens agree ({share:.1%}, {dtype} needs {needed:.0%}); first difference in answer {row} at "
                f"token {position} (fast {a}, plain {b}); decoding with the plain decoder")


def candidate_rows(rows: Sequence[str], settings, candidates: CandidateSettings, device):
    """(settings, generators, greedy rows) of a decode whose ``rows`` (a task per row) hold plan candidates: the
    first plan row and other tasks' rows greedy when ``settings`` are; the other rows sample at the candidate
    temperature / top-p, each from a generator seeded ``candidates.seed + row``. The policy's rows, and the bench's."""
    first_plan = rows.index("plan")
    greedy = tuple(i for i, task in enumerate(rows) if task != "plan" or i == first_plan) \
        if settings.temperature == 0.0 else ()
    sampled = settings.replace(temperature=candidates.temperature, top_p=candidates.top_p)
    return sampled, seeded_generators([candidates.seed + i for i in range(len(rows))], device), greedy


def token_agreement(fast: Sequence[Sequence[int]], plain: Sequence[Sequence[int]]):
    """(positions that agree, positions compared, first difference (answer, position, fast id, plain id)).
    Each answer pair is compared over the longer one; a missing token counts as a difference."""
    pairs = [(row, i, a[i] if i < len(a) else None, b[i] if i < len(b) else None)
             for row, (a, b) in enumerate(zip(fast, plain)) for i in range(max(len(a), len(b)))]
    differ = [p for p in pairs if p[2] != p[3]]
    return len(pairs) - len(differ), len(pairs), differ[0] if differ else None


def describe_engine(engine: EngineSettings) -> str:
    """``static (sdpa, CUDA graphs)``: the decoder a (resolved) engine runs."""
    if engine.implementation != "static":
        return engine.implementation
    extras = (", compiled" if engine.compile_forward else "") + (", CUDA graphs" if engine.cuda_graphs else "")
    return f"static ({engine.attention_backend}{extras})"
