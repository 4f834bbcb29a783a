"""AR Qwen3-VL checkpoint -> diffusion-ready checkpoint (mask token, mask row, settings file); `wam-diff2 convert`."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import EOS_TOKEN, MASK_TOKEN, DecodingSettings, write_diffusion_file
from ..utils.atomic import atomic_directory
from .checkpoint import check_files, load_processor, read_model_config
from .saving import save_checkpoint

log = logging.getLogger(__name__)


def convert_to_diffusion(src: str | Path, dst: str | Path, *, block_size: int = 4) -> Path:
    """Write ``dst``: ``src`` plus ``<|mask|>`` (token and embedding row) and diffusion_config.json."""
    from tokenizers import AddedToken
    from transformers import Qwen3VLForConditionalGeneration

    src = Path(src)
    config = read_model_config(src)
    check_files(src)
    processor = load_processor(src)
    tokenizer = processor.tokenizer
    # A mask id the checkpoint already names (the authors' config.json field) is the row the model
    # was trained with: keep it, never move it to a new token.
    mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None:
        if MASK_TOKEN not in tokenizer.get_vocab():
            tokenizer.add_special_tokens(
                {"additional_special_tokens": [AddedToken(MASK_TOKEN, special=True, normalized=False)]},
                replace_extra_special_tokens=False)
        mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    else:
        log.info("keeping the checkpoint's mask_token_id %d (config.json)", mask_id)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(src), config=config, dtype="auto",
                                                            use_safetensors=True, trust_remote_code=False)
    rows = model.get_input_embeddings().weight.shape[0]
    if mask_id >= rows:
        # New row(s) start at the mean embedding: a neutral point the mask row is trained from.
        with torch.no_grad():
            mean_in = model.get_input_embeddings().weight.mean(dim=0)
            mean_out = model.lm_head.weight.mean(dim=0)
        model.resize_token_embeddings(mask_id + 1, mean_resizing=False)
        with torch.no_grad():
            model.get_input_embeddings().weight[rows:] = mean_in
            model.lm_head.weight[rows:] = mean_out
        log.info("grew the vocabulary from %d to %d rows for %s", rows, mask_id + 1, MASK_TOKEN)
    with atomic_directory(dst) as tmp:
        save_checkpoint(model, processor, tmp)
        write_diffusion_file(tmp, block_size=block_size, mask_token_id=mask_id, eos_token_id=eos_id,
                             decoding=DecodingSettings())
    return Path(dst)

