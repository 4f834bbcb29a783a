"""What --resume needs beside the weights, without a pickle: safetensors for tensors, JSON for the rest.

    save_trainer_state(checkpoint / TRAINER_STATE, optimizer, scheduler, process_index=0, main=True)
    load_trainer_state(checkpoint / TRAINER_STATE, optimizer, scheduler, process_index=0)

    trainer_state/
      optimizer.safetensors   AdamW's per-parameter tensors (``state.<param index>.<name>``)
      optimizer.json          its parameter groups (learning rates, betas, ...) and non-tensor state
      scheduler.json          the learning-rate scheduler's state_dict
      rng-<process>.safetensors   Python, NumPy, torch CPU and accelerator RNG states of one process

Nothing here unpickles (a pickle planted in a run folder would run code on resume), and
:func:`refuse_pickles` stops a resume from a run folder that holds one at all, naming it.
The data position needs no state: it is the step number (progress.json).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..config import ConfigError

OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
SCHEDULER_JSON = "scheduler.json"
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt", ".joblib")
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")   # pickle protocols 2-5
_ZIP_MAGIC = b"PK\x03\x04"            # torch.save's format: a zip around data.pkl


def rng_file(process_index: int) -> str:
    return f"rng-{process_index}.safetensors"


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, indent=1, allow_nan=True) + "\n"
    except TypeError as e:
        raise TypeError(f"{what}: {e} (trainer state is saved as JSON + safetensors only)") from None


def save_trainer_state(out: Path, optimizer, scheduler, *, process_index: int, main: bool,
                       device: torch.device) -> None:
    """Write this process's part of the resume state into ``out`` (every process must call:
    the main one writes optimizer and scheduler, identical on every process under DDP; each
    writes its own RNG states)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if main:
        state = optimizer.state_dict()
        tensors, other = {}, {}
        for index, values in state["state"].items():
            for name, value in values.items():
                if torch.is_tensor(value):
                    tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
                else:
                    other.setdefault(str(index), {})[name] = value
        save_file(tensors, str(out / OPTIMIZER_TENSORS))
        (out / OPTIMIZER_JSON).write_text(_json_text({"param_groups": state["param_groups"], "state": other},
                                                     "optimizer state"))
        (out / SCHEDULER_JSON).write_text(_json_text(scheduler.state_dict(), "scheduler state"))
    version, mt_state, gauss_next = random.getstate()
    kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    tensors = {"python": torch.tensor(mt_state, dtype=torch.int64),
               "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
               "torch": torch.get_rng_state()}
    if device.type != "cpu":
        for i, rng in enumerate(getattr(torch, device.type).get_rng_state_all()):
            tensors[f"{device.type}.{i}"] = rng.cpu()
    meta = {"python_version": version, "python_gauss_next": gauss_next, "numpy_kind": kind, "numpy_pos": int(np_pos),
            "numpy_has_gauss": int(np_has_gauss), "numpy_cached_gaussian": float(np_cached)}
    save_file(tensors, str(out / rng_file(process_index)), metadata={"rng": json.dumps(meta)})


def load_trainer_state(src: Path, optimizer, scheduler, *, process_index: int, device: torch.device) -> None:
    """Restore what :func:`save_trainer_state` wrote (safetensors and JSON only; nothing is unpickled)."""
    src = Path(src)
    for name in (OPTIMIZER_TENSORS, OPTIMIZER_JSON, SCHEDULER_JSON, rng_file(process_index)):
        if not (src / name).is_file():
            raise ConfigError(f"--resume: {src / name} is missing (a resumed run needs the same number of "
                              "processes, and a checkpoint written by this version)")
    described = json.loads((src / OPTIMIZER_JSON).read_text())
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in load_file(str(src / OPTIMIZER_TENSORS)).items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = tensor
    for index, values in described["state"].items():
        state.setdefault(int(index), {}).update(values)
    groups = described["param_groups"]
    for group, current in zip(groups, optimizer.param_groups):
        for name, value in group.items():           # JSON has no tuples: give back e.g. betas as one
            if isinstance(current.get(name), tuple) and isinstance(value, list):
                group[name] = tuple(value)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    scheduler.load_state_dict(json.loads((src / SCHEDULER_JSON).read_text()))

    with safe_open(str(src / rng_file(process_index)), framework="pt") as f:
        meta = json.loads(f.metadata()["rng"])
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    random.setstate((meta["python_version"], tuple(int(x) for x in tensors["python"].tolist()),
                     meta["python_gauss_next"]))
    np.random.set_state((meta["numpy_kind"], tensors["numpy"].numpy().astype(np.uint32), meta["numpy_pos"],
                         meta["numpy_has_gauss"], meta["numpy_cached_gaussian"]))
    torch.set_rng_state(tensors["torch"])
    if device.type != "cpu":
        count = sum(key.startswith(f"{device.type}.") for key in tensors)
        getattr(torch, device.type).set_rng_state_all([tensors[f"{device.type}.{i}"] for i in range(count)])


def is_pickle(path: Path) -> bool:
    """A file torch.load / pickle.load would unpickle: by its name or by its first bytes (but a
    ``.safetensors`` file, only ever parsed by safetensors, whose header length may start like one)."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    if path.suffix == ".safetensors":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head[:2] in _PICKLE_MAGIC or head == _ZIP_MAGIC


def refuse_pickles(run_dir: Path) -> None:
    """Stop before anything of ``run_dir`` is read if it holds a pickle (none is read either way)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    found = sorted(p for p in run_dir.rglob("*") if p.is_file() and is_pickle(p))
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(f"--resume: {found[0]}{more} is a pickle, which can run code when loaded; this trainer "
                          f"writes and reads none (older versions pickled trainer_state/: such a checkpoint "
                          f"cannot be resumed safely). Remove it, or start a new output.dir")
