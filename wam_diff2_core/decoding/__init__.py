"""Decoders: the plain reference (decoder.py) and the static fast path (static.py), picked by a factory.

    from wam_diff2_core.decoding import make_decoder
    decoder = make_decoder(loaded.model, loaded.config, implementation="static", cuda_graphs=True)
    out = decoder.generate(processor_batch, settings)      # the same tokens either way
"""
from __future__ import annotations

from typing import Any

from ..config import EngineSettings


def make_decoder(model, config, implementation: str | None = None, *, cuda_graphs: bool | None = None,
                 attention_backend: str | None = None, engine: EngineSettings | None = None, **overrides: Any):
    """A decoder with ``generate(inputs, settings, generators) -> DecodeOutput``.

    ``engine`` (default :class:`EngineSettings`) < keyword overrides (None = keep); its
    ``cpu_threads`` is applied here, for every entry point that decodes on CPU. ``plain``:
    transformers' cache, the reference; ``static``: preallocated KV cache, fused commit, optional
    CUDA graphs and FlashInfer. Invalid combinations raise ConfigError naming the field.
    """
    given = dict(implementation=implementation, cuda_graphs=cuda_graphs, attention_backend=attention_backend,
                 **overrides)
    engine = (engine or EngineSettings()).replace(**{k: v for k, v in given.items() if v is not None})
    if engine.cpu_threads and next(model.parameters()).device.type == "cpu":
        import torch
        torch.set_num_threads(engine.cpu_threads)      # process-wide, as torch allows
    if engine.implementation == "plain":
        from .decoder import BlockDiffusionDecoder
        return BlockDiffusionDecoder(model, config)
    from .static import StaticBlockDiffusionDecoder
    return StaticBlockDiffusionDecoder(model, config, engine)
