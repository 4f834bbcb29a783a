"""Chat messages + images -> a left-padded processor batch for the decoder or training."""
from __future__ import annotations

from typing import Any, Sequence

# The paper's pixel budget (Qwen3-VL processor min/max pixels).
DEFAULT_MIN_PIXELS = 12544
DEFAULT_MAX_PIXELS = 2073600


def pixel_size(min_pixels: int | None, max_pixels: int | None,
               current: dict[str, int] | None = None) -> dict[str, int] | None:
    """The processor ``size`` override for a pixel budget (None: the checkpoint's own). A bound
    left None keeps the processor's ``current`` one (its ``shortest_edge`` / ``longest_edge``)."""
    if min_pixels is None and max_pixels is None:
        return None
    current = current or {}
    low = min_pixels if min_pixels is not None else current.get("shortest_edge")
    high = max_pixels if max_pixels is not None else current.get("longest_edge")
    if low is None or high is None or not 0 < low <= high:
        raise ValueError(f"pixel budget: need 0 < min_pixels <= max_pixels, got {low}, {high}"
                         + (" (the other bound from the processor)" if None in (min_pixels, max_pixels) else ""))
    return {"shortest_edge": int(low), "longest_edge": int(high)}


def encode_prompts(processor, conversations: Sequence[list[dict[str, Any]]], images: Sequence[list[Any]],
                   *, min_pixels: int | None = None, max_pixels: int | None = None,
                   add_generation_prompt: bool = True) -> dict[str, Any]:
    """Apply the chat template to each conversation and encode the batch (left padding)."""
    texts = [processor.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False)
             for c in conversations]
    flat = [im for ims in images for im in ims]
    size = pixel_size(min_pixels, max_pixels, getattr(processor.image_processor, "size", None))
    kwargs = {} if size is None else {"size": size}
    processor.tokenizer.padding_side = "left"
    return processor(text=texts, images=flat or None, return_tensors="pt", padding=True, **kwargs)
