"""``implementation: auto`` is the default everywhere and picks the device's fast path; the policy's
warm-up check falls back to the plain decoder when the fast path's tokens diverge."""
from __future__ import annotations

import types

import pytest
import torch

from wam_diff2_core import decoding
from wam_diff2_core.config import FAST_PATH_MIN_AGREEMENT, EngineSettings
from wam_diff2_core.decoding import make_decoder, resolve_engine
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
from wam_diff2_core.policy import DrivingPolicy, describe_engine, token_agreement


def _model_on(device_type, dtype):
    weight = types.SimpleNamespace(device=types.SimpleNamespace(type=device_type), dtype=dtype)
    return types.SimpleNamespace(parameters=lambda: iter([weight]))


@pytest.mark.parametrize("device,dtype,flashinfer,expected", [
    ("cpu", torch.float32, False, "static (sdpa)"),
    ("npu", torch.bfloat16, True, "static (sdpa)"),
    ("cuda", torch.float32, True, "static (sdpa, CUDA graphs)"),          # FlashInfer needs bf16 / fp16
    ("cuda", torch.bfloat16, False, "static (sdpa, CUDA graphs)"),
    ("cuda", torch.bfloat16, True, "static (flashinfer, CUDA graphs)")])
def test_auto_picks_the_fast_path_of_the_device(monkeypatch, device, dtype, flashinfer, expected):
    monkeypatch.setattr(decoding, "_flashinfer_importable", lambda: flashinfer)
    assert describe_engine(resolve_engine(EngineSettings(), _model_on(device, dtype))) == expected
    for chosen in ("plain", "static"):
        engine = EngineSettings(implementation=chosen)
        assert resolve_engine(engine, _model_on(device, dtype)) is engine


def test_auto_is_the_default_of_every_entry_point(tiny_model):
    import argparse

    from wam_diff2_core.cli import common
    parser = argparse.ArgumentParser()
    common.add_engine_arguments(parser)
    assert common.engine_settings(parser.parse_args([])).implementation == "auto"
    assert EngineSettings().implementation == "auto"                          # closed loop, DrivingPolicy
    from wam_diff2_core.params import planner
    assert planner.DEFAULTS["engine.implementation"] == "auto"                # the node's parameter
    assert isinstance(make_decoder(tiny_model.model, tiny_model.config), StaticBlockDiffusionDecoder)
    assert isinstance(DrivingPolicy(tiny_model).decoder, StaticBlockDiffusionDecoder)   # evaluator, node


def test_token_agreement():
    assert token_agreement([[1, 2, 3], []], [[1, 2, 3], []]) == (3, 3, None)
    assert token_agreement([[1, 5, 3, 4]], [[1, 2, 3]]) == (2, 4, (0, 1, 5, 2))
    assert FAST_PATH_MIN_AGREEMENT["float32"] == 1.0


def test_policy_keeps_an_agreeing_fast_path_and_drops_a_diverging_one(tiny_model, monkeypatch):
    policy = DrivingPolicy(tiny_model, tasks=("plan", "detect"))
    fast = policy.decoder
    assert policy.check_fast_path() is None and policy.decoder is fast        # float32: bit-exact
    real = fast.generate

    def perturbed(*args, **kwargs):                                           # one token off
        out = real(*args, **kwargs)
        out.sequences[1][-1:] = [out.sequences[1][-1] + 1] if out.sequences[1] else [7]
        return out
    monkeypatch.setattr(fast, "generate", perturbed)
    message = policy.check_fast_path()
    assert message.startswith("fast path (static (sdpa)) diverges from the plain decoder on the warm-up prompt")
    assert "float32 needs 100%" in message and "first difference in answer 1" in message
    assert isinstance(policy.decoder, BlockDiffusionDecoder) and policy.engine.implementation == "plain"
    assert policy.check_fast_path() is None                                   # plain: nothing to check


def test_a_fast_path_that_fails_here_falls_back_to_plain(tiny_model, monkeypatch):
    policy = DrivingPolicy(tiny_model)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")
    monkeypatch.setattr(policy.decoder, "generate", broken)
    message = policy.check_fast_path()
    assert message.startswith("fast path (static (sdpa)) failed on the warm-up prompt (RuntimeError: no kernel")
    assert isinstance(policy.decoder, BlockDiffusionDecoder)


@pytest.mark.parametrize("max_new_tokens", [256, 40])
def test_start_up_decodes_stop_after_a_few_blocks(tiny_model, monkeypatch, max_new_tokens):
    """A random checkpoint never stops early, so the fast-path check (fast and plain) and the
    warm-up each decoded the whole answer budget, and configure took minutes. Each start-up decode now
    stops after STARTUP_BLOCKS blocks (or at the budget, when that is shorter), whichever decoder runs it."""
    from wam_diff2_core.policy import STARTUP_BLOCKS

    policy = DrivingPolicy(tiny_model)
    monkeypatch.setattr(tiny_model, "config", tiny_model.config.with_settings(max_new_tokens=max_new_tokens))
    block = policy.settings.block_size
    budgets, lengths = [], []
    for cls in (StaticBlockDiffusionDecoder, BlockDiffusionDecoder):
        real = cls.generate

        def recording(self, inputs, settings, *args, _real=real, **kwargs):
            budgets.append(settings.max_new_tokens)
            out = _real(self, inputs, settings, *args, **kwargs)
            lengths.extend(len(s) for s in out.sequences)
            return out
        monkeypatch.setattr(cls, "generate", recording)
    assert policy.check_fast_path() is None
    policy.warmup()
    expected = min(max_new_tokens, STARTUP_BLOCKS * block)
    assert budgets == [expected] * 3 and STARTUP_BLOCKS * block < 256      # fast, plain, warm-up
    assert max(lengths) <= expected and policy.settings.max_new_tokens == max_new_tokens
