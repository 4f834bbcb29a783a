"""A FlashInfer that is installed but does not import (a missing dependency, a library for another CUDA)
is never auto-picked, and asking for it names the import error: the installed package below is real
Python that fails at import, as such an install does."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from wam_diff2_core import decoding
from wam_diff2_core.config import ConfigError, EngineSettings
from wam_diff2_core.decoding import attention_flashinfer, resolve_engine


@pytest.fixture
def broken_flashinfer(tmp_path, monkeypatch):
    package = tmp_path / "flashinfer"
    package.mkdir()
    (package / "__init__.py").write_text("import tvm_ffi_not_here  # the dependency the GPU image lacks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    attention_flashinfer.flashinfer_problem.cache_clear()
    yield
    attention_flashinfer.flashinfer_problem.cache_clear()


def test_a_flashinfer_that_does_not_import_is_not_picked(broken_flashinfer):
    problem = attention_flashinfer.flashinfer_problem()
    assert "installed but does not import" in problem and "tvm_ffi_not_here" in problem
    weight = torch.zeros(1, dtype=torch.bfloat16)
    model = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(device=torch.device("cuda"),
                                                                                  dtype=weight.dtype)]))
    assert not decoding._flashinfer_importable()
    assert resolve_engine(EngineSettings(), model).attention_backend == "sdpa"
    with pytest.raises(ConfigError, match="does not import .*tvm_ffi_not_here"):
        attention_flashinfer.import_flashinfer()


def test_a_missing_flashinfer_says_it_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)            # import raises ImportError(name=flashinfer)
    attention_flashinfer.flashinfer_problem.cache_clear()
    try:
        assert attention_flashinfer.flashinfer_problem().startswith("flashinfer is not installed")
    finally:
        attention_flashinfer.flashinfer_problem.cache_clear()
