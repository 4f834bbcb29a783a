"""A plain reference decoder for the tests: no KV cache, one sequence, full recompute.

Every step forwards the whole sequence (prompt + committed blocks + the current block) with
the full block-causal mask built here from the spec, independently of
``wam_diff2_core.decoding.masks``. Token selection reuses the package's sampling functions
(they have their own tests); what this pins is caching, masks, positions and the block loop.
"""
from __future__ import annotations

import torch

from wam_diff2_core.decoding.sampling import choose_transfer, sample_tokens, transfer_schedule


def full_block_causal_mask(prompt_len: int, response_len: int, block_size: int) -> torch.Tensor:
    """[1, 1, L, L]: prompt block id = pos // B; response token j has id ceil(P/B) + j // B."""
    first = -(-prompt_len // block_size)
    ids = [p // block_size for p in range(prompt_len)] + [first + j // block_size for j in range(response_len)]
    ids = torch.tensor(ids)
    return (ids.unsqueeze(1) >= ids.unsqueeze(0))[None, None]


def reference_decode(model, config, inputs, settings, generator=None, confidences: list | None = None) -> list[int]:
    """Decode one unpadded prompt; returns the answer ids truncated before the first EOS. ``confidences``:
    a list that receives each answer token's confidence when it was fixed (the last step's if never fixed)."""
    kept = [] if confidences is None else confidences
    ids = inputs["input_ids"]
    assert ids.shape[0] == 1 and bool(inputs["attention_mask"].all())
    mm = inputs.get("mm_token_type_ids", torch.zeros_like(ids))
    vision = {k: inputs[k] for k in ("pixel_values", "image_grid_thw") if inputs.get(k) is not None}
    prompt_pos, _ = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=vision.get("image_grid_thw"))
    next_pos = int(prompt_pos.max()) + 1
    size, mask_id, eos = settings.block_size, config.mask_token_id, config.eos_token_id
    banned = torch.tensor(config.banned_token_ids)
    gens = [generator]

    def logits_for(response: torch.Tensor) -> torch.Tensor:
        seq = torch.cat([ids, response.unsqueeze(0)], dim=1)
        r = response.numel()
        pos = torch.cat([prompt_pos, (next_pos + torch.arange(r)).view(1, 1, r).expand(3, 1, r)], dim=2)
        out = model(input_ids=seq, attention_mask=full_block_causal_mask(ids.shape[1], r, size),
                    position_ids=pos, mm_token_type_ids=torch.cat([mm, torch.zeros(1, r, dtype=mm.dtype)], 1),
                    **vision)
        return out.logits[0, ids.shape[1] - 1:] if size == 1 else out.logits[0, ids.shape[1]:]

    answer: list[int] = []
    with torch.no_grad():
        if size == 1:
            response = torch.empty(0, dtype=torch.long)
            for _ in range(settings.max_new_tokens):
                logits = logits_for(response)[-1:]                       # next-token logits
                tok, p = sample_tokens(logits.unsqueeze(0), settings, banned, gens)
                tok = int(tok)
                if tok == eos:
                    return answer
                answer.append(tok)
                kept.append(float(p))
                response = torch.cat([response, torch.tensor([tok])])
            return answer
        schedule = transfer_schedule(size, settings.denoising_steps)
        committed = torch.empty(0, dtype=torch.long)
        for _ in range(-(-settings.max_new_tokens // size)):
            block = torch.full((size,), mask_id)
            last, fixed_conf = block, [None] * size
            for step in range(settings.denoising_steps):
                masked = block == mask_id
                if not masked.any():
                    break
                logits = logits_for(torch.cat([committed, block]))[-size:]
                last, conf = sample_tokens(logits.unsqueeze(0), settings, banned, gens)
                last, conf = last[0], conf[0]
                pick = choose_transfer(masked[None], conf[None], settings, step, schedule)[0]
                block = torch.where(pick, last, block)
                fixed_conf = [float(c) if picked else f for c, picked, f in zip(conf, pick.tolist(), fixed_conf)]
            fixed_conf = [float(c) if f is None else f for c, f in zip(conf, fixed_conf)]
            block = torch.where(block == mask_id, last, block)
            values = block.tolist()
            if eos in values:
                kept += fixed_conf[:values.index(eos)]
                del kept[settings.max_new_tokens:]
                return (answer + values[:values.index(eos)])[:settings.max_new_tokens]
            answer += values
            kept += fixed_conf
            committed = torch.cat([committed, block])
    del kept[settings.max_new_tokens:]
    return answer[:settings.max_new_tokens]
