"""Weight quantization of the language model's linear layers (torchao), at load or from a quantized checkpoint
(the methods, what is quantized and why, measured: docs/decoding.md, "Quantized weights").

    from wam_diff2_core.model.quantization import quantize_language_model
    report = quantize_language_model(loaded.model, "int8")     # in place, once, at load
    report.describe()    # the demo model: int8: 28 linear layers of the language model, 9.4 MB -> 2.4 MB of weights

``engine.quantization``: ``int8`` (weight-only, a scale per output row), ``int4`` (weight-only, a scale and
zero point per :data:`INT4_GROUP_SIZE` inputs, torchao's portable format: int4 rounding at int8's size) or
``int8-dynamic`` (int8 weights and per-token int8 activations) for the decoder layers' linear layers; under
each, the LM head and token embedding int8 with a scale per row, one table when tied, never copied to float
(:class:`Int8RowEmbedding`, :class:`Int8ChunkedLinear`). The vision tower stays float. torchao is optional: its
absence is an error only for a method other than ``none``. Quantized checkpoints store torchao's flattened
tensors in safetensors (no pickles) and load without quantizing again into a model built without weights
(:func:`load_quantized`, :func:`build_without_weights`): no full-precision copy exists while loading.
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import QUANTIZATIONS, ConfigError

log = logging.getLogger(__name__)

TORCHAO_REQUIREMENT = "torchao==0.18.0"
INT4_GROUP_SIZE = 32
HEAD_CHUNK_ROWS = 8192          # of the int8 LM head computed at a time (Int8ChunkedLinear)
LAYERS_PREFIX = "model.language_model.layers."
LM_HEAD = "lm_head"
EMBEDDING = "model.language_model.embed_tokens"
QUANTIZED_WEIGHTS_FILE = "model.safetensors"


def require_torchao(method: str):
    """torchao, imported; a ConfigError naming the setting when it is missing."""
    try:
        import torchao
    except ImportError:
        raise ConfigError(f"quantization: {method} needs torchao, which is not installed "
                          f"(pip install '.[quant]', or pip install {TORCHAO_REQUIREMENT})") from None
    return torchao


def torchao_config(method: str):
    """The torchao quantization config of a method (see the module doc)."""
    require_torchao(method)
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      IntxWeightOnlyConfig)
    from torchao.quantization.granularity import PerGroup

    if method == "int8":
        return Int8WeightOnlyConfig()
    if method == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig()
    if method == "int4":
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(INT4_GROUP_SIZE))
    raise ConfigError(f"quantization: {method!r} is not one of {', '.join(QUANTIZATIONS)}")


def quantizable_linears(model, method: str) -> dict[str, torch.nn.Linear]:
    """The decoder layers' linear layers by qualified name (``model.language_model.layers.0.self_attn.q_proj``);
    for int4, those whose input width is a multiple of INT4_GROUP_SIZE (the others stay float)."""
    layers = model.model.language_model.layers
    found = {LAYERS_PREFIX + name: m for name, m in layers.named_modules() if isinstance(m, torch.nn.Linear)}
    if method == "int4":
        found = {name: m for name, m in found.items() if m.in_features % INT4_GROUP_SIZE == 0}
    return found


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds: a torchao quantized tensor's parts (int8 data, scales, ...), else numel x size."""
    names = getattr(t, "tensor_data_names", None)
    if names is not None:
        parts = [getattr(t, n) for n in names] + [getattr(t, n, None) for n in
                                                  getattr(t, "optional_tensor_data_names", [])]
        return sum(tensor_bytes(p) for p in parts if isinstance(p, torch.Tensor))
    return t.numel() * t.element_size()


# a board's GPU reads the int8 bytes directly: that is where quantization is for
CPU_NOTE = ("on CPU the quantized linear layers are slower than float32 (torchao dequantizes at every call; "
            "docs/decoding.md, Quantized weights): this saves memory, not time")


def warn_if_cpu(method: str, device: torch.device) -> None:
    if method != "none" and device.type == "cpu":
        extra = "; int8-dynamic is also slower than int8 with the same memory, prefer int8" \
            if method == "int8-dynamic" else ""
        log.warning("quantization %s: %s%s", method, CPU_NOTE, extra)


def is_quantized(t: torch.Tensor) -> bool:
    return getattr(t, "tensor_data_names", None) is not None


