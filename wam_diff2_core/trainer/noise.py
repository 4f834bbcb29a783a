"""The diffusion objective's inputs, exactly as training/README.md, The objective: per sample
``prefix (P) || clean response (L) || noisy response (L)`` with the response EOS-padded to a multiple
of B, its noise, labels, MRoPE positions and block-causal mask (B = 1: ``prefix || response``, causal
next-token training). Noise comes from a generator seeded by (seed, stream position, round), so it
does not depend on the batch a sample lands in, the number of processes, or a resume.

    batch = build_batch(examples, block_size=8, mask_token_id=mask, eos_token_id=eos,
                        rope_index=model.model.get_rope_index, seed=42)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .training_data import Example, concat_vision, pad_prefixes, padded_length

PREFIX, CLEAN, NOISY, PAD = 0, 1, 2, 3   # segments of a training row


def noise_generator(seed: int, position: int, round: int = 0) -> torch.Generator:
    """A generator for one visit of one sample (independent of batching and processes)."""
    state = np.random.SeedSequence([seed, max(position, 0), round]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def stratified_mask_ratios(num_blocks: int, generator: torch.Generator, min_ratio: float = 0.001) -> torch.Tensor:
    """One mask ratio per block: t_i = (u_i + i) / N, u_i ~ U(0,1) clamped, then permuted. [N]"""
    u = torch.rand(num_blocks, generator=generator).clamp(min_ratio, 1.0)
    t = (u + torch.arange(num_blocks)) / num_blocks
    return t[torch.randperm(num_blocks, generator=generator)]


def noise_response(response: torch.Tensor, block_size: int, mask_token_id: int, generator: torch.Generator,
                   min_ratio: float = 0.001) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask a padded response. Returns (noisy [L], masked [L] bool, ratio per token [L])."""
    length = response.shape[0]
    assert length % block_size == 0, "the response must be padded to a multiple of the block size"
    ratios = stratified_mask_ratios(length // block_size, generator, min_ratio).repeat_interleave(block_size)
    masked = torch.rand(length, generator=generator) <= ratios
    noisy = torch.where(masked, torch.full_like(response, mask_token_id), response)
    return noisy, masked, ratios


@dataclass
class Layout:
    """Where each sample's parts sit in its (right-padded) training row."""

    prefix_lengths: torch.Tensor     # [N] P
    response_lengths: torch.Tensor   # [N] L (padded; R for B = 1)
    seq_len: int                     # T, the padded row length
    with_noisy_copy: bool            # False for B = 1 (prefix || response)

    def segments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(segment, offset) per position, [N, T] each; offset = position inside the segment."""
        pos = torch.arange(self.seq_len).unsqueeze(0)                     # [1, T]
        p = self.prefix_lengths.unsqueeze(1)                               # [N, 1]
        ell = self.response_lengths.unsqueeze(1)
        noisy_end = p + 2 * ell if self.with_noisy_copy else p + ell
        pad = torch.full_like(pos + p, PAD)
        segment = torch.where(pos < p, PREFIX,
                              torch.where(pos < p + ell, CLEAN, torch.where(pos < noisy_end, NOISY, pad)))
        start = torch.where(segment == PREFIX, 0, torch.where(segment == CLEAN, p, p + ell))
        offset = (pos - start).clamp(min=0)
        return segment, offset


def training_attention_mask(layout: Layout, block_size: int) -> torch.Tensor:
    """The block-causal training mask, boolean [N, 1, T, T] (True = may attend).

    With a global block id g (prefix: pos // B; response offset j: ceil(P / B) + j // B):
    a prefix or clean query sees prefix and clean keys with g_k <= g_q; a noisy query sees
    prefix and clean keys with g_k < g_q and noisy keys with g_k == g_q. Padding rows see
    only themselves.
    """
    segment, offset = layout.segments()                                   # [N, T]
    first_response_block = -(-layout.prefix_lengths // block_size)        # ceil(P / B), [N]
    g = torch.where(segment == PREFIX, offset // block_size,
                    first_response_block.unsqueeze(1) + offset // block_size)
    clean_stream = (segment == PREFIX) | (segment == CLEAN)
    noisy = segment == NOISY
    gq, gk = g.unsqueeze(2), g.unsqueeze(1)                               # [N, T, 1], [N, 1, T]
    mask = clean_stream.unsqueeze(1) & ((gk <= gq) & clean_stream.unsqueeze(2)
                                        | (gk < gq) & noisy.unsqueeze(2))
    mask |= noisy.unsqueeze(1) & noisy.unsqueeze(2) & (gk == gq)
    mask |= torch.eye(layout.seq_len, dtype=torch.bool).unsqueeze(0) & (segment == PAD).unsqueeze(2)
    return mask.unsqueeze(1)


@dataclass
class TrainingBatch:
    """One micro-batch, ready for a forward. Targets are flat indices into [N x T]."""

    input_ids: torch.Tensor             # [N, T]
    attention_mask: torch.Tensor        # [N, 1, T, T] bool, the student's block size
    position_ids: torch.Tensor          # [3, N, T]
    mm_token_type_ids: torch.Tensor     # [N, T]
    vision: dict[str, torch.Tensor]     # pixel_values, image_grid_thw (absent without images)
    layout: Layout
    block_size: int
    target_index: torch.Tensor          # [M] hidden state (flat index) whose logits predict the target
    target_ids: torch.Tensor            # [M] the clean token
    ce_weight: torch.Tensor             # [M] 1 / (t L)  (B = 1: 1 / R)
    kd_weight: torch.Tensor             # [M] 1 / L      (distillation: no 1 / t)
    target_sample: torch.Tensor         # [M] which sample
    ar_predecessor_index: torch.Tensor  # [M] clean-stream position before the target (an AR teacher's view)
    mask_ratio: torch.Tensor            # [M] t at the target (1 for B = 1)
    placeholder_target: bool = False    # True: nothing was masked; one zero-weight target stands in

    @property
    def num_targets(self) -> int:
        return 0 if self.placeholder_target else int(self.target_ids.numel())

    @property
    def num_tokens(self) -> int:
        copies = 2 if self.layout.with_noisy_copy else 1
        return int((self.layout.prefix_lengths + copies * self.layout.response_lengths).sum())

    def mask_for(self, block_size: int) -> torch.Tensor:
        """The same sequences under another block size's mask (a distillation teacher)."""
        if block_size == self.block_size:
            return self.attention_mask
        if not self.layout.with_noisy_copy:
            raise ValueError("an AR batch has no noisy copy for a diffusion teacher")
        return training_attention_mask(self.layout, block_size)

    def to(self, device: torch.device) -> "TrainingBatch":
        """Every tensor field and the vision inputs on ``device`` (the layout stays on the CPU)."""
        for name, value in list(vars(self).items()):
            if torch.is_tensor(value):
                setattr(self, name, value.to(device))
        self.vision = {k: v.to(device) for k, v in self.vision.items()}
        return self

    def model_inputs(self, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids,
                "attention_mask": self.attention_mask if attention_mask is None else attention_mask,
                "position_ids": self.position_ids, "mm_token_type_ids": self.mm_token_type_ids, **self.vision}


RopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def prefix_positions(examples: Sequence[Example], rope_index: RopeIndex) -> list[torch.Tensor]:
    """MRoPE ids of each prefix, [3, P_i] each, from Qwen3-VL's ``get_rope_index``."""
    ids, valid, mm = pad_prefixes(examples, 0, left=False)
    vision = concat_vision(examples)
    try:        # where the model that ``rope_index`` is a method of lives (the CPU for a plain function)
        device = next(rope_index.__self__.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    with torch.no_grad():
        pos, _ = rope_index(ids.to(device), mm_token_type_ids=mm.to(device),
                            image_grid_thw=vision["image_grid_thw"].to(device) if vision else None,
                            attention_mask=valid.to(device))
    pos = pos.cpu()
    return [pos[:, i, :e.prefix_length] for i, e in enumerate(examples)]


def build_batch(examples: Sequence[Example], *, block_size: int, mask_token_id: int | None, eos_token_id: int,
                rope_index: RopeIndex, seed: int, min_ratio: float = 0.001, pad_multiple: int | None = None,
                noise_round: int = 0) -> TrainingBatch:
    """Lay out, noise and label a micro-batch (B = 1: causal next-token training).

    ``pad_multiple`` (default B) pads responses further, e.g. to lcm(B_student, B_teacher)."""
    if not examples:
        raise ValueError("build_batch needs at least one example")
    ar = block_size == 1
    if not ar and mask_token_id is None:
        raise ValueError("block_size > 1 needs a mask token")
    multiple = 1 if ar else (pad_multiple or block_size)
    if multiple % block_size:
        raise ValueError(f"pad_multiple {multiple} is not a multiple of block_size {block_size}")
    prefix_pos = prefix_positions(examples, rope_index)
    n = len(examples)
    p_len = torch.tensor([e.prefix_length for e in examples])
    r_len = torch.tensor([e.response_ids.shape[0] for e in examples])
    l_len = torch.tensor([padded_length(int(r), multiple) for r in r_len])
    copies = 1 if ar else 2
    seq_len = int((p_len + copies * l_len).max())
    layout = Layout(prefix_lengths=p_len, response_lengths=l_len, seq_len=seq_len, with_noisy_copy=not ar)

    input_ids = torch.full((n, seq_len), eos_token_id, dtype=torch.long)
    mm = torch.zeros((n, seq_len), dtype=torch.long)
    position_ids = torch.zeros((3, n, seq_len), dtype=torch.long)
    targets = []    # per sample: (index, id, ce weight, kd weight, sample, AR predecessor index, mask ratio)
    for i, e in enumerate(examples):
        p, ell, row = int(p_len[i]), int(l_len[i]), i * seq_len
        clean = torch.full((ell,), eos_token_id, dtype=torch.long)   # EOS padding
        clean[:e.response_ids.shape[0]] = e.response_ids
        input_ids[i, :p] = e.prefix_ids
        input_ids[i, p:p + ell] = clean
        mm[i, :p] = e.mm_token_type_ids
        position_ids[:, i, :p] = prefix_pos[i]
        response_pos = int(prefix_pos[i].max()) + 1 + torch.arange(ell)
        position_ids[:, i, p:p + ell] = response_pos
        if ar:      # the hidden state at p - 1 + j predicts response token j
            j, first, ratio, ce_w = torch.arange(ell), p - 1, torch.ones(ell), torch.full((ell,), 1.0 / ell)
        else:
            noisy, masked, ratios = noise_response(clean, block_size, mask_token_id,
                                                   noise_generator(seed, e.position, noise_round), min_ratio)
            input_ids[i, p + ell:p + 2 * ell] = noisy
            position_ids[:, i, p + ell:p + 2 * ell] = response_pos       # the clean copy's ids
            j = masked.nonzero().squeeze(1)
            first, ratio = p + ell, ratios[j]
            ce_w = 1.0 / (ratio * ell)
        # the AR predecessor of response token j is clean token j - 1 (or the last prompt token)
        targets.append((row + first + j, clean[j], ce_w, torch.full((j.numel(),), 1.0 / ell),
                        torch.full((j.numel(),), i, dtype=torch.long), row + p - 1 + j, ratio))
    placeholder = sum(t[1].numel() for t in targets) == 0
    if placeholder:
        # Nothing was masked: one zero-weight target keeps the LM head in the backward, which
        # DDP needs from every process.
        p, ell = int(p_len[0]), int(l_len[0])
        targets = [(torch.tensor([p + ell if not ar else p - 1]), input_ids[0, p:p + 1], torch.zeros(1),
                    torch.zeros(1), torch.zeros(1, dtype=torch.long), torch.tensor([p - 1]), torch.ones(1))]
    index, ids, ce_w, kd_w, sample, predecessor, ratio = (torch.cat(column) for column in zip(*targets))
    return TrainingBatch(
        input_ids=input_ids, attention_mask=training_attention_mask(layout, block_size), position_ids=position_ids,
        mm_token_type_ids=mm, vision=concat_vision(examples), layout=layout, block_size=block_size,
        target_index=index.long(), target_ids=ids.long(), ce_weight=ce_w.float(), kd_weight=kd_w.float(),
        target_sample=sample, ar_predecessor_index=predecessor.long(), mask_ratio=ratio.float(),
        placeholder_target=placeholder)
