"""Decoding settings: one dataclass, resolved once from a checkpoint plus user overrides.

Every default of block-diffusion decoding lives here. The CLI flags (``wam-diff2 infer``),
the node parameters and ``config/*.yaml`` are derived from or checked against
:data:`DECODING_FIELDS`; token ids are read from the checkpoint, never written in code.

    cfg = DiffusionConfig.resolve("ckpt/", tokenizer, model_config, {"block_size": 8})
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

DIFFUSION_CONFIG_FILE = "diffusion_config.json"
MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|im_end|>"

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")
SAMPLERS = ("multinomial", "inverse_cdf")
# The driving policy decodes an answer that does not parse once more with this strategy ("none": never).
PARSE_RETRIES = ("none", *STRATEGIES)
DEFAULT_PARSE_RETRY = "sequential"


class ConfigError(ValueError):
    """A setting or a checkpoint file is wrong; the message names the field or the file."""


def _setting(default, help, *, choices=None, low=None, high=None):
    return field(default=default, metadata={"help": help, "choices": choices, "low": low, "high": high})


@dataclass(frozen=True)
class DecodingSettings:
    """User-tunable decoding settings with their defaults (the paper's Block-32 setup)."""

    block_size: int = _setting(32, "tokens per block; 1 = autoregressive decoding", low=1, high=1024)
    denoising_steps: int = _setting(32, "maximum denoising steps per block", low=1, high=1024)
    remasking_strategy: str = _setting("low_confidence_dynamic", "which masked positions to fill each step",
                                       choices=STRATEGIES)
    confidence_threshold: float = _setting(0.9, "low_confidence_dynamic keeps tokens with p >= this",
                                           low=0.0, high=1.0)
    temperature: float = _setting(0.0, "0 = greedy (argmax); otherwise logits / T before sampling",
                                  low=0.0, high=100.0)
    top_k: int = _setting(0, "keep the k most likely tokens before sampling; 0 = off", low=0, high=10**7)
    top_p: float = _setting(1.0, "nucleus sampling mass; 1 = off", low=0.0, high=1.0)
    sampler: str = _setting("multinomial", "how to sample when temperature > 0 (inverse_cdf for Ascend NPUs)",
                            choices=SAMPLERS)
    max_new_tokens: int = _setting(256, "upper bound on the answer length in tokens", low=1, high=65536)
    mask_check_interval: int = _setting(
        1, "static decoder: read the remaining-mask count on the host every k denoising steps (1 = every "
        "step; larger = fewer host syncs but possibly idle steps; sampling with temperature > 0 checks every "
        "step); never changes the tokens", low=1, high=1024)

    def validated(self) -> "DecodingSettings":
        _validate_fields(self)
        if self.top_p <= 0.0:
            raise ConfigError("top_p: must be > 0")
        return self

    def replace(self, **overrides: Any) -> "DecodingSettings":
        unknown = set(overrides) - set(DECODING_FIELDS)
        if unknown:
            raise ConfigError(f"unknown decoding setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **overrides).validated()


DECODING_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(DecodingSettings)}

IMPLEMENTATIONS = ("plain", "static")
ATTENTION_BACKENDS = ("sdpa", "flashinfer")


@dataclass(frozen=True)
class EngineSettings:
    """How decoding runs on the device; never which tokens come out (see decoding/static.py)."""

    implementation: str = _setting("plain", "decoder: plain (transformers cache, the reference) or static "
                                   "(preallocated KV cache, fused commit, optional CUDA graphs)",
                                   choices=IMPLEMENTATIONS)
    attention_backend: str = _setting("sdpa", "static decoder attention: sdpa (reference) or flashinfer "
                                      "(CUDA, bf16/fp16, pip install .[gpu])", choices=ATTENTION_BACKENDS)
    cuda_graphs: bool = _setting(False, "static decoder: capture the fixed-shape denoise step in CUDA graphs "
                                 "per batch-size bucket (CUDA only; falls back to eager with a logged reason)")
    fused_commit: bool = _setting(True, "static decoder: commit block b in the first denoise forward of block "
                                  "b + 1 (S_b forwards per block instead of S_b + 1)")
    max_context_tokens: int = _setting(4096, "static decoder with CUDA graphs: KV cache slots per sequence "
                                       "(prompt + answer), allocated once", low=64, high=1 << 20)
    max_graph_batch: int = _setting(8, "static decoder with CUDA graphs: largest batch-size bucket "
                                    "(buckets 1, 2, 4, ... up to this); larger batches run eagerly",
                                    low=1, high=1024)
    cpu_threads: int = _setting(0, "torch intra-op threads when the model runs on CPU; 0 = torch's default "
                                "(one per core), which can oversubscribe a small CPU shared with the ROS "
                                "executor and other processes (2 cores: 16 s per plan instead of 0.4 s)",
                                low=0, high=1024)

    def validated(self) -> "EngineSettings":
        _validate_fields(self)
        if self.implementation == "plain" and (self.cuda_graphs or self.attention_backend != "sdpa"):
            raise ConfigError("implementation: cuda_graphs and attention_backend flashinfer need "
                              "implementation static")
        return self

    def replace(self, **overrides: Any) -> "EngineSettings":
        unknown = set(overrides) - set(ENGINE_FIELDS)
        if unknown:
            raise ConfigError(f"unknown engine setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **overrides).validated()


ENGINE_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(EngineSettings)}


def _validate_fields(settings) -> None:
    """Type, finiteness, choices and range of every field of a settings dataclass (errors name the field)."""
    for f in dataclasses.fields(settings):
        expected = f.type if isinstance(f.type, type) else \
            {"int": int, "float": float, "str": str, "bool": bool}[f.type]
        object.__setattr__(settings, f.name, check_value(f.name, getattr(settings, f.name), expected, f.metadata))


def check_value(where: str, value: Any, expected: type, meta: Mapping[str, Any]) -> Any:
    """One setting against its type and its ``choices`` / ``low`` / ``high`` metadata; returns the
    value (an int where a float is expected becomes a float). Errors start with ``where``."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
        raise ConfigError(f"{where}: expected {expected.__name__}, got {value!r}")
    if expected is float and not math.isfinite(value):
        raise ConfigError(f"{where}: must be finite, got {value!r}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}")
    if meta["low"] is not None and value < meta["low"]:
        raise ConfigError(f"{where}: {value!r} is below {meta['low']}")
    if meta["high"] is not None and value > meta["high"]:
        raise ConfigError(f"{where}: {value!r} is above {meta['high']}")
    return value


@dataclass(frozen=True)
class DiffusionConfig:
    """Decoding settings plus the token ids they need, as resolved for one checkpoint."""

    settings: DecodingSettings
    eos_token_id: int
    mask_token_id: int | None          # None: an AR checkpoint not yet converted
    banned_token_ids: tuple[int, ...]  # never emitted: MASK, specials except EOS, rows past the tokenizer
    vocab_size: int                    # LM head width

    @property
    def block_size(self) -> int:
        return self.settings.block_size

    @classmethod
    def resolve(cls, checkpoint_dir: str | Path | None, tokenizer, model_config,
                overrides: Mapping[str, Any] | None = None) -> "DiffusionConfig":
        """Checkpoint file (``diffusion_config.json``) < user overrides; ids from the checkpoint."""
        stored = read_diffusion_file(checkpoint_dir) if checkpoint_dir is not None else {}
        base = {k: v for k, v in stored.get("decoding", {}).items()}
        unknown = set(base) - set(DECODING_FIELDS)
        if unknown:
            raise ConfigError(f"{DIFFUSION_CONFIG_FILE}: unknown decoding key(s) {', '.join(sorted(unknown))}")
        if "block_size" in stored:
            base["block_size"] = stored["block_size"]
        elif not stored:
            base.setdefault("block_size", 1)  # a stock (AR) checkpoint decodes autoregressively
        merged = {**base, **{k: v for k, v in (overrides or {}).items() if v is not None}}
        settings = DecodingSettings().replace(**merged)

        text_config = getattr(model_config, "text_config", model_config)
        vocab_size = int(text_config.vocab_size)
        eos_id = stored.get("eos_token_id")
        if eos_id is None:
            eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
            if eos_id is None or eos_id == tokenizer.unk_token_id:
                eos_id = tokenizer.eos_token_id
        mask_id = stored.get("mask_token_id", getattr(model_config, "mask_token_id", None))
        if mask_id is None and MASK_TOKEN in tokenizer.get_vocab():
            mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if eos_id is None:
            raise ConfigError(f"cannot find the EOS token {EOS_TOKEN!r} in the tokenizer")
        if settings.block_size > 1 and mask_id is None:
            raise ConfigError(
                f"block_size: {settings.block_size} needs a mask token, and this checkpoint has none "
                f"(no {DIFFUSION_CONFIG_FILE}, no {MASK_TOKEN} in the tokenizer); convert it first with "
                "`wam-diff2 convert`, or use --block-size 1")
        for name, value in (("eos_token_id", eos_id), ("mask_token_id", mask_id)):
            if value is not None and not 0 <= int(value) < vocab_size:
                raise ConfigError(f"{name}: {value} is outside the LM head (vocab_size {vocab_size})")

        special = set(getattr(tokenizer, "all_special_ids", []))
        special |= {i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special}
        special.discard(int(eos_id))
        if mask_id is not None:
            special.add(int(mask_id))
        special |= set(range(len(tokenizer), vocab_size))
        return cls(settings=settings, eos_token_id=int(eos_id),
                   mask_token_id=None if mask_id is None else int(mask_id),
                   banned_token_ids=tuple(sorted(i for i in special if 0 <= i < vocab_size)),
                   vocab_size=vocab_size)

    def with_settings(self, **overrides: Any) -> "DiffusionConfig":
        settings = self.settings.replace(**{k: v for k, v in overrides.items() if v is not None})
        if settings.block_size > 1 and self.mask_token_id is None:
            raise ConfigError("block_size: > 1 needs a mask token; convert the checkpoint first")
        return dataclasses.replace(self, settings=settings)


def read_diffusion_file(checkpoint_dir: str | Path) -> dict:
    path = Path(checkpoint_dir) / DIFFUSION_CONFIG_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    allowed = {"block_size", "mask_token_id", "eos_token_id", "decoding", "format_version"}
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    return data


def write_diffusion_file(checkpoint_dir: str | Path, *, block_size: int, mask_token_id: int,
                         eos_token_id: int, decoding: DecodingSettings | None = None) -> Path:
    """Write the diffusion settings beside a checkpoint (decoding defaults minus block_size)."""
    decoding = decoding or DecodingSettings()
    payload = {
        "format_version": 1,
        "block_size": int(block_size),
        "mask_token_id": int(mask_token_id),
        "eos_token_id": int(eos_token_id),
        "decoding": {k: v for k, v in dataclasses.asdict(decoding).items() if k != "block_size"},
    }
    path = Path(checkpoint_dir) / DIFFUSION_CONFIG_FILE
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
