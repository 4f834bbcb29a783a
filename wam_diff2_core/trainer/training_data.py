"""Training data: samples in the authors' format -> tokenised examples (prefix and response, and what is
skipped or fails: training/README.md, Data) -> a deterministic stream.

Order: samples form an endless stream, epoch after epoch, each epoch a seeded permutation.
Optimizer step ``s`` consumes stream positions ``[s G, (s + 1) G)`` (G = global batch), split
over processes and micro-batches, so the data position of a run is its step number and the
split does not change which samples a step sees.

    dataset = SampleDataset("train.jsonl", processor, data_root="data/", eos_token_id=eos)
    order = DataOrder(len(dataset), seed=42)
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ..config import ConfigError
from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS, Sample, SampleError, iter_samples, load_images
from ..images import DEFAULT_LIMITS, ImageLimits
from ..model.prompt_encoding import pixel_size

log = logging.getLogger(__name__)

ASSISTANT_HEADER = "<|im_start|>assistant\n"


@dataclass
class Example:
    """One tokenised sample (one process's view; tensors on the CPU)."""

    id: str
    prefix_ids: torch.Tensor            # [P] long: the prompt through "<|im_start|>assistant\n"
    response_ids: torch.Tensor          # [R] long: the answer through the first EOS inclusive
    mm_token_type_ids: torch.Tensor     # [P] long: 1 at image-pad tokens
    pixel_values: torch.Tensor | None   # [patches, patch_dim]
    image_grid_thw: torch.Tensor | None  # [images, 3]
    position: int = -1                  # stream position (seeds this visit's noise)

    @property
    def prefix_length(self) -> int:
        return int(self.prefix_ids.shape[0])


def padded_length(response_length: int, multiple: int) -> int:
    """Response length after EOS padding to a multiple of the block size."""
    return -(-response_length // multiple) * multiple


def _find_last(haystack: list[int], needle: list[int]) -> int:
    for start in range(len(haystack) - len(needle), -1, -1):
        if haystack[start:start + len(needle)] == needle:
            return start
    return -1


def encode_sample(processor, sample: Sample, images: Sequence[Any], *, eos_token_id: int,
                  min_pixels: int | None = None, max_pixels: int | None = None) -> Example:
    """Tokenise a sample with the chat template and split it into prefix and response."""
    if not any(m["role"] == "assistant" for m in sample.messages):
        raise sample.error("no 'gpt' turn to learn from")
    text = processor.apply_chat_template(sample.messages, tokenize=False, add_generation_prompt=False)
    size = pixel_size(min_pixels, max_pixels)
    kwargs = {"size": size} if size is not None and images else {}
    try:
        enc = processor(text=[text], images=list(images) or None, return_tensors="pt", **kwargs)
    except (ValueError, RuntimeError) as exc:
        raise sample.error(f"cannot encode ({exc})") from exc
    ids = enc["input_ids"][0]
    header = processor.tokenizer(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    start = _find_last(ids.tolist(), list(header))
    if start < 0:
        raise sample.error(f"the tokenised text has no {ASSISTANT_HEADER!r} header")
    start += len(header)
    eos = (ids[start:] == eos_token_id).nonzero()
    if eos.numel() == 0:
        raise sample.error("the answer has no EOS after it")
    end = start + int(eos[0, 0]) + 1
    mm = enc.get("mm_token_type_ids")
    mm = torch.zeros_like(ids) if mm is None else mm[0].long()
    return Example(id=sample.id, prefix_ids=ids[:start].clone(), response_ids=ids[start:end].clone(),
                   mm_token_type_ids=mm[:start].clone(), pixel_values=enc.get("pixel_values"),
                   image_grid_thw=enc.get("image_grid_thw"))


class SampleDataset(torch.utils.data.Dataset):
    """Samples of one data file, plus ``mix`` files (each ``(file, times)``, its image paths relative to its own
    directory, its samples ``times`` times), those that ``keep`` accepts (None: all); ``dataset[i]`` is an
    :class:`Example` or the SampleError that says why sample i cannot be used (``on_error="fail"``: raised)."""

    def __init__(self, path: str | Path, processor, *, eos_token_id: int, data_root: str | Path = ".",
                 mix: Sequence[tuple[Path, int]] = (), min_pixels: int | None = None,
                 max_pixels: int | None = None, max_length: int = 0, block_size: int = 1,
                 pad_multiple: int | None = None, on_error: str = "skip",
                 image_limits: ImageLimits = DEFAULT_LIMITS,
                 allow_absolute_paths: bool = ALLOW_ABSOLUTE_IMAGE_PATHS,
                 keep: Callable[[Sample], bool] | None = None):
        self.processor = processor
        self.keep = keep
        self.image_limits = image_limits
        self.eos_token_id = eos_token_id
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.max_length = max_length
        self.block_size = block_size
        self.pad_multiple = pad_multiple or block_size
        self.on_error = on_error
        self.rejected: list[SampleError] = []
        self.allow_absolute_paths = allow_absolute_paths
        self.samples: list[Sample] = self._read("data.train_file", path, data_root)
        for i, (file, times) in enumerate(mix):
            self.samples += self._read(f"data.mix[{i}]", file, file.parent) * times

    def _read(self, setting: str, path: str | Path, data_root: str | Path) -> list[Sample]:
        samples, rejected, left_out = [], [], 0
        try:
            items = list(iter_samples(path, data_root, allow_absolute_paths=self.allow_absolute_paths))
        except ValueError as exc:      # the file as a whole (unreadable, a JSON list that does not parse)
            raise ConfigError(f"{setting}: {exc}") from None
        for item in items:
            if isinstance(item, Sample) and (missing := [p for p in item.image_paths if not p.is_file()]):
                item = item.error(f"image not found: {missing[0]}")
            if isinstance(item, SampleError):
                if self.on_error == "fail":
                    raise item
                log.warning("skipping %s", item)
                rejected.append(item)
            elif self.keep is None or self.keep(item):
                samples.append(item)
            else:
                left_out += 1
        self.rejected += rejected
        if not samples:
            raise ConfigError(f"{setting}: {path} has no usable sample ({len(rejected)} rejected"
                              + (f", {left_out} not of the kind this recipe trains on)" if left_out else ")"))
        if rejected:
            log.warning("%s: %d sample(s) skipped, first: %s", path, len(rejected), rejected[0])
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Example | SampleError:
        sample = self.samples[index]
        try:
            images = load_images(sample, self.image_limits)
            example = encode_sample(self.processor, sample, images, eos_token_id=self.eos_token_id,
                                    min_pixels=self.min_pixels, max_pixels=self.max_pixels)
            if self.max_length:     # the training row: P + R for B = 1, else P + 2 L (clean and noisy copies)
                r = len(example.response_ids)
                length = example.prefix_length + (r if self.block_size == 1
                                                  else 2 * padded_length(r, self.pad_multiple))
                if length > self.max_length:
                    raise sample.error(f"{length} tokens is more than data.max_length {self.max_length}")
        except SampleError as exc:
            if self.on_error == "fail":
                raise
            return exc
        return example


class DataOrder:
    """Stream position -> dataset index: epoch e is a permutation seeded by (seed, e)."""

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        self.size, self.seed, self.shuffle = size, seed, shuffle

    @lru_cache(maxsize=4)  # noqa: B019 - one sampler per run: the cache goes with it
    def permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def index(self, position: int) -> int:
        return self.permutation(position // self.size)[position % self.size]

    def epoch(self, position: int) -> float:
        return position / self.size


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch is split: G = accum x processes x micro."""

    global_batch_size: int
    micro_batch_size: int
    num_processes: int
    process_index: int

    def __post_init__(self):
        per_step = self.micro_batch_size * self.num_processes
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"train.global_batch_size: {self.global_batch_size} is not a multiple of train.micro_batch_size "
                f"x processes ({self.micro_batch_size} x {self.num_processes})")

    @property
    def accumulation_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.num_processes)

    def positions(self, step: int, micro: int) -> list[int]:
        """Stream positions of this process's micro-batch ``micro`` of optimizer step ``step``."""
        start = step * self.global_batch_size + (micro * self.num_processes + self.process_index) * self.micro_batch_size
        return list(range(start, start + self.micro_batch_size))


class StreamDataset(torch.utils.data.Dataset):
    """Indexed by stream position; tags each example with its position."""

    def __init__(self, dataset: SampleDataset, order: DataOrder):
        self.dataset, self.order = dataset, order

    def __len__(self) -> int:  # unbounded; DataLoader only needs it for its own bookkeeping
        return 2 ** 62

    def __getitem__(self, position: int):
        item = self.dataset[self.order.index(position)]
        if isinstance(item, Example):
            item.position = position
        return item


class StepBatches(torch.utils.data.Sampler):
    """Yields this process's micro-batches (lists of stream positions) from ``start_step`` on."""

    def __init__(self, plan: BatchPlan, start_step: int, total_steps: int):
        self.plan, self.start_step, self.total_steps = plan, start_step, total_steps

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.total_steps):
            for micro in range(self.plan.accumulation_steps):
                yield self.plan.positions(step, micro)

    def __len__(self) -> int:
        return (self.total_steps - self.start_step) * self.plan.accumulation_steps


def make_loader(dataset: SampleDataset, order: DataOrder, plan: BatchPlan, start_step: int, total_steps: int,
                num_workers: int = 0) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(StreamDataset(dataset, order),
                                       batch_sampler=StepBatches(plan, start_step, total_steps),
                                       collate_fn=list, num_workers=num_workers,    # batching: noise.py
                                       persistent_workers=False)


def total_steps(num_samples: int, epochs: float, global_batch_size: int, max_steps: int = 0) -> int:
    return max_steps or max(1, math.ceil(epochs * num_samples / global_batch_size))


def pad_prefixes(examples: Sequence[Example], pad_id: int, *, left: bool) -> tuple[torch.Tensor, ...]:
    """The prefixes padded to the longest: (ids, 1 at a token, mm_token_type_ids), [N, longest P] each."""
    width = max(e.prefix_length for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask, mm = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, e in enumerate(examples):
        cols = slice(width - e.prefix_length, width) if left else slice(0, e.prefix_length)
        ids[i, cols], mask[i, cols], mm[i, cols] = e.prefix_ids, 1, e.mm_token_type_ids
    return ids, mask, mm


def prompt_batch(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The examples' prefixes as a left-padded processor batch (what the decoder takes)."""
    ids, mask, mm = pad_prefixes(examples, pad_token_id, left=True)
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": mm, **concat_vision(examples)}


def concat_vision(examples: Sequence[Example]) -> dict[str, torch.Tensor]:
    pixels = [e.pixel_values for e in examples if e.pixel_values is not None]
    grids = [e.image_grid_thw for e in examples if e.image_grid_thw is not None]
    if not pixels:
        return {}
    return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}
