"""Block-causal attention masks and response positions (docs/decoding.md, The decoding contract).

Prompt tokens are split into blocks of B from position 0 (block id = pos // B); a token sees
every token whose block id is <= its own. Response blocks start at block id ceil(P / B):
each sees the whole prefix and itself. B = 1 is plain causal attention. Batches are padded
on the left; padding is never attended.

Masks are boolean, True = may attend, shaped [batch, 1, queries, keys] for SDPA.
"""
from __future__ import annotations

import torch


def first_response_block_id(prompt_length: int, block_size: int) -> int:
    """Response block 0 has block id ceil(P / B): after every (possibly partial) prompt block."""
    return -(-prompt_length // block_size)


def prompt_block_mask(attention_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block-causal mask over a left-padded prompt batch.

    attention_mask: [batch, T] with 1 at real tokens. Returns [batch, 1, T, T]. A padding row
    attends to itself only (its output is never used) so that no softmax row is empty.
    """
    valid = attention_mask.bool()                                   # [N, T]
    n, t = valid.shape
    pad = t - valid.sum(dim=1, keepdim=True)                        # [N, 1]
    pos = torch.arange(t, device=valid.device).unsqueeze(0) - pad   # unpadded position, [N, T]
    blk = torch.div(pos.clamp(min=0), block_size, rounding_mode="floor")   # block ids
    mask = blk.unsqueeze(2) >= blk.unsqueeze(1)                     # query block >= key block
    mask &= valid.unsqueeze(1) & valid.unsqueeze(2)
    mask |= torch.eye(t, dtype=torch.bool, device=valid.device).unsqueeze(0)
    return mask.unsqueeze(1)


def block_query_mask(prefix_valid: torch.Tensor, block_len: int) -> torch.Tensor:
    """A response block against the cached prefix: [batch, 1, block_len, L + block_len].

    prefix_valid: [batch, L] keys already in the cache (False at padding). Inside the block
    attention is bidirectional.
    """
    n = prefix_valid.shape[0]
    inside = torch.ones(n, block_len, dtype=torch.bool, device=prefix_valid.device)
    keys = torch.cat([prefix_valid.bool(), inside], dim=1)           # [N, L + block]
    return keys[:, None, None, :].expand(n, 1, block_len, keys.shape[1])


def response_positions(next_position: torch.Tensor, offset: int, length: int) -> torch.Tensor:
    """MRoPE ids [3, batch, length] for response tokens ``offset .. offset+length-1``.

    next_position: [batch] = max prompt position + 1 (i.e. P + rope_delta); every response
    token at response offset o uses position next_position + o on all three axes.
    """
    steps = torch.arange(offset, offset + length, device=next_position.device)
    pos = next_position.unsqueeze(1) + steps.unsqueeze(0)            # [N, length]
    return pos.unsqueeze(0).expand(3, -1, -1)
