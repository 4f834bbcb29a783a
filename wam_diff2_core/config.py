"""Decoding settings: one dataclass, resolved once from a checkpoint plus user overrides.

Every default of block-diffusion decoding lives here. The CLI flags (``wam-diff2 infer``),
the node parameters and ``config/*.yaml`` are derived from or checked against
:data:`DECODING_FIELDS`; token ids are read from the checkpoint, never written in code.

    cfg = DiffusionConfig.resolve("ckpt/", tokenizer, model_config, {"block_size": 8})
    cfg.describe()   # block_size=8 (from user); denoising_steps=32, ... (from diffusion_config.json)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .utils.fields import setting

log = logging.getLogger(__name__)

DIFFUSION_CONFIG_FILE = "diffusion_config.json"
MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|im_end|>"

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")
SAMPLERS = ("multinomial", "inverse_cdf")
# The driving policy decodes an answer that does not parse once more with this strategy ("none": never).
PARSE_RETRIES = ("none", *STRATEGIES)
DEFAULT_PARSE_RETRY = "sequential"
DEVICES = ("auto", "cpu", "cuda", "npu")      # where a model runs; "auto": cuda, then an Ascend npu, then cpu
# model dtypes a checkpoint may be loaded in, exported in or trained in (besides "auto"); the short names are aliases
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_NAMES = (*FLOAT_DTYPES, *DTYPE_ALIASES)


class ConfigError(ValueError):
    """A setting or a checkpoint file is wrong; the message names the field or the file."""


def refuse_unknown(given: Iterable[str], known: Iterable[str], what: str) -> None:
    """ConfigError ``<what> <the names>`` when ``given`` has names ``known`` has not."""
    if unknown := set(given) - set(known):
        raise ConfigError(f"{what} {', '.join(sorted(unknown))}")


@dataclass(frozen=True)
class DecodingSettings:
    """User-tunable decoding settings with their defaults (the paper's Block-32 setup)."""

    block_size: int = setting(32, "tokens per block; 1 = autoregressive decoding", low=1, high=1024)
    denoising_steps: int = setting(32, "maximum denoising steps per block", low=1, high=1024)
    remasking_strategy: str = setting("low_confidence_dynamic", "which masked positions to fill each step",
                                       choices=STRATEGIES)
    confidence_threshold: float = setting(0.9, "low_confidence_dynamic keeps tokens with p >= this",
                                           low=0.0, high=1.0)
    temperature: float = setting(0.0, "0 = greedy (argmax); otherwise logits / T before sampling",
                                  low=0.0, high=100.0)
    top_k: int = setting(0, "keep the k most likely tokens before sampling; 0 = off", low=0, high=10**7)
    top_p: float = setting(1.0, "nucleus sampling mass; 1 = off", low=0.0, high=1.0)
    sampler: str = setting("multinomial", "how to sample when temperature > 0 (inverse_cdf for Ascend NPUs)",
                            choices=SAMPLERS)
    max_new_tokens: int = setting(256, "upper bound on the answer length in tokens", low=1, high=65536)
    mask_check_interval: int = setting(
        1, "static decoder: read the remaining-mask count on the host every k denoising steps (1 = every "
        "step; larger = fewer host syncs but possibly idle steps; sampling with temperature > 0 checks every "
        "step); never changes the tokens", low=1, high=1024)

    def validated(self) -> "DecodingSettings":
        _validate_fields(self)
        if self.top_p <= 0.0:
            raise ConfigError("top_p: must be > 0")
        return self

    def replace(self, **overrides: Any) -> "DecodingSettings":
        refuse_unknown(overrides, DECODING_FIELDS, "unknown decoding setting(s):")
        return dataclasses.replace(self, **overrides).validated()


DECODING_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(DecodingSettings)}

