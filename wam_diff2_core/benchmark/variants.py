"""The decoders a benchmark compares, by variant name, and its random prompts.

    from wam_diff2_core.benchmark.variants import available_variants, make_variant, random_prompt
    decoders = {name: make_variant(name, model, config) for name in available_variants(device)}
    inputs = random_prompt(config.vocab_size, batch=1, length=1024, seed=0, device=device)
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def available_variants(device) -> list[str]:
    variants = ["plain", "static-sdpa"]
    if device.type == "cuda":
        variants += ["static-sdpa-graph", "static-sdpa-compiled-graph"]
        from ..decoding.attention_flashinfer import flashinfer_problem
        if flashinfer_problem():
            log.warning("no FlashInfer rows: %s", flashinfer_problem())
        else:
            variants += ["static-flashinfer", "static-flashinfer-graph"]
    return variants


def make_variant(name: str, model, config, compile_mode: str = "default"):
    """A decoder by variant name: ``static-<attention>[-compiled][-graph][-emulated]``; ``-compiled`` runs the
    forward through torch.compile (engine.compile_forward, in ``compile_mode``), ``-graph-emulated`` is the
    graphed path with emulated graphs (decoding/cuda_graphs.py: any device; verify-device's check of the
    capture rules off a GPU)."""
    from ..decoding import make_decoder
    if name == "plain":
        return make_decoder(model, config, "plain")
    backend = "flashinfer" if "flashinfer" in name else "sdpa"
    compiled = "-compiled" in name
    if name.endswith("-emulated"):
        from ..config import EngineSettings
        from ..decoding.static import StaticBlockDiffusionDecoder
        engine = EngineSettings(implementation="static", cuda_graphs=True, attention_backend=backend,
                                compile_forward=compiled, compile_mode=compile_mode)
        return StaticBlockDiffusionDecoder(model, config, engine, graph_emulation=True)
    decoder = make_decoder(model, config, "static", attention_backend=backend, cuda_graphs=name.endswith("-graph"),
                           compile_forward=compiled, compile_mode=compile_mode)
    if name.endswith("-graph") and not decoder.graphs.enabled:
        raise RuntimeError(decoder.graphs.reason)
    return decoder


def random_prompt(vocab: int, batch: int, length: int, seed: int, device):
    """Random token ids [batch, length] (seeded) as a benchmark prompt, on ``device``."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 8, (batch, length), generator=gen)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
