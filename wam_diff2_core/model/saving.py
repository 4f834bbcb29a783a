"""Saving checkpoints: ``save_pretrained`` that transformers 4.57 (the authors' version) also reads, and
``export_checkpoint`` (``wam-diff2 export``: a trained model cast to a dtype, optionally quantized).

    save_checkpoint(model, processor, "out/")
    export_checkpoint("runs/b32/final", "ship/b32", dtype="bfloat16", quantize="int8")
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..config import DIFFUSION_CONFIG_FILE, diffusion_file_payload, read_diffusion_file
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
    quantized = loaded.quantization != "none"
    with atomic_directory(dst) as tmp:
        # quantized: the config alone through save_pretrained, the weights as torchao writes them
        save_checkpoint(loaded.model.config if quantized else loaded.model, loaded.processor, tmp)
        if not quantized:
            if (src / DIFFUSION_CONFIG_FILE).is_file():
                shutil.copyfile(src / DIFFUSION_CONFIG_FILE, tmp / DIFFUSION_CONFIG_FILE)
            return Path(dst)
        from .quantization import INT4_GROUP_SIZE, save_quantized_weights

        save_quantized_weights(loaded.model, tmp)
        # without diffusion_config.json, the settings the checkpoint resolves to (the file replaces the format's)
        c = loaded.config
        settings = read_diffusion_file(src) or diffusion_file_payload(
            block_size=c.block_size, mask_token_id=c.mask_token_id, eos_token_id=c.eos_token_id, decoding=c.settings)
        import torchao
        settings["quantization"] = {
            "method": loaded.quantization, "dtype": str(loaded.dtype).replace("torch.", ""),
            "modules": "the language model's decoder-layer linear layers; the LM head and token embedding int8",
            "library": f"torchao {torchao.__version__}",
            **({"group_size": INT4_GROUP_SIZE} if loaded.quantization == "int4" else {})}
        (tmp / DIFFUSION_CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    return Path(dst)


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
