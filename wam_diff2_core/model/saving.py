"""Saving checkpoints: ``save_pretrained`` that transformers 4.57 (the authors' version) also reads, and
``export_checkpoint`` (``wam-diff2 export``: a trained model cast to a dtype, optionally quantized).

    save_checkpoint(model, processor, "out/")
    export_checkpoint("runs/b32/final", "ship/b32", dtype="bfloat16", quantize="int8")
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..config import DIFFUSION_CONFIG_FILE, DiffusionConfig, read_diffusion_file
from ..utils.atomic import atomic_directory
from .checkpoint import load_checkpoint


def save_checkpoint(model, processor, out: str | Path, **save_kwargs) -> None:
    """``save_pretrained`` of model and processor, plus what transformers 4.57 (the authors') needs to load them
    (:func:`add_legacy_fields`); transformers 5.x loads both forms alike."""
    out = Path(out)
    model.save_pretrained(out, **save_kwargs)
    processor.save_pretrained(out)
    add_legacy_fields(out)


def export_checkpoint(src: str | Path, dst: str | Path, *, dtype: str = "bfloat16", quantize: str = "none") -> Path:
    """Write ``dst``: ``src`` with its weights cast to ``dtype``, the rest unchanged; ``quantize``: the language
    model quantized and stored as torchao writes it (model/quantization.py), the method and dtype in
    ``diffusion_config.json``'s ``quantization`` block."""
    src = Path(src)
    loaded = load_checkpoint(src, device="cpu", dtype=dtype, quantization=quantize)
    with atomic_directory(dst) as tmp:
        if loaded.quantization == "none":
            save_checkpoint(loaded.model, loaded.processor, tmp)
            if (src / DIFFUSION_CONFIG_FILE).is_file():
                shutil.copyfile(src / DIFFUSION_CONFIG_FILE, tmp / DIFFUSION_CONFIG_FILE)
            return Path(dst)
        from .quantization import INT4_GROUP_SIZE, save_quantized_weights

        loaded.model.config.save_pretrained(tmp)
        loaded.processor.save_pretrained(tmp)
        add_legacy_fields(tmp)
        save_quantized_weights(loaded.model, tmp)
        settings = read_diffusion_file(src) or _diffusion_payload(loaded.config)
        import torchao
        settings["quantization"] = {
            "method": loaded.quantization, "dtype": str(loaded.dtype).replace("torch.", ""),
            "modules": "the language model's decoder-layer linear layers; the LM head and token embedding int8",
            "library": f"torchao {torchao.__version__}",
            **({"group_size": INT4_GROUP_SIZE} if loaded.quantization == "int4" else {})}
        (tmp / DIFFUSION_CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    return Path(dst)


def _diffusion_payload(config: DiffusionConfig) -> dict:
    """The settings a checkpoint without diffusion_config.json resolves to, as that file would hold them (a
    quantized export needs the file for its quantization block, and the file replaces the format's defaults)."""
    import dataclasses
    return {"format_version": 1, "block_size": config.block_size, "eos_token_id": config.eos_token_id,
            **({} if config.mask_token_id is None else {"mask_token_id": config.mask_token_id}),
            "decoding": {k: v for k, v in dataclasses.asdict(config.settings).items() if k != "block_size"}}


def add_legacy_fields(out: str | Path) -> None:
    """Add to a saved directory, in place, ``rope_scaling`` / ``rope_theta`` beside 5.x's ``rope_parameters`` and
    the tokenizer's extra special tokens as ``additional_special_tokens`` (4.57 reads the 5.x list as a mapping)."""
    out = Path(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config", {})
    rope = text.get("rope_parameters")
    if isinstance(rope, dict) and "rope_scaling" not in text:
        text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        if "rope_theta" in rope:
            text["rope_theta"] = rope["rope_theta"]
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok_path = out / "tokenizer_config.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        extra = tok.get("extra_special_tokens")
        if isinstance(extra, list):
            del tok["extra_special_tokens"]
            tok["additional_special_tokens"] = extra
            tok_path.write_text(json.dumps(tok, indent=2) + "\n")
