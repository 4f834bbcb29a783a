"""Block-diffusion decoding with a KV cache, and the autoregressive baseline (B = 1).

Reads top to bottom like the algorithm (docs/decoding.md, The algorithm):

1. prefill   - one forward over the prompt (and pixels) under the block-causal mask; keep K/V;
2. denoise   - a block starts as B MASK tokens; each step forwards the block against the
               cached prefix (read, not written), picks a token + confidence per position
               and fixes some masked positions (strategy); at most S steps;
3. commit    - the finished block's clean tokens are forwarded once more to write their K/V;
               skipped after the last block;
4. stop      - once every sequence has committed a block containing EOS.

Outputs are truncated at the first EOS; MASK and special tokens are never emitted. Batches are
left-padded and each sequence decodes to exactly the tokens it gets alone. Rows that continue one prompt
(``prompt_rows``: candidate plans of a frame) share its prefill: the prompt and its image run once and the
cache is then copied to every row.

    decoder = BlockDiffusionDecoder(loaded.model, loaded.config)
    out = decoder.generate(processor_inputs)          # out.sequences, out.stats
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from ..config import DecodingSettings, DiffusionConfig
from .common import DecodeOutput, DecodeStats, PhaseTimer, check_rows, finish_blocks, prompt_inputs, record_block
from .masks import block_query_mask, prompt_block_mask, response_positions
from .sampling import choose_transfer, device_settings, sample_tokens, transfer_schedule

@dataclass
class Prefix:
    """What the prefill leaves for decoding."""

    cache: Any                  # transformers DynamicCache holding the prompt K/V
    valid: torch.Tensor         # [N, L] keys in the cache that may be attended (False at padding)
    next_position: torch.Tensor  # [N] MRoPE position of response offset 0 (= P + rope_delta)
    last_logits: torch.Tensor   # [N, V] logits at the last prompt token (used by AR)


class BlockDiffusionDecoder:
    """Plain cached decoder over a transformers Qwen3-VL model (the reference path)."""

    def __init__(self, model, config: DiffusionConfig):
        self.model = model
        self.config = config
        self.device = next(model.parameters()).device
        self.banned = torch.tensor(config.banned_token_ids, dtype=torch.long, device=self.device)

    def prefill(self, inputs: Mapping[str, torch.Tensor], block_size: int,
                prompt_rows: Sequence[int] | None = None) -> Prefix:
        """One forward over the batch's prompts; with ``prompt_rows`` (common.check_rows) the prefix then has
        one row per entry, a copy of that prompt's K/V, mask, position and logits."""
        from transformers import DynamicCache

        prompt = prompt_inputs(self.model, inputs, self.device)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=prompt.input_ids, position_ids=prompt.positions,
                         attention_mask=prompt_block_mask(prompt.attention_mask, block_size),
                         past_key_values=cache, use_cache=True, mm_token_type_ids=prompt.mm_types,
                         logits_to_keep=1, **prompt.vision)
        prefix = Prefix(cache=cache, valid=prompt.valid, next_position=prompt.next_position,
                        last_logits=out.logits[:, -1])
        if prompt_rows is not None:
            index = torch.tensor(prompt_rows, dtype=torch.long, device=self.device)       # [N]
            cache.batch_select_indices(index)
            prefix.valid, prefix.next_position = prefix.valid[index], prefix.next_position[index]
            prefix.last_logits = prefix.last_logits[index]
        return prefix

    def forward_block(self, prefix: Prefix, tokens: torch.Tensor, offset: int, keep: bool) -> torch.Tensor:
        """Forward response tokens at response offset ``offset`` against the cached prefix.

        keep=False: a denoise step; the cache is read, and what the forward appended is cut
        off again (transformers 5 appends even when use_cache=False). Returns [N, len, V].
        """
        length = tokens.shape[1]
        out = self.model(input_ids=tokens, attention_mask=block_query_mask(prefix.valid, length),
                         position_ids=response_positions(prefix.next_position, offset, length),
                         past_key_values=prefix.cache, use_cache=True)
        if keep:
            prefix.valid = torch.cat([prefix.valid, prefix.valid.new_ones(tokens.shape[0], length)], dim=1)
        else:
            prefix.cache.crop(-length)
        return out.logits

    @torch.no_grad()
    def generate(self, inputs: Mapping[str, torch.Tensor], settings: DecodingSettings | None = None,
                 generators: Sequence[torch.Generator | None] | None = None,
                 greedy_rows: Sequence[int] = (), prompt_rows: Sequence[int] | None = None) -> DecodeOutput:
        """Decode a (left-padded) processor batch. ``generators``: one per sequence when sampling;
        ``greedy_rows``: sequences decoded at temperature 0 while the others sample (sampling.sample_tokens);
        ``prompt_rows``: sequence i continues prompt ``prompt_rows[i]`` of the batch, each prompt prefilled once
        (None: one sequence per prompt). Every sequence decodes to the tokens it gets alone."""
        settings = device_settings(settings or self.config.settings, self.device.type)
        prompts = inputs["input_ids"].shape[0]
        prompt_rows, n, greedy_rows = check_rows(prompts, prompt_rows, generators, greedy_rows)
        timer = PhaseTimer(self.device)
        with timer("prefill"):
            prefix = self.prefill(inputs, settings.block_size, prompt_rows)
        decode = self._generate_ar if settings.block_size == 1 else self._generate_blocks
        result = decode(prefix, settings, generators, timer, greedy_rows)
        timer.stamp(result.stats)
        return result

    def _generate_blocks(self, prefix: Prefix, settings: DecodingSettings,
                         generators, timer: PhaseTimer, greedy_rows: Sequence[int] = ()) -> DecodeOutput:
        n, size = prefix.valid.shape[0], settings.block_size
        mask_id, eos_id = self.config.mask_token_id, self.config.eos_token_id
        n_blocks = -(-settings.max_new_tokens // size)
        schedule = transfer_schedule(size, settings.denoising_steps)
        stats = [DecodeStats(block_size=size) for _ in range(n)]
        done = [False] * n
        answer: list[list[int]] = [[] for _ in range(n)]
        confidences: list[list[float]] = [[] for _ in range(n)]
        for k in range(n_blocks):
            live = [i for i in range(n) if not done[i]]
            block = torch.full((n, size), mask_id, dtype=torch.long, device=self.device)
            block[[i for i in range(n) if done[i]]] = eos_id      # finished rows: nothing to fill
            steps = [0] * n
            last_tokens = block
            block_conf = last_conf = torch.ones((n, size), device=self.device)
            with timer("denoise"):
                for step in range(settings.denoising_steps):
                    masked = block == mask_id                      # [N, B]
                    active = masked.any(dim=1).tolist()
                    if not any(active):
                        break
                    logits = self.forward_block(prefix, block, k * size, keep=False)          # [N, B, V]
                    rows = [i for i in range(n) if active[i]]
                    last_tokens, last_conf = sample_tokens(logits, settings, self.banned, generators, rows,
                                                           greedy_rows)
                    transfer = choose_transfer(masked, last_conf, settings, step, schedule)
                    block = torch.where(transfer, last_tokens, block)
                    block_conf = torch.where(transfer, last_conf, block_conf)
                    for i in rows:
                        steps[i] += 1
                # Positions still masked after S steps take the last step's tokens.
                still = block == mask_id
                block = torch.where(still, last_tokens, block)
                block_conf = torch.where(still, last_conf, block_conf)
            record_block(block.tolist(), block_conf.tolist(), steps, live, eos_id, stats, answer, confidences, done)
            if all(done) or k == n_blocks - 1:
                break
            with timer("commit"):
                self.forward_block(prefix, block, k * size, keep=True)
            for i in live:
                if not done[i]:
                    stats[i].commit_forwards += 1
        return finish_blocks(answer, confidences, stats, done, settings.max_new_tokens)

    def _generate_ar(self, prefix: Prefix, settings: DecodingSettings, generators, timer: PhaseTimer,
                     greedy_rows: Sequence[int] = ()) -> DecodeOutput:
        """B = 1: causal next-token decoding; each forward writes one token into the cache. Every token sampled
        is booked as a block of one step; a sequence's forwards are its tokens sampled but the last."""
        n, eos_id = prefix.valid.shape[0], self.config.eos_token_id
        stats = [DecodeStats(block_size=1) for _ in range(n)]
        done = [False] * n
        answer: list[list[int]] = [[] for _ in range(n)]
        confidences: list[list[float]] = [[] for _ in range(n)]
        logits = prefix.last_logits.unsqueeze(1)                   # [N, 1, V]
        for t in range(settings.max_new_tokens):
            rows = [i for i in range(n) if not done[i]]
            with timer("denoise"):
                tokens, conf = sample_tokens(logits, settings, self.banned, generators, rows, greedy_rows)  # [N, 1]
            record_block(tokens.tolist(), conf.tolist(), [1] * n, rows, eos_id, stats, answer, confidences, done)
            if all(done) or t == settings.max_new_tokens - 1:
                break
            with timer("denoise"):
                logits = self.forward_block(prefix, tokens, t, keep=True)
        for stat, row in zip(stats, answer):
            stat.tokens, stat.forwards = len(row), stat.denoise_steps - 1
        return DecodeOutput(sequences=answer, finished=done, stats=stats, confidences=confidences)