@dataclass(frozen=True)
class QuantizationReport:
    method: str
    linear_layers: int          # decoder-layer linear layers quantized by the method
    float_bytes: int            # their weights before
    quantized_bytes: int        # and after
    table_float_bytes: int = 0  # the LM head and the token embedding (once when tied) before
    table_bytes: int = 0        # and after, int8

    def describe(self) -> str:
        text = (f"{self.method}: {self.linear_layers} linear layers of the language model, "
                f"{self.float_bytes / 1e6:.1f} MB -> {self.quantized_bytes / 1e6:.1f} MB of weights")
        if self.table_bytes:
            text += (f"; LM head and token embedding int8, {self.table_float_bytes / 1e6:.1f} MB -> "
                     f"{self.table_bytes / 1e6:.1f} MB")
        return text


class Int8RowEmbedding(torch.nn.Embedding):
    """A token embedding over an int8 table with one scale per row (torchao ``Int8Tensor``, per row), which may
    be the tied LM head's own weight. A lookup dequantizes only the rows it gathers, exactly as torchao
    dequantizes them; torchao's own embedding would dequantize the whole table at every call."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:      # [...] -> [..., hidden]
        rows = self.weight[input_ids.reshape(-1)].dequantize()      # [tokens, hidden]
        return rows.view(*input_ids.shape, self.embedding_dim)


class Int8ChunkedLinear(torch.nn.Linear):
    """A linear layer over an int8 weight with one scale per row (the LM head), computed :data:`HEAD_CHUNK_ROWS`
    output rows at a time through torchao's own int8 linear. That linear converts the whole int8 weight to the
    activations' dtype at every call: for the 2B model's head (151936 x 2048) a 0.62 GB bf16 copy per forward,
    as large as the float head it replaces; a chunk's copy is 34 MB."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:            # [..., in] -> [..., out]
        return torch.cat([torch.nn.functional.linear(
            x, self.weight[start:start + HEAD_CHUNK_ROWS],
            None if self.bias is None else self.bias[start:start + HEAD_CHUNK_ROWS])
            for start in range(0, self.out_features, HEAD_CHUNK_ROWS)], dim=-1)


def _chunked_head(head: torch.nn.Linear) -> Int8ChunkedLinear:
    """``head``'s replacement computing by chunks of rows, over the same int8 weight (and bias)."""
    new = Int8ChunkedLinear(head.in_features, head.out_features, bias=False, device="meta")
    new.weight, new.bias = head.weight, head.bias
    return new


def _row_embedding(embedding: torch.nn.Embedding, weight: torch.nn.Parameter) -> Int8RowEmbedding:
    """``embedding``'s replacement reading the int8 table ``weight`` (built on meta: it owns no other tensor)."""
    new = Int8RowEmbedding(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx, device="meta")
    new.weight = weight
    return new


