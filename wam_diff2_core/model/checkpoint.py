"""Load Qwen3-VL and WAM-Diff2 checkpoints into transformers' Qwen3-VL classes.

Accepted: a stock Qwen3-VL directory (``model_type: qwen3_vl``, autoregressive) and the
authors' WAM-Diff2 directories (``model_type: wam_diff2``, the same tensors), each with
safetensors weights, a tokenizer and a processor, given as a directory or as a Hugging Face hub
id (``ORG/NAME``) already in the local cache (nothing is downloaded). Only safetensors are read
and ``trust_remote_code`` stays off. Decoding settings: see ``DiffusionConfig.resolve``.

    loaded = load_checkpoint("checkpoints/WAM-Diff2-B32-2B", device="auto")
    loaded = load_checkpoint("Qwen/Qwen3-VL-2B-Instruct", overrides={"block_size": 1})

Devices and dtypes: ``devices.py``; saving and exporting: ``saving.py``.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..config import (DIFFUSION_CONFIG_FILE, FLOAT_DTYPES, QUANTIZATIONS, ConfigError, DiffusionConfig,
                      read_diffusion_file)
from .devices import DTYPES, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

# The authors' checkpoints name the same architecture differently.
MODEL_TYPE_ALIASES = {
    "wam_diff2": "qwen3_vl",
    "wam_diff2_text": "qwen3_vl_text",
    "wam_diff2_vision": "qwen3_vl_vision",
}
ACCEPTED_MODEL_TYPES = ("qwen3_vl", "wam_diff2")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete or malformed; the message names the file."""


@dataclass
class LoadedModel:
    model: Any                 # Qwen3VLForConditionalGeneration, eval mode
    processor: Any             # Qwen3VLProcessor (tokenizer padding on the left)
    config: DiffusionConfig
    path: Path
    device: torch.device
    dtype: torch.dtype
    quantization: str = "none"     # the language model's linear layers (model/quantization.py)

    @property
    def tokenizer(self):
        return self.processor.tokenizer


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_checkpoint_path(spec: str | Path) -> Path:
    """A checkpoint directory, or a hub id (``ORG/NAME``) resolved offline in the local Hugging Face
    cache; the error for an id that is not cached says how to download it."""
    path = Path(spec)
    if path.is_dir() or not HUB_ID.match(str(spec)) or path.exists():
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home).expanduser() / "hub")   # read at call time
    try:
        return Path(snapshot_download(str(spec), cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{spec}: no such directory, and not in the local Hugging Face cache {cache} ({type(exc).__name__}); "
            f"download it first (weights as safetensors only): hf download {spec} --include '*.safetensors' "
            "'*.json' '*.jinja' '*.txt'  (huggingface_hub < 1.0: huggingface-cli download ...)") from None


def count_parameters(model_config) -> int:
    """Parameters of the model a config describes, without allocating its weights (meta device)."""
    from transformers import Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(model_config)
    return sum(p.numel() for p in model.parameters())


def available_memory(device: torch.device) -> int | None:
    """Bytes free for the weights: MemAvailable on CPU, free device memory on CUDA / NPU."""
    try:
        if device.type in ("cuda", "npu"):
            return int(getattr(torch, device.type).mem_get_info(device)[0])
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, AttributeError, ValueError):
        return None
    return None


def warn_if_too_large(parameters: int, dtype: torch.dtype, device: torch.device) -> None:
    need = parameters * torch.empty((), dtype=dtype).element_size()
    free = available_memory(device)
    if free is not None and need > free:
        log.warning("the weights alone need %.1f GB in %s (%.2fB parameters) and %s has %.1f GB free: expect "
                    "an out-of-memory failure (use a smaller dtype, another device or a smaller model)",
                    need / 1e9, str(dtype).replace("torch.", ""), parameters / 1e9, device, free / 1e9)


def read_model_config(path: str | Path):
    """The checkpoint's config as a Qwen3VLConfig, WAM-Diff2 names relabelled."""
    from transformers import Qwen3VLConfig

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing (not a Hugging Face checkpoint directory)")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("model_type") not in ACCEPTED_MODEL_TYPES:
        found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"{cfg_file}: model_type {found!r} is not one of {', '.join(ACCEPTED_MODEL_TYPES)}")
    raw = _relabel(raw)
    raw["architectures"] = ["Qwen3VLForConditionalGeneration"]
    for key in ("text_config", "vision_config"):
        if not isinstance(raw.get(key), dict):
            raise CheckpointError(f"{cfg_file}: {key} missing or not an object")
    try:
        return Qwen3VLConfig.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{cfg_file}: invalid Qwen3-VL config ({exc})") from exc


def _relabel(node):
    if isinstance(node, dict):
        out = {k: _relabel(v) for k, v in node.items()}
        if out.get("model_type") in MODEL_TYPE_ALIASES:
            out["model_type"] = MODEL_TYPE_ALIASES[out["model_type"]]
        return out
    return node


def check_files(path: Path) -> None:
    weights = list(path.glob("*.safetensors"))
    if not weights:
        other = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (found {', '.join(other)}; only safetensors are loaded)" if other else ""
        raise CheckpointError(f"{path}: no *.safetensors weights{hint}")
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"{index}: malformed shard index ({exc})") from exc
        missing = sorted(s for s in shards if not (path / s).exists())
        if missing:
            raise CheckpointError(f"{index}: shard file(s) missing: {', '.join(missing)}")
    for what, files in (("tokenizer", TOKENIZER_FILES), ("image processor config", PROCESSOR_FILES)):
        if not any((path / f).exists() for f in files):
            raise CheckpointError(f"{path}: no {what} ({' or '.join(files)})")


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", *PROCESSOR_FILES, "video_preprocessor_config.json")


