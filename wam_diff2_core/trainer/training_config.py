"""Training settings: one dataclass per YAML section, the only place their defaults live.

The defaults are the paper's Stage I settings (training/README.md, Settings). A shipped YAML
sets only what its stage changes; ``wam-diff2 train --config X --print-config`` shows the
resolved whole. Command-line overrides use the YAML's dotted names:

    cfg = load_training_config("training/block4.yaml", ["--optim.lr", "1e-5", "--train.epochs=1"])

An unknown section or key is a :class:`ConfigError` that names it.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..config import DEVICES, FLOAT_DTYPES, ConfigError, check_value
from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS, ALLOW_ABSOLUTE_IMAGE_PATHS_HELP
from ..images import ImageLimits
from ..model.prompt_encoding import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
from ..utils.fields import setting
from .losses import KD_LOSSES

RECIPES = ("finetune", "distill", "vision")
ON_ERROR = ("skip", "fail")
MIXED_PRECISION = ("auto", "bf16", "no")
DTYPES = (*FLOAT_DTYPES, "auto")
_IMAGE_LIMITS = {f.name: f for f in dataclasses.fields(ImageLimits)}   # the image-size guard's defaults


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with only true/false as booleans (YAML 1.2): ``mixed_precision: no`` stays the string "no"."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


@dataclass
class ModelSection:
    path: str = setting("", "checkpoint directory to start from (Hugging Face layout)", required=True)
    dtype: str = setting("float32", "dtype the trained weights are kept in (autocast computes in bf16)",
                         choices=DTYPES)
    attn_implementation: str = setting("sdpa", "transformers attention backend (needs 4-D boolean masks)",
                                       choices=("sdpa", "eager"))
    activation_checkpointing: bool = setting(False, "recompute decoder layers in backward to save memory")
    freeze_vision_tower: bool = setting(False, "keep the vision tower fixed (the merger still trains)")


@dataclass
class DataSection:
    train_file: str = setting("", "JSON list or JSONL in the authors' sample format", required=True)
    data_root: str = setting(".", "image paths in the samples are relative to this directory")
    allow_absolute_image_paths: bool = setting(ALLOW_ABSOLUTE_IMAGE_PATHS, ALLOW_ABSOLUTE_IMAGE_PATHS_HELP)
    mix: list[str] = setting([], "more sample files trained on with train_file, each `FILE` or `FILE*N` (its samples "
                                 "N times); image paths relative to each FILE's directory")
    min_pixels: int = setting(DEFAULT_MIN_PIXELS, "pixel budget: smallest image area after resizing", low=1)
    max_pixels: int = setting(DEFAULT_MAX_PIXELS, "pixel budget: largest image area after resizing", low=1)
    max_decoded_pixels: int = setting(_IMAGE_LIMITS["max_decoded_pixels"].default,
                                      _IMAGE_LIMITS["max_decoded_pixels"].metadata["help"], low=1)
    max_decoded_bytes: int = setting(_IMAGE_LIMITS["max_decoded_bytes"].default,
                                     _IMAGE_LIMITS["max_decoded_bytes"].metadata["help"], low=1)
    max_length: int = setting(0, "longest prefix + 2 x padded response in tokens; 0 = no limit", low=0)
    on_error: str = setting("skip", "a malformed record or sample, or a missing, unreadable or too large image: "
                                    "skip it (reported with its id and line) or fail", choices=ON_ERROR)
    shuffle: bool = setting(True, "reshuffle the samples every epoch (seeded)")
    num_workers: int = setting(0, "DataLoader worker processes that read images and tokenise", low=0, high=64)


@dataclass
class DiffusionSection:
    block_size: int = setting(32, "training block size B; 1 = causal next-token (AR) training", low=1, high=1024)
    min_mask_ratio: float = setting(0.001, "u_i ~ U(0,1) is clamped to [this, 1] before t_i = (u_i + i) / N",
                                    low=0.0, high=1.0)


@dataclass
class OptimSection:
    lr: float = setting(4e-5, "learning rate of the language model and LM head", low=0.0, high=1.0)
    merger_lr: float = setting(4e-5, "learning rate of the vision merger and DeepStack mergers", low=0.0, high=1.0)
    vision_lr: float = setting(2e-6, "learning rate of the vision tower", low=0.0, high=1.0)
    weight_decay: float = setting(0.05, "AdamW decay (never on norms, biases, embeddings, 1-D tensors)",
                                  low=0.0, high=10.0)
    beta1: float = setting(0.9, "AdamW beta1", low=0.0, high=1.0)
    beta2: float = setting(0.95, "AdamW beta2", low=0.0, high=1.0)
    eps: float = setting(1e-8, "AdamW epsilon", low=0.0, high=1.0)
    warmup_max_steps: int = setting(1000, "warm-up lasts min(this, warmup_fraction x total steps)", low=0)
    warmup_fraction: float = setting(0.1, "see warmup_max_steps", low=0.0, high=1.0)
    warmup_start_factor: float = setting(0.1, "warm-up starts at this x lr", low=0.0, high=1.0)
    final_lr_factor: float = setting(0.01, "the cosine decays to this x lr", low=0.0, high=1.0)
    max_grad_norm: float = setting(1.0, "gradient clipping (global L2 norm); 0 = off", low=0.0)


@dataclass
class TrainSection:
    epochs: float = setting(5.0, "passes over the data (fractions allowed)", low=0.0)
    max_steps: int = setting(0, "optimizer steps; 0 = derived from epochs", low=0)
    global_batch_size: int = setting(128, "samples per optimizer step, over all processes", low=1)
    micro_batch_size: int = setting(1, "samples per forward on one process (gradients are accumulated)", low=1)
    seed: int = setting(42, "data order, noise and initialisation seed", low=0)
    device: str = setting("auto", "auto picks cuda, then npu, then cpu", choices=DEVICES)
    mixed_precision: str = setting("auto", "bf16 autocast; auto = bf16 where the device supports it",
                                   choices=MIXED_PRECISION)
    tf32: bool = setting(False, "CUDA: float32 matrix products outside autocast in TF32 (torch's matmul "
                                "fp32_precision); ignored on other devices")
    time_limit_s: float = setting(0.0, "stop after this many seconds of training steps in this process (setup and "
                                       "saving not counted) and write final/ with the steps done, the schedule cut "
                                       "short; 0 = no limit (a curriculum: each stage its own)", low=0.0)
    find_unused_parameters: bool = setting(False, "DDP: set when some parameters get no gradient "
                                                  "(for example text-only batches)")


@dataclass
class LossSection:
    chunk_size: int = setting(1024, "positions per LM-head chunk (memory: chunk x vocab logits)", low=1)


@dataclass
class DistillSection:
    teacher_path: str = setting("", "teacher checkpoint directory (recipe: distill)")
    teacher_block_size: int = setting(0, "the teacher's own block size for its mask; 0 = the one stored with "
                                         "the teacher checkpoint; 1 = an AR teacher (next-token view)",
                                      low=0, high=1024)
    teacher_dtype: str = setting("auto", "teacher weights dtype; auto = bf16 on accelerators, float32 on cpu",
                                 choices=DTYPES)
    loss: str = setting("jsd", "divergence between student and teacher", choices=KD_LOSSES)
    beta: float = setting(0.5, "JSD mixture weight of the teacher: M = beta Q + (1 - beta) P", low=0.0, high=1.0)
    temperature: float = setting(1.0, "softmax temperature tau of both models (the loss is x tau^2)", low=1e-3)
    kd_ratio: float = setting(1.0, "total = (1 - kd_ratio) CE + kd_ratio KD", low=0.0, high=1.0)
    on_policy: bool = setting(False, "regenerate the answers with the student's decoder and noise them again")
    generate_interval: int = setting(2, "on-policy: regenerate every this many optimizer steps", low=1)
    max_new_tokens: int = setting(0, "on-policy: answer length limit; 0 = the micro-batch's longest "
                                     "ground-truth answer rounded up to a block", low=0)
    overlap_k: int = setting(5, "log rho_K, the share of the teacher's top-K found in the student's top-K",
                             low=1, high=1000)


@dataclass
class OutputSection:
    dir: str = setting("", "run directory: metrics.jsonl, checkpoints/, final/", required=True)
    save_every_steps: int = setting(500, "write a resumable checkpoint every this many steps; 0 = only at the end",
                                    low=0)
    keep_last: int = setting(2, "resumable checkpoints kept (older ones are deleted)", low=1)
    log_every_steps: int = setting(1, "append a metrics line every this many steps", low=1)


@dataclass
class CurriculumSection:
    block_sizes: list[int] = setting([], "run one finetune stage per block size, each starting from the previous "
                                    "stage's final/; empty = a single stage with diffusion.block_size", low=1)


@dataclass
class TrainingConfig:
    recipe: str = setting("finetune", "finetune (one block size, or a curriculum), distill, or vision (the vision "
                          "tower's warm-up on grounding samples: recipes/vision.py)", choices=RECIPES)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    diffusion: DiffusionSection = field(default_factory=DiffusionSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    loss: LossSection = field(default_factory=LossSection)
    distill: DistillSection = field(default_factory=DistillSection)
    output: OutputSection = field(default_factory=OutputSection)
    curriculum: CurriculumSection = field(default_factory=CurriculumSection)

    def replace(self, **dotted: Any) -> "TrainingConfig":
        """A copy with ``{"section.key": value}`` applied and validated."""
        data = dataclasses.asdict(self)
        for key, value in dotted.items():
            _assign(data, key, value)
        return config_from_dict(data)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(TrainingConfig)
                             if f.default_factory is not dataclasses.MISSING}


def _check(where: str, f: dataclasses.Field, value: Any, expected: type) -> Any:
    meta = f.metadata
    if expected is float and isinstance(value, str):
        try:  # YAML 1.1 reads 4e-5 (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if typing.get_origin(expected) is list:
        item = typing.get_args(expected)[0]
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: expected a list of {item.__name__}, got {value!r}")
        return [check_value(f"{where}[{i}]", v, item, meta) for i, v in enumerate(value)]
    return check_value(where, value, expected, meta)


def _build(cls: type, values: Any, section: str = ""):
    """``cls`` (the config, or its ``section``) from YAML data: a key it does not have is an error naming it, each
    value is checked against its field, a section's values by that section's dataclass."""
    where = f"{section}." if section else ""
    if values is None and section:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{section}: expected a mapping of settings, got {values!r}" if section
                          else f"a training config is a mapping of sections, got {type(values).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(f"unknown setting {where}{key} (known{' in ' + section if section else ''}: "
                              f"{', '.join(known)})")
    return cls(**{k: _build(SECTIONS[k], v, k) if not section and k in SECTIONS
                  else _check(where + k, known[k], v, typing.get_type_hints(cls)[k]) for k, v in values.items()})


def config_from_dict(data: Mapping[str, Any]) -> TrainingConfig:
    """Build and validate a config from nested YAML data; unknown keys are errors naming them."""
    cfg = _build(TrainingConfig, data)
    _check_consistency(cfg)
    return cfg


def parse_mix(entries: Sequence[str]) -> list[tuple[Path, int]]:
    """``data.mix`` entries ``FILE`` / ``FILE*N`` -> (file, times); ConfigError names a bad one."""
    out = []
    for i, entry in enumerate(entries):
        path, _, times = entry.rpartition("*") if "*" in entry else (entry, "", "1")
        if not path or not times.isdigit() or int(times) < 1:
            raise ConfigError(f"data.mix[{i}]: {entry!r} is not FILE or FILE*N with N >= 1")
        out.append((Path(path), int(times)))
    return out


def _check_consistency(cfg: TrainingConfig) -> None:
    parse_mix(cfg.data.mix)
    if cfg.data.min_pixels > cfg.data.max_pixels:
        raise ConfigError(f"data.min_pixels: {cfg.data.min_pixels} is above data.max_pixels {cfg.data.max_pixels}")
    if cfg.train.global_batch_size % cfg.train.micro_batch_size:
        raise ConfigError(f"train.global_batch_size: {cfg.train.global_batch_size} is not a multiple of "
                          f"train.micro_batch_size {cfg.train.micro_batch_size}")
    if cfg.recipe != "finetune" and cfg.curriculum.block_sizes:
        raise ConfigError(f"curriculum.block_sizes: a curriculum chains finetune stages; recipe is {cfg.recipe}")
    if cfg.recipe == "distill":
        if cfg.diffusion.block_size == 1:
            raise ConfigError("diffusion.block_size: distillation trains a diffusion student (B >= 2)")
        if not 0.0 < cfg.distill.beta < 1.0 and cfg.distill.loss == "jsd":
            raise ConfigError(f"distill.beta: {cfg.distill.beta} must be strictly between 0 and 1 for jsd")


def check_required(cfg: TrainingConfig) -> None:
    """Settings without a usable default must be given before a run starts."""
    for name, cls in SECTIONS.items():
        section = getattr(cfg, name)
        for f in dataclasses.fields(cls):
            if f.metadata.get("required") and getattr(section, f.name) in ("", None):
                raise ConfigError(f"{name}.{f.name}: required ({f.metadata['help']})")
    if cfg.recipe == "distill" and not cfg.distill.teacher_path:
        raise ConfigError("distill.teacher_path: required by recipe distill")


def _assign(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) == 1:
        if parts[0] in SECTIONS:
            raise ConfigError(f"{dotted}: is a section; set one of its keys as {dotted}.KEY")
        data[parts[0]] = value
        return
    if len(parts) != 2:
        raise ConfigError(f"unknown setting {dotted} (settings are SECTION.KEY)")
    section, key = parts
    if section not in SECTIONS:
        raise ConfigError(f"unknown setting {dotted} (sections: {', '.join(SECTIONS)})")
    if data.get(section) is None:
        data[section] = {}
    data[section][key] = value


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """``--section.key value`` / ``--section.key=value`` pairs; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    args = iter(args)
    for arg in args:
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"unexpected argument {arg!r} (overrides are --section.key value)")
        key, raw = arg[2:].split("=", 1) if "=" in arg else (arg[2:], next(args, None))
        if raw is None:
            raise ConfigError(f"{arg}: missing a value")
        try:
            out[key] = yaml.load(raw, Loader=_Yaml12Loader) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse value {raw!r} ({exc})") from exc
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.load(path.read_text(), Loader=_Yaml12Loader)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    return data or {}


def load_training_config(path: str | Path | None, overrides: Sequence[str] | Mapping[str, Any] = ()) -> TrainingConfig:
    """YAML file (may be None: all defaults) < command-line overrides; validated."""
    data = read_yaml(path) if path is not None else {}
    if not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    for key, value in overrides.items():
        _assign(data, key, value)
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        if path is not None:
            raise ConfigError(f"{path}: {exc}") from exc
        raise


def dump_yaml(cfg: TrainingConfig) -> str:
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


def settings_table() -> str:
    """The Markdown settings table of training/README.md, every setting's default and help (a test keeps the
    README in sync)."""
    def show(value: Any) -> str:
        if value == "":
            return "required"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"

    lines = ["| setting | default | meaning |", "|---|---|---|"]
    defaults = dataclasses.asdict(TrainingConfig())
    for f in dataclasses.fields(TrainingConfig):
        if f.name in SECTIONS:
            lines += [f"| `{f.name}.{g.name}` | {show(defaults[f.name][g.name])} | {g.metadata['help']} |"
                      for g in dataclasses.fields(SECTIONS[f.name])]
        else:
            lines.append(f"| `{f.name}` | {show(defaults[f.name])} | {f.metadata['help']} |")
    return "\n".join(lines) + "\n"
