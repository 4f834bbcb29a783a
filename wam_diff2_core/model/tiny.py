"""Tiny Qwen3-VL checkpoints built from code, for tests and smoke runs (no download): an ordinary Hugging Face
checkpoint (config, safetensors weights, a byte-level BPE tokenizer trained here with Qwen's pre-tokenizer and
special tokens plus ``<|mask|>``, a chat template, image and video processors, the diffusion settings) that
loads through :func:`wam_diff2_core.model.load_checkpoint` like a real one.

    wam-diff2 tiny-checkpoint /tmp/tiny --seed 0
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from ..config import EOS_TOKEN, MASK_TOKEN, DecodingSettings, write_diffusion_file
from .shapes import rope_parameters

# Qwen2/3's pre-tokenizer: single digits, letters runs, punctuation runs, whitespace rules.
QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3-VL's added tokens in id order (specials first, then the non-special tool/think tags).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# The real Qwen3 id layout: 151643 byte-level BPE tokens, then the specials (151643 <|endoftext|> ...
# 151655 <|image_pad|>), then these plain added tokens up to 151668; the LM head has 151936 rows.
QWEN_BPE_SIZE = 151643
QWEN_LAYOUT_PLAIN_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                                  "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                  "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN_PLAIN_ADDED_TOKENS = tuple(t for t in QWEN_LAYOUT_PLAIN_ADDED_TOKENS if not t.startswith("<|"))
QWEN_LM_HEAD_ROWS = 151936

# A Qwen3-VL style chat template: images and videos become vision-start/pad/end triples.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

TINY_MIN_PIXELS = 32 * 32
TINY_MAX_PIXELS = 128 * 128


def _corpus(rng: random.Random, n: int = 3000) -> list[str]:
    """Text like the prompts and answers the package handles, so BPE learns useful merges."""
    from ..outputs.prompts import COMMANDS, format_planning_prompt
    labels = ("car", "truck", "pedestrian", "bus", "bicycle", "traffic light")
    lines = []
    for _ in range(n):
        num = lambda s: round(rng.uniform(-s, s), 2)  # noqa: E731
        lines.append(format_planning_prompt(rng.choice(COMMANDS), (num(15), num(2)), (num(3), num(3))))
        lines.append(",".join(f"{num(40):.2f}" for _ in range(16)))
        box = [rng.randint(0, 1000) for _ in range(4)]
        lines.append('[{"bbox_2d": [%d, %d, %d, %d], "label": "%s"}]' % (*box, rng.choice(labels)))
        lines.append("Is there a vehicle ahead? Yes, a car is braking in the ego lane.")
    return lines


def build_tokenizer(seed: int = 0, vocab_size: int = 1000, with_mask: bool = True, qwen_layout: bool = False):
    """A byte-level BPE tokenizer with Qwen's pre-tokenizer and special tokens (plus ``<|mask|>`` unless not
    ``with_mask``, as in stock Qwen3-VL); ``qwen_layout``: padded to Qwen's 151643 BPE entries, so every special
    token sits at its real Qwen3-VL id."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(random.Random(seed)), trainer)
    if qwen_layout:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        vocab.update({f"<|unused_{i}|>": i for i in range(len(vocab), QWEN_BPE_SIZE)})
        tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    plain = QWEN_LAYOUT_PLAIN_ADDED_TOKENS if qwen_layout else QWEN_PLAIN_ADDED_TOKENS
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    if with_mask:
        tok.add_special_tokens([AddedToken(MASK_TOKEN, special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token="<|endoftext|>",
        model_max_length=32768, clean_up_tokenization_spaces=False, padding_side="left")


def build_processor(tokenizer, min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, size=size,
                                            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    video_processor = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, size=size)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                            video_processor=video_processor, chat_template=CHAT_TEMPLATE)


def build_config(tokenizer, *, hidden_size: int = 128, layers: int = 2, vision_depth: int = 2,
                 vision_hidden_size: int = 64, head_padding: int = 32, qwen_layout: bool = False):
    """``qwen_layout``: the real LM head width (151936) and head_dim 128 with the real MRoPE
    sections [24, 20, 20] (interleaved); otherwise head_dim 32, sections [6, 5, 5]. The vision tower:
    ``vision_depth`` blocks ``vision_hidden_size`` wide (32 per head, MLP twice as wide)."""
    if vision_hidden_size < 32 or vision_hidden_size % 32:
        raise ValueError(f"vision_hidden_size: {vision_hidden_size} is not a positive multiple of 32")
    if vision_depth < 1:
        raise ValueError(f"vision_depth: {vision_depth} (give 1 or more blocks)")
    from transformers import Qwen3VLConfig
    ids = tokenizer.convert_tokens_to_ids
    # Like the real 151936-wide head over a 151669-token vocabulary: unused rows past the end.
    vocab_size = QWEN_LM_HEAD_ROWS if qwen_layout else len(tokenizer) + head_padding
    head_dim = 128 if qwen_layout else 32
    heads = 2 if qwen_layout else hidden_size // head_dim
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), head_dim=head_dim,
            max_position_embeddings=8192, rms_norm_eps=1e-6,
            rope_parameters=rope_parameters((24, 20, 20) if qwen_layout else (6, 5, 5)),
        ),
        vision_config=dict(
            depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
            num_heads=vision_hidden_size // 32, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden_size,
            num_position_embeddings=256, deepstack_visual_indexes=list(range(min(vision_depth, layers))),
        ),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, *, block_size: int = 32,
                          logit_scale: float = 24.0, hidden_size: int = 128, layers: int = 2,
                          vision_depth: int = 2, vision_hidden_size: int = 64, diffusion: bool = True,
                          head_padding: int = 32) -> Path:
    """Write a deterministic random tiny checkpoint; ``logit_scale`` sharpens the LM head so
    confidences spread over (0, 1) and thresholds matter. ``diffusion=False`` writes a stock
    autoregressive Qwen3-VL checkpoint instead (no ``<|mask|>``, no diffusion settings)."""
    out = Path(out_dir)
    tokenizer = build_tokenizer(seed, with_mask=diffusion)
    config = build_config(tokenizer, hidden_size=hidden_size, layers=layers, vision_depth=vision_depth,
                          vision_hidden_size=vision_hidden_size, head_padding=head_padding)
    _save(out, tokenizer, config, seed, logit_scale)
    if diffusion:
        write_diffusion_file(out, block_size=block_size, mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN),
                             eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN), decoding=DecodingSettings())
    return out


