"""Shared fixtures: tiny checkpoints built from code once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tiny models' matrices are small: one thread is several times faster than two on
    the 2-core CI machines (and far faster when they are shared). Subprocesses get the same
    through OMP_NUM_THREADS=1 (Makefile)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def constraint_pins():
    """A reader of a pip constraints file: ``path -> {name (lower case): version}`` of its ``name==version``
    lines (comments and blank lines skipped)."""
    def read(path) -> dict[str, str]:
        out = {}
        for line in Path(path).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                name, version = line.split("==")
                out[name.lower()] = version
        return out
    return read


@pytest.fixture(scope="session")
def ament_packages() -> frozenset[str]:
    """The ROS packages of this machine's ament index (every prefix of AMENT_PREFIX_PATH): what the import
    checks count as ROS packages."""
    names = set()
    for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)):
        index = Path(prefix) / "share" / "ament_index" / "resource_index" / "packages"
        if index.is_dir():
            names.update(p.name for p in index.iterdir())
    return frozenset(names)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random tiny Qwen3-VL block-diffusion checkpoint directory (seed 0, block size 32)."""
    from wam_diff2_core.model.tiny import build_tiny_checkpoint
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """The tiny checkpoint loaded on CPU in float32 (shared: do not modify its weights)."""
    from wam_diff2_core.model.checkpoint import load_checkpoint
    return load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32")


@pytest.fixture
def rgb_frame():
    """A deterministic 90 x 160 RGB frame (uint8, H x W x 3)."""
    rng = np.random.default_rng(0)
    return (rng.random((90, 160, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="session")
def tiny_ar_checkpoint(tmp_path_factory):
    """A random tiny stock Qwen3-VL checkpoint (seed 0, no diffusion settings): decodes with B = 1 (AR),
    like models/wam-diff2-demo-ar."""
    from wam_diff2_core.model.tiny import build_tiny_checkpoint
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_ar") / "ckpt", seed=0, diffusion=False)


@pytest.fixture(scope="session")
def box_memorizer(tmp_path_factory):
    """(checkpoint, samples file): a tiny AR checkpoint trained to answer one demo-world grounding sample
    with its boxes, and that sample (test/support/detector.py)."""
    from test.support.detector import train_box_memorizer
    return train_box_memorizer(tmp_path_factory.mktemp("box_memorizer"))


@pytest.fixture(scope="session")
def block32_box_memorizer(box_memorizer, tmp_path_factory):
    """(checkpoint, samples file): the box memorizer converted and trained to answer at B = 32 in one
    denoising step per block (test/support/detector.py)."""
    from test.support.detector import train_block32_memorizer
    ar, samples = box_memorizer
    return train_block32_memorizer(ar, samples, tmp_path_factory.mktemp("block32_box_memorizer")), samples
