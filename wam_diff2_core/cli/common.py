"""Argument groups shared by subcommands, derived from the single sources of defaults; the
benchmarks' table printing."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import platform
from pathlib import Path
from typing import Any

from ..config import (DECODING_FIELDS, DEFAULT_PARSE_RETRY, DEVICES, ENGINE_FIELDS, FLOAT_DTYPES, PARSE_RETRIES,
                      ConfigError, EngineSettings, add_threads_argument, field_type)


@contextlib.contextmanager
def config_errors(prefix: str = ""):
    """A ValueError raised inside is the command's ConfigError: ``prefix`` and its message, no traceback."""
    try:
        yield
    except ValueError as exc:
        raise ConfigError(prefix + str(exc)) from None


def _field_flag(parser, f: dataclasses.Field, help_suffix: str, dest: str = "", **kwargs) -> None:
    """The flag ``--dest`` (default: the field's name) for settings field ``f``: its type (a switch for a bool),
    choices and help (+ ``help_suffix``); ``kwargs`` (default) override the field's default."""
    if field_type(f) is bool:
        kwargs.update(action=argparse.BooleanOptionalAction)
    else:
        kwargs.update(type=field_type(f), choices=f.metadata["choices"])
    dest = dest or f.name
    parser.add_argument("--" + dest.replace("_", "-"), **{"dest": dest, "default": f.default, **kwargs},
                        help=f.metadata["help"] + help_suffix)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """``--block-size`` ... ``--max-new-tokens``: one flag per DecodingSettings field, None unless given (so the
    checkpoint's diffusion_config.json applies)."""
    group = parser.add_argument_group("decoding (default: the checkpoint's diffusion_config.json, then "
                                      "the paper's Block-32 settings)")
    for f in DECODING_FIELDS.values():
        _field_flag(group, f, f" (default {f.default!r})", default=None)


def decoding_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in DECODING_FIELDS if getattr(args, name, None) is not None}


def driving_policy(args: argparse.Namespace, engine: EngineSettings, **kwargs):
    """The planner node's policy from the model (:func:`add_model_arguments`), decoding and ``--parse-retry``
    options; ``kwargs``: DrivingPolicy.from_checkpoint's others."""
    from ..policy import DrivingPolicy

    if args.parse_retry is not None:
        kwargs["parse_retry"] = args.parse_retry
    return DrivingPolicy.from_checkpoint(args.model, device=args.device, dtype=args.dtype,
                                         overrides=decoding_overrides(args), min_pixels=args.min_pixels,
                                         max_pixels=args.max_pixels, engine=engine, **kwargs)


def add_parse_retry_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parse-retry", default=None, choices=PARSE_RETRIES,
                        help="decode an answer that does not parse once more with this remasking strategy before "
                             f"it counts as invalid; none = never (default {DEFAULT_PARSE_RETRY})")


# the candidate flags: CandidateSettings field -> flag dest (its help and default: the planner's candidates.* parameter)
CANDIDATE_DESTS = {"count": "candidates", "temperature": "candidate_temperature", "top_p": "candidate_top_p",
                   "seed": "candidate_seed", "lane_width_m": "lane_width_m",
                   "progress_reference": "candidate_progress_reference"}


def add_candidate_arguments(parser) -> None:
    """The planner's ``candidates.*`` as flags (:data:`CANDIDATE_DESTS`), for the commands that decode plan
    candidates (``bench --data`` prints PDMS without and with selection, paired; ``closed-loop``)."""
    from ..candidate_selection import CandidateSettings

    for f in dataclasses.fields(CandidateSettings):
        _field_flag(parser, f, f" (the planner's candidates.{f.name}; default {f.default})", CANDIDATE_DESTS[f.name])


def candidate_settings(args: argparse.Namespace):
    """The candidate options as CandidateSettings, None for ``--candidates 1`` (no selection); ConfigError
    naming the option that is out of range."""
    from ..candidate_selection import CandidateSettings

    if args.candidates == 1:
        return None
    with config_errors("--candidates / --candidate-*: "):
        return CandidateSettings(**{name: getattr(args, dest) for name, dest in CANDIDATE_DESTS.items()})


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--implementation``, ``--cuda-graphs`` ...: one flag per EngineSettings field (how the model runs)."""
    group = parser.add_argument_group("decoding engine (the tokens do not depend on these, except --quantization)")
    add_threads_argument(group)
    add_quantization_argument(group)
    for name, f in ENGINE_FIELDS.items():
        if name not in ("cpu_threads", "quantization"):
            _field_flag(group, f, "" if field_type(f) is bool else f" (default {f.default!r})")


def add_quantization_argument(parser) -> None:
    """``--quantization``: the planner node's ``engine.quantization``, for every command that runs a model."""
    f = ENGINE_FIELDS["quantization"]
    _field_flag(parser, f, f" (default {f.default})")


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's threads from ``--threads`` (0: the default rule), made concrete in ``args``."""
    from ..config import apply_cpu_threads

    args.cpu_threads = apply_cpu_threads(args.cpu_threads)
    return args.cpu_threads


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    return EngineSettings().replace(**{name: getattr(args, name) for name in ENGINE_FIELDS})


def add_image_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-decoded-pixels`` / ``--max-decoded-bytes``: the image-size guard (defaults: ImageLimits)."""
    from ..images import ImageLimits

    for f in dataclasses.fields(ImageLimits):
        _field_flag(parser, f, f" (default {f.default})", default=None)


def image_limits(args: argparse.Namespace):
    """The ImageLimits the flags give (unset flags: the defaults); ValueError names the field."""
    from ..images import ImageLimits

    return ImageLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ImageLimits)
                          if getattr(args, f.name, None) is not None})


def add_sample_path_arguments(parser) -> None:
    """``--data-root`` and ``--allow-absolute-image-paths``: where a samples file's image paths are read."""
    from ..data.samples import ALLOW_ABSOLUTE_IMAGE_PATHS, ALLOW_ABSOLUTE_IMAGE_PATHS_HELP

    parser.add_argument("--data-root", default=None,
                        help="image paths are relative to this (default: the samples file's folder)")
    parser.add_argument("--allow-absolute-image-paths", action=argparse.BooleanOptionalAction,
                        default=ALLOW_ABSOLUTE_IMAGE_PATHS, help=ALLOW_ABSOLUTE_IMAGE_PATHS_HELP)


def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--model", required=required, help="checkpoint directory (Qwen3-VL or WAM-Diff2), or a "
                        "Hugging Face hub id (ORG/NAME) already in the local cache")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--dtype", default="auto", choices=("auto", *FLOAT_DTYPES))
    parser.add_argument("--min-pixels", type=int, default=None, help="image pixel budget (default: the processor's)")
    parser.add_argument("--max-pixels", type=int, default=None)


def hardware_name(device) -> str:
    """The model name of ``device`` (a torch.device), for a benchmark's hardware line: the GPU's, else the
    CPU's (/proc/cpuinfo)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``rows`` as an aligned text table; ``columns``: (key, title, float format); None prints as "-"."""
    header = [title for _, title, _ in columns]
    body = [["-" if r[key] is None else format(r[key], fmt) if isinstance(r[key], float) else str(r[key])
             for key, _, fmt in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