def build_qwen_layout_checkpoint(out_dir: str | Path, seed: int = 0, *, label: str = "wam_diff2",
                                 mask_token_id: int | None = 151671, hidden_size: int = 64) -> Path:
    """A tiny checkpoint with the **real Qwen3-VL id layout**, as the authors ship WAM-Diff2: 151936 rows, the
    specials at their real ids, no ``<|mask|>``, no diffusion_config.json. ``label``: ``wam_diff2`` (the authors'
    model_type names) or ``qwen3_vl``; ``mask_token_id``: the authors' config.json field (None: not written)."""
    out = Path(out_dir)
    tokenizer = build_tokenizer(seed, with_mask=False, qwen_layout=True)
    config = build_config(tokenizer, hidden_size=hidden_size, layers=2, qwen_layout=True)
    _save(out, tokenizer, config, seed, logit_scale=24.0)
    path = out / "config.json"
    raw = json.loads(path.read_text())
    if label == "wam_diff2":
        raw["model_type"], raw["architectures"] = "wam_diff2", ["WAMDiff2ForConditionalGeneration"]
        raw["text_config"]["model_type"] = "wam_diff2_text"
        raw["vision_config"]["model_type"] = "wam_diff2"
    if mask_token_id is not None:
        raw["mask_token_id"] = mask_token_id
    path.write_text(json.dumps(raw, indent=2) + "\n")
    return out


def _save(out: Path, tokenizer, config, seed: int, logit_scale: float) -> None:
    from transformers import Qwen3VLForConditionalGeneration

    from .saving import save_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    processor = build_processor(tokenizer)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_checkpoint(model, processor, out)
