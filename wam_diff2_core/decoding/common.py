"""What both decoders share: the prompt's inputs to the model, the result of a decode, its statistics,
phase timing.

    out = decoder.generate(inputs)          # DecodeOutput
    out.sequences[0], out.stats[0].forwards
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


@dataclass
class PromptInputs:
    """A (left-padded) processor batch on the model's device, as both prefills give it to the model."""

    input_ids: torch.Tensor             # [N, T]
    attention_mask: torch.Tensor        # [N, T], 0 at padding
    mm_types: torch.Tensor              # [N, T] multimodal token types (zeros: text only)
    vision: dict[str, torch.Tensor]     # those of VISION_KEYS the batch has; pixels in the model's dtype
    positions: torch.Tensor             # [3, N, T] MRoPE ids (the model's get_rope_index)
    next_position: torch.Tensor         # [N] MRoPE position of response offset 0 (= P + rope_delta)

    @property
    def valid(self) -> torch.Tensor:
        return self.attention_mask.bool()


def prompt_inputs(model, inputs: Mapping[str, torch.Tensor], device: torch.device) -> PromptInputs:
    """The prefill's inputs of a Qwen3-VL ``model`` for a processor batch ``inputs``."""
    input_ids = inputs["input_ids"].to(device)
    attention_mask = inputs["attention_mask"].to(device)
    mm_types = inputs.get("mm_token_type_ids")
    mm_types = (torch.zeros_like(input_ids) if mm_types is None else mm_types).to(device)
    vision = {k: inputs[k].to(device) for k in VISION_KEYS if inputs.get(k) is not None}
    if "pixel_values" in vision:
        vision["pixel_values"] = vision["pixel_values"].to(model.dtype)
    positions, _ = model.model.get_rope_index(
        input_ids, mm_token_type_ids=mm_types, image_grid_thw=vision.get("image_grid_thw"),
        video_grid_thw=vision.get("video_grid_thw"), attention_mask=attention_mask)
    next_position = positions.masked_fill(~attention_mask.bool().unsqueeze(0), -1).amax(dim=(0, 2)) + 1
    return PromptInputs(input_ids, attention_mask, mm_types, vision, positions, next_position)


def check_rows(prompts: int, prompt_rows: Sequence[int] | None, generators: Sequence | None,
               greedy_rows: Sequence[int]) -> tuple[list[int] | None, int, tuple[int, ...]]:
    """A decode call's rows for a batch of ``prompts`` prompts: (``prompt_rows``, the row count n, ``greedy_rows``
    sorted and distinct); ValueError naming the argument that is wrong. Row i decodes prompt ``prompt_rows[i]``
    (several rows may share one, prefilled once); None when every row is its own prompt (None given, or
    ``0 .. prompts - 1``). ``generators``: None or one per row; ``greedy_rows``: row indices."""
    if prompt_rows is not None:
        rows = [int(r) for r in prompt_rows]
        if not rows or any(r < 0 or r >= prompts for r in rows):
            raise ValueError(f"prompt_rows: {list(prompt_rows)} must be a non-empty list of prompt indices of the "
                             f"batch of {prompts}")
        prompt_rows = None if rows == list(range(prompts)) else rows
    n = prompts if prompt_rows is None else len(prompt_rows)
    if generators is not None and len(generators) != n:
        raise ValueError(f"generators: expected {n}, got {len(generators)}")
    greedy = tuple(sorted(set(int(r) for r in greedy_rows)))
    if any(r < 0 or r >= n for r in greedy):
        raise ValueError(f"greedy_rows: {list(greedy_rows)} must be row indices of the batch of {n}")
    return prompt_rows, n, greedy


@dataclass
class DecodeStats:
    """Cost of decoding one sequence, counted as if it had been decoded alone."""

    block_size: int
    forwards: int = 0           # forwards after the prefill: denoise steps + commits
    denoise_steps: int = 0
    commit_forwards: int = 0
    blocks: int = 0
    tokens: int = 0             # answer tokens, EOS excluded
    steps_per_block: list[int] = field(default_factory=list)
    prefill_ms: float = 0.0     # wall time of the batch call's phases
    denoise_ms: float = 0.0
    commit_ms: float = 0.0
    retries: int = 0            # decodes repeated because the answer did not parse (the policy's parse_retry)

    def then_retried(self, retry: "DecodeStats") -> "DecodeStats":
        """This decode's cost plus a retry's (every count summed, the retry counted); the answer (``tokens``) and
        ``block_size`` are the retry's."""
        summed = {f.name: getattr(self, f.name) + getattr(retry, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("block_size", "tokens")}
        return dataclasses.replace(retry, **summed | {"retries": summed["retries"] + 1})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class DecodeOutput:
    sequences: list[list[int]]  # answer token ids per sequence, truncated before the first EOS
    finished: list[bool]        # True: EOS reached; False: stopped at max_new_tokens
    stats: list[DecodeStats]
    # per answer token, the probability the decoder chose it with when it was fixed (the step that fixed it;
    # the last step's for a position still masked after S steps); empty: not kept (a stand-in decoder)
    confidences: list[list[float]] = field(default_factory=list)

    def confidences_of(self, row: int) -> list[float]:
        """Sequence ``row``'s token confidences; empty where the decoder kept none."""
        return self.confidences[row] if self.confidences else []


def record_block(rows_tokens: list[list[int]], rows_conf: list[list[float]], steps: Sequence[int],
                 live: Sequence[int], eos_id: int, stats: list[DecodeStats], answer: list[list[int]],
                 confidences: list[list[float]], done: list[bool]) -> None:
    """Book a finished block for the rows still decoding: its steps, and its tokens (and their
    confidences) up to the first EOS (a row with an EOS is done)."""
    for i in live:
        stats[i].blocks += 1
        stats[i].steps_per_block.append(steps[i])
        stats[i].denoise_steps += steps[i]
        tokens = rows_tokens[i]
        end = tokens.index(eos_id) if eos_id in tokens else len(tokens)
        answer[i].extend(tokens[:end])
        confidences[i].extend(rows_conf[i][:end])
        done[i] = end < len(tokens)


def finish_blocks(answer: list[list[int]], confidences: list[list[float]], stats: list[DecodeStats],
                  done: list[bool], max_new_tokens: int) -> DecodeOutput:
    """The output of a block decode: each answer (and its confidences) cut to ``max_new_tokens`` (the last
    block may overrun it), its token and forward counts filled in."""
    for i, stat in enumerate(stats):
        answer[i] = answer[i][:max_new_tokens]
        confidences[i] = confidences[i][:max_new_tokens]
        stat.tokens = len(answer[i])
        stat.forwards = stat.denoise_steps + stat.commit_forwards
    return DecodeOutput(sequences=answer, finished=done, stats=stats, confidences=confidences)


class PhaseTimer:
    """Wall time (ms) of a decode call's phases, the device synchronised at each boundary:
    ``with timer("denoise"): ...`` adds to ``totals["denoise"]``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals = {"prefill": 0.0, "denoise": 0.0, "commit": 0.0}

    def sync(self) -> None:
        if self.device.type in ("cuda", "npu"):          # torch.cuda and torch.npu share this API
            getattr(torch, self.device.type).synchronize(self.device)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.totals[phase] += (time.perf_counter() - t0) * 1e3

    def stamp(self, stats: Sequence[DecodeStats]) -> None:
        """Every sequence's stats take the call's phase times."""
        for s in stats:
            s.prefill_ms, s.denoise_ms, s.commit_ms = (self.totals[k] for k in ("prefill", "denoise", "commit"))