def quantize_embedding_and_head(model) -> tuple[int, int]:
    """The LM head and the token embedding to weight-only int8, one scale per row, in place; a tied pair stays
    one table (the head's rows are the tokens' rows). (bytes before, bytes after)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    head, embedding = model.lm_head, model.get_input_embeddings()
    tied = head.weight is embedding.weight
    before = tensor_bytes(head.weight) + (0 if tied else tensor_bytes(embedding.weight))
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda module, fqn: module is head or
              (module is embedding and not tied))
    model.set_input_embeddings(_row_embedding(embedding, head.weight if tied else embedding.weight))
    model.set_output_embeddings(_chunked_head(head))
    after = tensor_bytes(head.weight) + (0 if tied else tensor_bytes(model.get_input_embeddings().weight))
    return before, after


def quantize_language_model(model, method: str) -> QuantizationReport:
    """Quantize a Qwen3-VL model in place by ``method`` (``none``: nothing), as the module doc says."""
    if method not in QUANTIZATIONS:
        raise ConfigError(f"quantization: {method!r} is not one of {', '.join(QUANTIZATIONS)}")
    if method == "none":
        return QuantizationReport(method, 0, 0, 0)
    config = torchao_config(method)
    from torchao.quantization import quantize_

    targets = quantizable_linears(model, method)
    if not targets:
        raise ConfigError(f"quantization: {method}: the model has no linear layer to quantize")
    warn_if_cpu(method, next(iter(targets.values())).weight.device)
    before = sum(tensor_bytes(m.weight) for m in targets.values())
    quantize_(model, config, filter_fn=lambda module, fqn: fqn in targets)
    after = sum(tensor_bytes(m.weight) for m in targets.values())
    table_before, table_after = quantize_embedding_and_head(model)
    report = QuantizationReport(method, len(targets), before, after, table_before, table_after)
    log.info("quantized %s", report.describe())
    return report


def quantized_weights(model) -> dict[str, torch.Tensor]:
    """The weights quantization replaces, by module name, float or quantized: the decoder-layer linears (every
    one: no int4 group-size filter), the LM head and the token embedding (one entry when tied)."""
    weights = {name: m.weight for name, m in quantizable_linears(model, "int8").items()}
    weights[LM_HEAD] = model.lm_head.weight
    if model.get_input_embeddings().weight is not model.lm_head.weight:
        weights[EMBEDDING] = model.get_input_embeddings().weight
    return weights


def save_quantized_weights(model, out: Path) -> Path:
    """The model's state dict in safetensors, quantized tensors flattened by torchao into plain tensors
    plus JSON metadata (no pickles). A tied LM head is left out (the config ties it again at load)."""
    from safetensors.torch import save_file
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tensors, metadata = flatten_tensor_state_dict(state)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    path = Path(out) / QUANTIZED_WEIGHTS_FILE
    save_file(tensors, str(path), metadata={k: v if isinstance(v, str) else json.dumps(v)
                                            for k, v in metadata.items()})
    return path


@contextmanager
def _parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no initialisation) and their
    buffers as usual: the non-persistent ones (the rotary tables) are computed from the config, never stored,
    so they must be real. Parameters registered before the ``with`` are untouched."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def build_without_weights(model_config, dtype: torch.dtype, attn_implementation: str):
    """Qwen3VLForConditionalGeneration of ``model_config`` whose parameters are on the meta device, for
    :func:`load_quantized` to fill: loading a quantized checkpoint never holds a full-precision copy."""
    from transformers import Qwen3VLForConditionalGeneration

    with _parameters_on_meta():
        return Qwen3VLForConditionalGeneration._from_config(model_config, dtype=dtype,
                                                            attn_implementation=attn_implementation)


def load_quantized(model, path: Path, method: str) -> QuantizationReport:
    """Fill ``model`` (built from the checkpoint's config, usually by :func:`build_without_weights`) with a
    quantized checkpoint's weights as they are stored: the quantized tensors are rebuilt from their parts,
    nothing is quantized again. Errors name the file and the tensors that are missing or unexpected."""
    require_torchao(method)
    from safetensors import safe_open
    from safetensors.torch import load_file
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    weights = Path(path) / QUANTIZED_WEIGHTS_FILE
    if not weights.is_file():
        raise ConfigError(f"{weights}: missing (a quantized checkpoint keeps its weights in one file)")
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata() or {}
    try:
        state, leftover = unflatten_tensor_state_dict(load_file(str(weights)), metadata)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{weights}: not a quantized checkpoint's weights ({exc})") from exc
    state.update(leftover)
    expected = set(model.state_dict())
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = sorted(expected - set(state) - ({"lm_head.weight"} if tied else set()))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(f"{weights}: tensors do not match the config (missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]})")
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    embedding = model.get_input_embeddings()
    if is_quantized(embedding.weight):      # a float table (an export that kept it float) stays as it is
        model.set_input_embeddings(_row_embedding(embedding, embedding.weight))
    if is_quantized(model.lm_head.weight):
        model.set_output_embeddings(_chunked_head(model.lm_head))
    targets = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and is_quantized(m.weight)}
    targets.pop(LM_HEAD, None)
    if not targets or any(not n.startswith(LAYERS_PREFIX) for n in targets):
        raise ConfigError(f"{weights}: expected quantized linear layers in the language model's decoder layers only")
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        raise ConfigError(f"{weights}: tensors left without a value: {on_meta[:5]}")
    table = sum(tensor_bytes(w) for name, w in quantized_weights(model).items() if name in (LM_HEAD, EMBEDDING)
                and is_quantized(w))
    size = sum(tensor_bytes(m.weight) for m in targets.values())
    return QuantizationReport(method, len(targets), 0, size, 0, table)
