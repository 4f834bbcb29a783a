"""The static decoder's fused layer ops (decoding/layer_ops.py) and packed projections (decoding/text_forward.py).

- the torch implementations are transformers' modules op for op (bit-identical, float32 and bf16);
- the Triton kernels (decoding/triton_kernels.py) agree with them, and a whole decode through them gives the plain
  decoder's tokens in float32: on CPU under Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess, since
  Triton reads it when a kernel is defined), which is how CI checks kernels written for a GPU;
- ``layer_kernels`` resolves as documented, and falls back to torch with the reason when Triton cannot run;
- packing re-points the model's weights (no copy), and the model, its checkpoints and training still see them.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from test.support.decoder_prompts import encode
from wam_diff2_core.config import ConfigError, EngineSettings
from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
from wam_diff2_core.decoding.layer_ops import resolve_layer_kernels
from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder

ROOT = Path(__file__).resolve().parents[3]
ops = torch.ops.wam_diff2
STATIC = EngineSettings(implementation="static")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_ops_are_the_model_modules_op_for_op(tiny_model, dtype):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

    layer = copy.deepcopy(tiny_model.model.model.language_model.layers[0]).to(dtype)
    attn, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
    dim, heads, kv_heads = attn.head_dim, 4, 2
    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(2, 2, 3, norm.weight.shape[0], generator=gen).to(dtype)
    w = norm.weight.detach()
    with torch.no_grad():
        assert torch.equal(ops.rms_norm(x, w, norm.variance_epsilon, False), norm(x))
        normed, total = ops.add_rms_norm(x, residual, w, norm.variance_epsilon, False)
        assert torch.equal(total, residual + x) and torch.equal(normed, norm(residual + x))
        packed = torch.randn(2, 3, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)   # a packed projection
        q, k, v = packed.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        cos, sin = torch.randn(2, 2, 3, dim, generator=gen).to(dtype)
        k_cache, v_cache = torch.zeros(2, 2, 8, kv_heads, dim, dtype=dtype)
        rows, slots = torch.tensor([[0, 0, 0], [1, 1, 1]]), torch.tensor([[5, 2, 7], [0, 1, 2]])
        want_q = attn.q_norm(q.view(2, 3, heads, dim)).transpose(1, 2)
        want_k = attn.k_norm(k.view(2, 3, kv_heads, dim)).transpose(1, 2)
        want_q, want_k = apply_rotary_pos_emb(want_q, want_k, cos, sin)
        got_q = ops.qk_norm_rope_store(q, k, v, attn.q_norm.weight, attn.k_norm.weight, cos, sin,
                                       attn.q_norm.variance_epsilon, k_cache, v_cache, rows, slots, False)
        assert got_q.is_contiguous() and torch.equal(got_q, want_q)
        assert torch.equal(k_cache[rows, slots], want_k.transpose(1, 2))
        assert torch.equal(v_cache[rows, slots], v.view(2, 3, kv_heads, dim))
        gate, up = torch.randn(2, 2, 3, 16, generator=gen).to(dtype)
        assert torch.equal(ops.swiglu(gate, up, False), mlp.act_fn(gate) * up)


# One subprocess under the interpreter: each op at the decoder's layouts in float32 and bf16, head_dim 32 (tiny) and
# 128 (2B / 8B), then a decode of the tiny checkpoint through the Triton kernels against the plain decoder.
_INTERPRETED = textwrap.dedent("""
    import json, sys, torch
    from wam_diff2_core.decoding.layer_ops import compare_implementations
    from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
    from wam_diff2_core.decoding.static import StaticBlockDiffusionDecoder
    from wam_diff2_core.config import EngineSettings
    from wam_diff2_core.model.checkpoint import load_checkpoint
    from test.support.decoder_prompts import encode
    result = {"ops": {}}
    for dtype in (torch.float32, torch.bfloat16):
        for head_dim in (32, 128):
            problems = compare_implementations(torch.device("cpu"), dtype, head_dim, torch.Generator().manual_seed(1))
            result["ops"][f"{dtype} {head_dim}"] = problems
    m = load_checkpoint(sys.argv[1], device="cpu", dtype="float32")
    settings = m.config.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7, max_new_tokens=16)
    batch = encode(m.processor, [0, 2])
    triton = StaticBlockDiffusionDecoder(m.model, m.config, EngineSettings(implementation="static", layer_kernels="triton"))
    result["kernels"] = triton.layer_kernels.name
    result["tokens"] = triton.generate(batch, settings).sequences
    result["plain"] = BlockDiffusionDecoder(m.model, m.config).generate(batch, settings).sequences
    print(json.dumps(result))