IMPLEMENTATIONS = ("auto", "plain", "static")
# weight quantization of the language model's linear layers at load (model/quantization.py)
QUANTIZATIONS = ("none", "int8", "int4", "int8-dynamic")
ATTENTION_BACKENDS = ("sdpa", "flashinfer")
LAYER_KERNELS = ("auto", "triton", "torch")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class EngineSettings:
    """How decoding runs on the device. Only ``quantization`` changes which tokens come out (the decoders
    agree exactly with each other on the same weights; see decoding/static.py)."""

    implementation: str = setting("auto", "decoder: auto (the device's fast path: static with CUDA graphs, "
                                   "and FlashInfer when installed for bf16/fp16, on CUDA; static elsewhere), plain "
                                   "(transformers cache, the reference) or static (preallocated KV cache, fused "
                                   "commit, optional CUDA graphs)", choices=IMPLEMENTATIONS)
    attention_backend: str = setting("sdpa", "static decoder attention: sdpa (reference) or flashinfer "
                                      "(CUDA, bf16/fp16, pip install .[gpu])", choices=ATTENTION_BACKENDS)
    cuda_graphs: bool = setting(False, "static decoder: capture the fixed-shape denoise step in CUDA graphs "
                                 "per batch-size bucket (CUDA only; falls back to eager with a logged reason)")
    compile_forward: bool = setting(False, "static decoder with SDPA: run the text forward of every step "
                                     "through torch.compile (fullgraph, static shapes; with CUDA graphs the compiled "
                                     "forward is captured in the same graphs); code is generated once per step shape, "
                                     "at warm-up (seconds to minutes each), and key spans are bucketed as under graphs")
    layer_kernels: str = setting("auto", "static decoder: the fused layer ops (add + RMSNorm, q/k norm + rotary + "
                                  "K/V write, SiLU * up): auto (Triton kernels on CUDA when Triton imports and they pass "
                                  "a self-check at start, else torch), triton, or torch (transformers' own ops: "
                                  "bit-identical to the model in float32 on CPU)", choices=LAYER_KERNELS)
    compile_mode: str = setting("default", "with compile_forward: Inductor's mode, default (heuristic kernels: "
                                 "seconds per step shape) or max-autotune-no-cudagraphs (autotuned matmuls: minutes "
                                 "per step shape on an H200)", choices=COMPILE_MODES)
    fused_commit: bool = setting(True, "static decoder: commit block b in the first denoise forward of block "
                                  "b + 1 (S_b forwards per block instead of S_b + 1)")
    max_context_tokens: int = setting(4096, "static decoder with CUDA graphs or compile_forward: KV cache slots "
                                       "per sequence (prompt + answer), allocated once", low=64, high=1 << 20)
    max_graph_batch: int = setting(8, "static decoder with CUDA graphs or compile_forward: largest batch-size "
                                    "bucket (buckets 1, 2, 4, ... up to this); larger batches run eagerly",
                                    low=1, high=1024)
    cpu_threads: int = setting(0, "torch intra-op threads when the model runs on CPU; 0 = OMP_NUM_THREADS "
                                "when set, else the CPUs this process may run on (its affinity, not the "
                                "machine's core count), which can oversubscribe a small CPU shared with the "
                                "ROS executor and other processes (docs/reliability.md)",
                                low=0, high=1024)
    quantization: str = setting("none", "weights of the language model's decoder-layer linear layers, applied at "
                                 "load: none (float), int8 (weight-only), int4 (weight-only, groups of 32) or "
                                 "int8-dynamic (int8 weights and activations); under each but none the LM head and "
                                 "token embedding are int8; needs torchao (pip install .[quant]); changes "
                                 "the tokens (check with wam-diff2 quant-check); a quantized checkpoint loads as "
                                 "it was exported", choices=QUANTIZATIONS)

    def validated(self) -> "EngineSettings":
        _validate_fields(self)
        if self.implementation == "plain" and (self.cuda_graphs or self.compile_forward
                                               or self.attention_backend != "sdpa"):
            raise ConfigError("implementation: cuda_graphs, compile_forward and attention_backend flashinfer need "
                              "implementation static")
        if self.compile_forward and self.attention_backend != "sdpa":
            raise ConfigError("compile_forward: needs attention_backend sdpa (FlashInfer's planned kernels are "
                              "not traced by torch.compile)")
        return self

    def replace(self, **overrides: Any) -> "EngineSettings":
        refuse_unknown(overrides, ENGINE_FIELDS, "unknown engine setting(s):")
        return dataclasses.replace(self, **overrides).validated()


ENGINE_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(EngineSettings)}


