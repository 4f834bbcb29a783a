"""engine.compile_forward (the static decoder's step forward through torch.compile, fullgraph, Inductor)
and the SDPA kernels pinned around every static step (attention.SDPA_STEP_BACKENDS).

One tiny case only: Inductor generates C++ for each step shape and builds it with gcc, about 25 s a shape
on CI's 2 shared cores (measured cold: 51-60 s for two shapes). So the case has one shape: Block-8 with the
commit as its own forward (fused_commit off: the commit has the denoise step's [1, 8] shape), three blocks.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend

from test.support.decoder_prompts import encode
from wam_diff2_core.config import ConfigError, EngineSettings
from wam_diff2_core.decoding import attention as attention_module
from wam_diff2_core.decoding import make_decoder
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
from wam_diff2_core.decoding.step import forward_step

STATIC = EngineSettings(implementation="static")
# one batch bucket, a 128-slot cache, commits as [1, 8] forwards: one compiled graph serves every forward
# of the compiled and of the emulated-graph decoder
COMPILED = STATIC.replace(compile_forward=True, max_context_tokens=128, max_graph_batch=1, fused_commit=False)


def _settings(cfg):
    return cfg.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7, max_new_tokens=24)


def test_the_step_forward_traces_as_one_graph(tiny_model):
    """What compile_forward compiles (step.forward_step) is one Dynamo graph with no break (explain runs
    no code generation); the compiled path itself uses fullgraph=True, which raises at a break."""
    cfg = tiny_model.config
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    state = static.begin(encode(tiny_model.processor, [1]), 8, answer_slots=16)
    buf = static.plan_step(state, [(0, 8), (8, 8)])
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(forward_step)(static.text, state.run.cache, static.attention, buf)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()


def test_compiled_forward_gives_the_eager_static_tokens_also_under_emulated_graphs(tiny_model, monkeypatch):
    """float32, Block-8 greedy over three blocks: the compiled forward (no graphs, then inside emulated
    graphs: each replay reruns the compiled forward on the captured buffers) gives the eager static
    decoder's tokens, call after call; every forward went through Inductor's code (one compiled graph, no
    break, no fallback). The SDPA pin is set for CPU here (to CPU's own choice of kernels), so the compiled
    graph traces the pin inside the attention step as it does on CUDA."""
    monkeypatch.setitem(attention_module.SDPA_STEP_BACKENDS, "cpu", (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH))
    cfg = tiny_model.config
    settings = _settings(cfg)
    batch = encode(tiny_model.processor, [1])
    want = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC).generate(batch, settings)
    assert want.sequences == BlockDiffusionDecoder(tiny_model.model, cfg).generate(batch, settings).sequences

    torch._dynamo.reset()
    counters.clear()
    compiled = make_decoder(tiny_model.model, cfg, engine=COMPILED)
    calls = []
    inner = compiled._compiled_forward
    compiled._compiled_forward = lambda *a: (calls.append(1), inner(*a))[1]
    got = compiled.generate(batch, settings)
    assert got.sequences == want.sequences and got.finished == want.finished
    assert len(calls) == compiled.forwards_run > 0 and compiled.cache is None    # every step compiled, bucketed

    emulated = StaticBlockDiffusionDecoder(tiny_model.model, cfg, COMPILED, graph_emulation=True)
    assert emulated.graphs.compiles
    for _ in range(2):                          # the first call captures, the second only replays
        replays = emulated.graphs.replays
        out = emulated.generate(batch, settings)
        assert out.sequences == want.sequences and out.finished == want.finished
        assert emulated.graphs.replays - replays > 0
    assert not emulated.graphs.failures
    assert counters["stats"]["unique_graphs"] == 1                 # [1, 8]: denoise steps and commits
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_compile_forward_setting_reaches_every_entry_point():
    """One default (off) in EngineSettings; the CLI flag and the node parameter are derived from it; only the
    static decoder with SDPA compiles."""
    import argparse

    from wam_diff2_core.cli.common import add_engine_arguments, engine_settings
    from wam_diff2_core.params import planner

    assert EngineSettings().compile_forward is False
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_settings(parser.parse_args([])).compile_forward is False
    assert engine_settings(parser.parse_args(["--compile-forward"])).compile_forward is True
    assert planner.DEFAULTS["engine.compile_forward"] is False
    assert planner.engine_settings({"engine.compile_forward": True}).compile_forward is True
    with pytest.raises(ConfigError, match="compile_forward"):
        EngineSettings(implementation="plain", compile_forward=True).validated()
    with pytest.raises(ConfigError, match="compile_forward: needs attention_backend sdpa"):
        STATIC.replace(compile_forward=True, attention_backend="flashinfer")


def test_auto_on_cuda_keeps_sdpa_when_compiling(monkeypatch):
    """implementation auto picks FlashInfer on CUDA in bf16 when it imports, except with compile_forward."""
    import types

    from wam_diff2_core import decoding
    monkeypatch.setattr(decoding, "_flashinfer_importable", lambda: True)
    weight = types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    model = types.SimpleNamespace(parameters=lambda: iter([weight]))
    assert decoding.resolve_engine(EngineSettings(), model).attention_backend == "flashinfer"
    compiled = decoding.resolve_engine(EngineSettings(compile_forward=True), model)
    assert (compiled.implementation, compiled.attention_backend, compiled.cuda_graphs) == ("static", "sdpa", True)


def test_steps_run_under_the_pinned_sdpa_kernels(tiny_model, monkeypatch):
    """The pinned kernels (here CPU pinned to math, as CUDA is to efficient / cuDNN) are in force inside every
    step's SDPA call and nowhere else (the prefill is transformers' own dispatch); the tokens do not change.
    Pinned to a kernel CPU lacks, the steps fail: the context really is around them."""
    cfg = tiny_model.config
    settings = _settings(cfg)
    batch = encode(tiny_model.processor, [0, 1])
    want = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC).generate(batch, settings).sequences

    steps, others = [], []
    real_grouped, real_sdpa = attention_module.grouped_sdpa, torch.nn.functional.scaled_dot_product_attention

    def flags():
        return torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()

    def step_spy(*args):
        steps.append(flags())
        return real_grouped(*args)

    def sdpa_spy(*args, **kwargs):
        others.append(flags())
        return real_sdpa(*args, **kwargs)
    monkeypatch.setattr(attention_module, "grouped_sdpa", step_spy)
    monkeypatch.setitem(attention_module.SDPA_STEP_BACKENDS, "cpu", (SDPBackend.MATH,))
    static = StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)
    assert static.generate(batch, settings).sequences == want
    assert steps and all(fl == (False, True) for fl in steps)          # every step: math only
    assert (True, True) in others                                      # the prefill: torch's own choice
    assert flags() == (True, True)                                     # put back after each step

    monkeypatch.setitem(attention_module.SDPA_STEP_BACKENDS, "cpu", (SDPBackend.EFFICIENT_ATTENTION,))
    with pytest.raises(RuntimeError):
        StaticBlockDiffusionDecoder(tiny_model.model, cfg, STATIC).generate(batch, settings)


def test_a_compiled_step_first_runs_outside_the_capture_rules():
    """StepGraphs(compiles=True): code generation (on CUDA autotuning, which synchronises) happens in one run
    before the warm-up runs, outside the capture rules, its in-place effects put back; the warm-up runs and
    the capture then run under the rules. Without ``compiles`` every run before the replay is checked."""
    from wam_diff2_core.decoding.cuda_graphs import WARMUP_RUNS, MutatingStep, StepGraphs

    for compiles in (True, False):
        state, checked = torch.zeros(1), []

        def step():
            checked.append(torch._C._len_torch_dispatch_stack() > 0)     # HostSyncCheck is a dispatch mode
            state.add_(1)
            return state * 2
        graphs = StepGraphs(torch.device("cpu"), enabled=True, emulate=True, compiles=compiles)
        assert float(graphs.run("step", MutatingStep(step, [state]))) == 2.0 and float(state) == 1.0
        assert checked == [False] * compiles + [True] * (WARMUP_RUNS + 1) + [False]   # ..., capture, replay