""")


@pytest.mark.slow
def test_triton_kernels_agree_with_the_torch_ops_and_decode_plain_tokens_under_the_interpreter(tiny_checkpoint):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED, str(tiny_checkpoint)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["ops"]) == 4
    for case, problems in result["ops"].items():
        assert len(problems) == 7 and not any(problems.values()), (case, problems)
    assert result["kernels"] == "triton"
    assert result["tokens"] == result["plain"] and all(len(t) > 0 for t in result["tokens"])


def test_layer_kernels_resolve_per_device_and_fall_back_with_the_reason(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_layer_kernels("auto", cpu, torch.float32, 32).name == "torch"
    assert resolve_layer_kernels("torch", torch.device("cuda"), torch.bfloat16, 128).name == "torch"
    with pytest.raises(ConfigError, match="layer_kernels: triton: Triton kernels run on CUDA"):
        resolve_layer_kernels("triton", cpu, torch.float32, 32)
    with pytest.raises(ConfigError, match="layer_kernels: 'cuda' is not one of auto, triton, torch"):
        resolve_layer_kernels("cuda", cpu, torch.float32, 32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ConfigError, match="head_dim 96 is not a power of two"):
        resolve_layer_kernels("triton", cpu, torch.float32, 96)
    # auto on a CUDA device whose self-check fails (here: no CUDA at all) keeps the torch ops and says why
    if not torch.cuda.is_available():
        kernels = resolve_layer_kernels("auto", torch.device("cuda"), torch.bfloat16, 128)
        assert kernels.name == "torch" and "torch ops (" in kernels.reason
    with pytest.raises(ConfigError, match="layer_kernels"):
        EngineSettings(layer_kernels="fast").validated()


def test_packed_projections_alias_the_model_weights(tiny_model):
    """Packing adds no memory and changes nothing the model, a checkpoint or an optimizer sees: the q/k/v and
    gate/up weights become row blocks of one tensor, a second decoder reuses it, the model's own forward is
    unchanged, a weight update reaches the packed matmul, and a moved model is refused rather than read stale."""
    m = tiny_model
    batch = encode(m.processor, [1])
    layer = m.model.model.language_model.layers[1]
    attn, mlp = layer.self_attn, layer.mlp
    first = StaticBlockDiffusionDecoder(m.model, m.config, STATIC)
    packed = first.text.layers[1].qkv
    assert packed.data_ptr() == attn.q_proj.weight.data_ptr()
    assert attn.v_proj.weight.data_ptr() == packed[-attn.v_proj.weight.shape[0]:].data_ptr()
    assert first.text.layers[1].gate_up.data_ptr() == mlp.gate_proj.weight.data_ptr()
    assert StaticBlockDiffusionDecoder(m.model, m.config, STATIC).text.layers[1].qkv is packed   # reused
    assert isinstance(attn.q_proj.weight, torch.nn.Parameter) and attn.q_proj.weight.shape == (128, 128)
    plain = BlockDiffusionDecoder(m.model, m.config)
    settings = m.config.settings.replace(block_size=8, denoising_steps=8, max_new_tokens=16)
    before = plain.generate(batch, settings).sequences
    assert first.generate(batch, settings).sequences == before
    with torch.no_grad():
        saved = attn.k_proj.weight.clone()
        attn.k_proj.weight.mul_(-3.0)                    # what an optimizer step does: in place
        changed = plain.generate(batch, settings).sequences
        assert changed != before and first.generate(batch, settings).sequences == changed
        attn.k_proj.weight.copy_(saved)
    moved = attn.o_proj.weight                           # not packed: moving it is harmless
    assert first.text.layers[1].current() and moved is attn.o_proj.weight
    original = mlp.up_proj.weight.data
    mlp.up_proj.weight.data = original.clone()           # replaced, as model.to(...) replaces every weight
    try:
        with pytest.raises(RuntimeError, match="moved or replaced after this decoder was made"):
            first.generate(batch, settings)
    finally:
        mlp.up_proj.weight.data = original
    assert first.generate(batch, settings).sequences == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: run scripts/device_check.sh")
def test_gpu_triton_kernels_agree_with_the_torch_ops_and_decode_plain_tokens(tiny_checkpoint):
    from wam_diff2_core.decoding.layer_ops import compare_implementations
    from wam_diff2_core.model.checkpoint import load_checkpoint

    cuda = torch.device("cuda")
    for dtype in (torch.float32, torch.bfloat16):
        for head_dim in (32, 128):
            problems = compare_implementations(cuda, dtype, head_dim, torch.Generator(cuda).manual_seed(1))
            assert not any(problems.values()), (dtype, head_dim, problems)
    m = load_checkpoint(tiny_checkpoint, device="cuda", dtype="float32")
    settings = m.config.settings.replace(block_size=8, denoising_steps=8, confidence_threshold=0.7, max_new_tokens=24)
    batch = encode(m.processor, [0, 1, 2])
    triton = StaticBlockDiffusionDecoder(m.model, m.config, STATIC.replace(layer_kernels="auto", cuda_graphs=True))
    assert triton.layer_kernels.name == "triton", triton.layer_kernels.reason
    assert triton.generate(batch, settings).sequences == BlockDiffusionDecoder(m.model, m.config).generate(
        batch, settings).sequences