def default_cpu_threads() -> tuple[int, str]:
    """(threads, where from) of ``cpu_threads: 0``: OMP_NUM_THREADS when set, else the CPUs this process may
    run on (its affinity: taskset, a container's cpuset), not the machine's core count."""
    try:
        requested = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        requested = 0
    if requested > 0:
        return requested, "OMP_NUM_THREADS"
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)), "the process's CPU affinity"
    return os.cpu_count() or 1, "the CPU count"            # no affinity API (macOS)


def add_threads_argument(parser) -> None:
    """``--threads N``: the planner node's ``engine.cpu_threads``, for every command that runs a model
    (the command line's and the trainer's), set with :func:`apply_cpu_threads`."""
    f = ENGINE_FIELDS["cpu_threads"]
    parser.add_argument("--threads", dest="cpu_threads", type=int, default=f.default,
                        help=f"{f.metadata['help']} (default {f.default})")


def apply_cpu_threads(cpu_threads: int) -> int:
    """Set torch's intra-op threads to ``cpu_threads`` (0: :func:`default_cpu_threads`), process-wide as torch
    allows, and log it; returns the number."""
    import torch

    cpu_threads = EngineSettings().replace(cpu_threads=cpu_threads).cpu_threads      # validated
    threads, source = (cpu_threads, "cpu_threads / --threads") if cpu_threads else default_cpu_threads()
    from wam_diff2_core._openmp import wait_policy

    torch.set_num_threads(threads)
    log.info("torch intra-op threads: %d (from %s); waiting threads: %s", threads, source, wait_policy())
    return threads

# The fast path proves itself where it runs (DrivingPolicy.check_fast_path, the node at configure): on
# the warm-up prompt its tokens must equal the plain path's in float32 (bit-exact, as the tests pin)
# and agree at this share of positions at least in bfloat16 / float16, where the two paths' kernels
# round differently and a near tie can flip a token. Below it, the policy falls back to plain.
FAST_PATH_MIN_AGREEMENT = {"float32": 1.0, "bfloat16": 0.9, "float16": 0.9}


def field_type(f: dataclasses.Field) -> type:
    """The Python type of a settings field (annotations are strings here: ``from __future__``)."""
    return f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str, "bool": bool}[f.type]


def _validate_fields(settings) -> None:
    """Type, finiteness, choices and range of every field of a settings dataclass (errors name the field)."""
    for f in dataclasses.fields(settings):
        object.__setattr__(settings, f.name, check_value(f.name, getattr(settings, f.name), field_type(f), f.metadata))