def warn_about_remote_code(path: Path) -> None:
    """``auto_map`` names modelling code shipped with the checkpoint; it is never run (trust_remote_code
    stays off), so say that the model runs as transformers' Qwen3-VL instead."""
    found = []
    for name in REMOTE_CODE_FILES:
        try:
            raw = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue                       # absent (or unreadable: check_files / the loaders say so)
        if isinstance(raw, dict) and "auto_map" in raw:
            found.append(f"{name}: auto_map")
    if found:
        log.warning("%s: %s names remote code, which is not run (trust_remote_code stays off): the model runs as "
                    "transformers' Qwen3-VL, the processor as its Qwen3VLProcessor", path, "; ".join(found))


def load_processor(path: str | Path):
    from transformers import Qwen3VLProcessor
    try:
        processor = Qwen3VLProcessor.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot load the tokenizer/processor ({exc})") from exc
    processor.tokenizer.padding_side = "left"
    return processor


def load_checkpoint(path: str | Path, *, device: str = "auto", dtype: str = "auto",
                    overrides: Mapping[str, Any] | None = None, attn_implementation: str = "sdpa",
                    quantization: str = "none") -> LoadedModel:
    """Load model + processor from a directory or a cached hub id and resolve the decoding config (``overrides``
    > diffusion_config.json > the format's default; None values are unset). ``quantization``: applied once, here;
    a quantized checkpoint (``wam-diff2 export --quantize``) loads as stored."""
    from safetensors import SafetensorError
    from transformers import Qwen3VLForConditionalGeneration

    path = resolve_checkpoint_path(path)
    model_config = read_model_config(path)
    check_files(path)
    warn_about_remote_code(path)
    processor = load_processor(path)
    if not processor.chat_template:       # every prompt goes through it: fail here, not on every sample
        raise CheckpointError(f"{path}: no chat template (chat_template.jinja, or chat_template in the "
                              "processor's or tokenizer's config): prompts cannot be built")
    checkpoint_format = json.loads((path / "config.json").read_text())["model_type"]    # one of ACCEPTED_MODEL_TYPES
    diffusion = DiffusionConfig.resolve(path, processor.tokenizer, model_config, overrides,
                                        checkpoint_format=checkpoint_format)
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization: {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    stored = stored_quantization(path)
    if stored is not None and quantization not in ("none", stored["method"]):
        raise ConfigError(f"quantization: {path} is stored quantized as {stored['method']} and cannot load as "
                          f"{quantization}; export the float checkpoint with --quantize {quantization} instead")
    dev = resolve_device(device)
    if stored is not None:      # it runs in the dtype its scales were written in (``auto`` picks it)
        from .quantization import build_without_weights, load_quantized, warn_if_cpu

        torch_dtype = DTYPES[stored["dtype"]]
        if dtype != "auto" and resolve_dtype(dtype, torch.device("cpu")) != torch_dtype:
            raise ConfigError(f"dtype: {path} is quantized with {stored['dtype']} scales; load it with dtype "
                              f"{stored['dtype']} or auto (or export the float checkpoint again in {dtype})")
        quantization = stored["method"]
        model = build_without_weights(model_config, torch_dtype, attn_implementation)
        log.info("loaded stored %s", load_quantized(model, path, quantization).describe())
        model.to(dev).eval()
        warn_if_cpu(quantization, dev)
        how = f", stored quantized as {quantization}"
    else:
        parameters = count_parameters(model_config)
        torch_dtype = resolve_dtype(dtype, dev, parameters)
        warn_if_too_large(parameters, torch_dtype, dev)
        try:
            model = Qwen3VLForConditionalGeneration.from_pretrained(
                str(path), config=model_config, dtype=torch_dtype, use_safetensors=True,
                trust_remote_code=False, attn_implementation=attn_implementation)
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
            raise CheckpointError(f"{path}: cannot load the weights ({exc})") from exc
        model.to(dev).eval()
        if quantization != "none":
            from .quantization import quantize_language_model
            quantize_language_model(model, quantization)
        how = "" if quantization == "none" else f", {quantization} quantized at load"
    log.info("loaded %s (%s, %s%s); decoding: %s", path, dev, str(torch_dtype).replace("torch.", ""), how,
             diffusion.describe())
    return LoadedModel(model=model, processor=processor, config=diffusion, path=path, device=dev, dtype=torch_dtype,
                       quantization=quantization)


def stored_quantization(path: Path) -> dict | None:
    """A quantized checkpoint's ``quantization`` block (``method``, ``dtype``), checked; None for a float one."""
    block = read_diffusion_file(path).get("quantization")
    if block is None:
        return None
    where = Path(path) / DIFFUSION_CONFIG_FILE
    if not isinstance(block, dict) or block.get("method") not in QUANTIZATIONS[1:]:
        raise CheckpointError(f"{where}: quantization.method must be one of {', '.join(QUANTIZATIONS[1:])}, "
                              f"got {block.get('method') if isinstance(block, dict) else block!r}")
    if block.get("dtype") not in FLOAT_DTYPES:
        raise CheckpointError(f"{where}: quantization.dtype must be {', '.join(FLOAT_DTYPES[:-1])} or "
                              f"{FLOAT_DTYPES[-1]}, got {block.get('dtype')!r}")
    return block