def check_value(where: str, value: Any, expected: type, meta: Mapping[str, Any]) -> Any:
    """One setting against its type (``list``: of strings, a ROS string array) and its ``choices`` / ``low`` /
    ``high`` metadata; returns the value (an int where a float is expected becomes a float). Errors start with
    ``where``."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is list:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
    if not ok:
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


# Where each setting came from, in precedence order (the first that has it wins).
SOURCE_USER = "user"
SOURCE_FILE = DIFFUSION_CONFIG_FILE
SOURCE_DEFAULT = "package default"
# Without a diffusion_config.json the checkpoint's format decides: the authors' WAM-Diff2 checkpoints
# are block-diffusion models (the paper's Block-32 settings, the DecodingSettings defaults); a stock
# Qwen3-VL checkpoint is the autoregressive starting point (B = 1).
FORMAT_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "wam_diff2": ("wam_diff2 format (the paper's Block-32 settings)", {}),
    "qwen3_vl": ("qwen3_vl format (autoregressive)", {"block_size": 1}),
}
# The authors' code reads the mask id from config.json with this default: an unused embedding row
# past the stock Qwen3 tokenizer's last id (151668). Used only for the real Qwen id layout.
AUTHORS_MASK_TOKEN_ID = 151671
QWEN_LAYOUT_IDS = {"<|endoftext|>": 151643, "<|im_end|>": 151645}


@dataclass(frozen=True)
class DiffusionConfig:
    """Decoding settings plus the token ids they need, as resolved for one checkpoint."""

    settings: DecodingSettings
    eos_token_id: int
    mask_token_id: int | None          # None: an AR checkpoint not yet converted
    banned_token_ids: tuple[int, ...]  # never emitted: MASK, specials except EOS, rows past the tokenizer
    vocab_size: int                    # LM head width
    # setting name (and "mask_token_id") -> where its value came from (SOURCE_* or a format's default)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def block_size(self) -> int:
        return self.settings.block_size

    @classmethod
    def resolve(cls, checkpoint_dir: str | Path | None, tokenizer, model_config,
                overrides: Mapping[str, Any] | None = None, *,
                checkpoint_format: str = "qwen3_vl") -> "DiffusionConfig":
        """One precedence rule for every entry point: an explicit user setting (``overrides``, None =
        unset) > the checkpoint's ``diffusion_config.json`` > the checkpoint format's default
        (:data:`FORMAT_DEFAULTS`) > the package default. Token ids come from the checkpoint."""
        stored = read_diffusion_file(checkpoint_dir) if checkpoint_dir is not None else {}
        from_file = dict(stored.get("decoding", {}))
        refuse_unknown(from_file, DECODING_FIELDS, f"{DIFFUSION_CONFIG_FILE}: unknown decoding key(s)")
        if "block_size" in stored:
            from_file["block_size"] = stored["block_size"]
        if checkpoint_format not in FORMAT_DEFAULTS:
            raise ConfigError(f"checkpoint format {checkpoint_format!r} is not one of {', '.join(FORMAT_DEFAULTS)}")
        format_source, format_values = FORMAT_DEFAULTS[checkpoint_format]
        user = {k: v for k, v in (overrides or {}).items() if v is not None}
        refuse_unknown(user, DECODING_FIELDS, "unknown decoding setting(s):")
        layers = [(SOURCE_USER, user)] + ([(SOURCE_FILE, from_file)] if stored else [(format_source, format_values)])
        merged: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name in DECODING_FIELDS:
            for source, values in layers:
                if name in values:
                    merged[name], sources[name] = values[name], source
                    break
            else:
                sources[name] = format_source if not stored else SOURCE_DEFAULT
        try:
            settings = DecodingSettings().replace(**merged)
        except ConfigError as exc:
            culprit = next((n for n in merged if str(exc).startswith(n + ":")), None)
            if culprit is not None and sources[culprit] == SOURCE_FILE:
                raise ConfigError(f"{Path(checkpoint_dir) / DIFFUSION_CONFIG_FILE}: {exc}") from None
            raise

        trained = from_file.get("block_size")
        if sources["block_size"] == SOURCE_USER and trained is not None and trained != settings.block_size:
            # a decoder run at another block size than trained degrades: say so
            log.warning("block_size %d differs from the block size %s the checkpoint was trained with (%s)",
                        settings.block_size, trained, DIFFUSION_CONFIG_FILE)
        warn_if_partial_last_block(settings)

        text_config = getattr(model_config, "text_config", model_config)
        vocab_size = int(text_config.vocab_size)
        eos_id = stored.get("eos_token_id")
        if eos_id is None:
            eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
            if eos_id is None or eos_id == tokenizer.unk_token_id:
                eos_id = tokenizer.eos_token_id
        if eos_id is None:
            raise ConfigError(f"cannot find the EOS token {EOS_TOKEN!r} in the tokenizer")
        mask_id, sources["mask_token_id"] = _resolve_mask_id(stored, tokenizer, model_config, vocab_size,
                                                             needed=settings.block_size > 1)
        if settings.block_size > 1 and mask_id is None:
            raise ConfigError(
                f"block_size: {settings.block_size} needs a mask token, and this checkpoint has none "
                f"(no mask_token_id in config.json or {DIFFUSION_CONFIG_FILE}, no {MASK_TOKEN} in the tokenizer); "
                "convert it first with `wam-diff2 convert`, or use --block-size 1")
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
                   vocab_size=vocab_size, sources=sources)

    def with_settings(self, **overrides: Any) -> "DiffusionConfig":
        overrides = {k: v for k, v in overrides.items() if v is not None}
        settings = self.settings.replace(**overrides)
        if settings.block_size > 1 and self.mask_token_id is None:
            raise ConfigError("block_size: > 1 needs a mask token; convert the checkpoint first")
        changed = {k: SOURCE_USER for k, v in overrides.items() if v != getattr(self.settings, k)}
        if {"block_size", "max_new_tokens"} & set(changed):
            warn_if_partial_last_block(settings)
        return dataclasses.replace(self, settings=settings, sources={**self.sources, **changed})

    def describe(self) -> str:
        """One line: every setting with where it came from (logged once at load by every entry point)."""
        by_source: dict[str, list[str]] = {}
        for name in DECODING_FIELDS:
            by_source.setdefault(self.sources.get(name, SOURCE_DEFAULT), []).append(
                f"{name}={getattr(self.settings, name)}")
        if self.mask_token_id is not None:
            by_source.setdefault(self.sources.get("mask_token_id", SOURCE_DEFAULT), []).append(
                f"mask_token_id={self.mask_token_id}")
        return "; ".join(f"{', '.join(items)} (from {source})" for source, items in by_source.items())


def warn_if_partial_last_block(settings: DecodingSettings) -> None:
    """A budget that is not whole blocks: the decoder denoises the whole last block, then cuts it."""
    block, budget = settings.block_size, settings.max_new_tokens
    if block > 1 and budget % block:
        log.warning("max_new_tokens %d is not a multiple of block_size %d: the last block is decoded whole (%d "
                    "tokens) and cut to %d, so an answer that reaches it is cut mid-block", budget, block, block,
                    budget % block)


def _resolve_mask_id(stored: Mapping[str, Any], tokenizer, model_config, vocab_size: int,
                     needed: bool) -> tuple[int | None, str]:
    """The MASK id and its source: config.json ``mask_token_id`` (the authors' field) > our settings
    file > ``<|mask|>`` in the tokenizer > the authors' fixed row on the real Qwen id layout."""
    in_config = getattr(model_config, "mask_token_id", None)
    if in_config is None:
        in_config = getattr(getattr(model_config, "text_config", None), "mask_token_id", None)
    in_file = stored.get("mask_token_id")
    if in_config is not None:
        if in_file is not None and int(in_file) != int(in_config):
            log.warning("config.json mask_token_id %s and %s mask_token_id %s differ: using config.json's "
                        "(the id the model was trained with)", in_config, DIFFUSION_CONFIG_FILE, in_file)
        return int(in_config), "config.json"
    if in_file is not None:
        return int(in_file), SOURCE_FILE
    if MASK_TOKEN in tokenizer.get_vocab():
        return int(tokenizer.convert_tokens_to_ids(MASK_TOKEN)), "tokenizer"
    qwen_layout = all(tokenizer.convert_tokens_to_ids(t) == i for t, i in QWEN_LAYOUT_IDS.items())
    if needed and qwen_layout and len(tokenizer) <= AUTHORS_MASK_TOKEN_ID < vocab_size:
        log.warning("no mask_token_id in config.json, no %s, no %s in the tokenizer: assuming the authors' "
                    "fixed mask id %d (the real Qwen id layout, an unused embedding row)",
                    DIFFUSION_CONFIG_FILE, MASK_TOKEN, AUTHORS_MASK_TOKEN_ID)
        return AUTHORS_MASK_TOKEN_ID, "the authors' fixed id on the Qwen id layout"
    return None, SOURCE_DEFAULT


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
    # camera: camera_rig.py; quantization: a quantized checkpoint's method (model/quantization.py)
    allowed = {"block_size", "mask_token_id", "eos_token_id", "decoding", "format_version", "camera", "quantization"}
    refuse_unknown(data, allowed, f"{path}: unknown key(s)")
    return data


def diffusion_file_payload(*, block_size: int, mask_token_id: int | None, eos_token_id: int,
                           decoding: DecodingSettings | None = None, camera: Any = None) -> dict:
    """What diffusion_config.json holds (decoding defaults minus block_size; no mask id when None; ``camera``: the
    ``camera_rig.CameraRig`` the model was trained with, when known)."""
    return {
        "format_version": 1,
        "block_size": int(block_size),
        **({} if mask_token_id is None else {"mask_token_id": int(mask_token_id)}),
        "eos_token_id": int(eos_token_id),
        "decoding": {k: v for k, v in dataclasses.asdict(decoding or DecodingSettings()).items() if k != "block_size"},
        **({"camera": dataclasses.asdict(camera)} if camera is not None else {}),
    }


def write_diffusion_file(checkpoint_dir: str | Path, **payload: Any) -> Path:
    """Write :func:`diffusion_file_payload` (``payload``: its arguments) beside a checkpoint."""
    path = Path(checkpoint_dir) / DIFFUSION_CONFIG_FILE
    path.write_text(json.dumps(diffusion_file_payload(**payload), indent=2) + "\n")
    return path
