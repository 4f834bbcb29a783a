"""Checkpoint loading: formats, the resolved diffusion config, conversion, clear errors."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from wam_diff2_core.config import DIFFUSION_CONFIG_FILE, MASK_TOKEN, ConfigError, DecodingSettings
from wam_diff2_core.model.checkpoint import CheckpointError, load_checkpoint
from wam_diff2_core.model.ar_to_diffusion import convert_to_diffusion
from wam_diff2_core.model.tiny import build_tiny_checkpoint


@pytest.fixture(scope="module")
def ar_checkpoint(tmp_path_factory):
    # A tight LM head (no spare rows) so that adding <|mask|> must grow the vocabulary.
    return build_tiny_checkpoint(tmp_path_factory.mktemp("ar") / "ckpt", seed=1, diffusion=False, head_padding=0)


def _logits(loaded, ids):
    with torch.no_grad():
        return loaded.model(input_ids=torch.tensor([ids])).logits[0]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_checkpoint_is_deterministic_by_seed(tmp_path, tiny_checkpoint):
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    other = build_tiny_checkpoint(tmp_path / "other", seed=3)
    for name in ("model.safetensors", "tokenizer.json", DIFFUSION_CONFIG_FILE, "config.json"):
        assert _sha(again / name) == _sha(tiny_checkpoint / name), name
    assert _sha(other / "model.safetensors") != _sha(tiny_checkpoint / "model.safetensors")


def test_tiny_checkpoint_resolves_ids_from_its_own_files(tiny_model):
    tok, cfg = tiny_model.tokenizer, tiny_model.config
    assert cfg.block_size == 32 and cfg.settings == DecodingSettings()
    assert cfg.mask_token_id == tok.convert_tokens_to_ids(MASK_TOKEN)
    assert cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    banned = set(cfg.banned_token_ids)
    assert cfg.mask_token_id in banned and cfg.eos_token_id not in banned
    assert tok.convert_tokens_to_ids("<|im_start|>") in banned and tok.convert_tokens_to_ids("<|image_pad|>") in banned
    assert set(range(len(tok), cfg.vocab_size)) <= banned          # rows past the tokenizer
    assert tok.convert_tokens_to_ids("<think>") not in banned       # a plain added token
    # Qwen's digit splitting: every digit its own token.
    assert tok.tokenize("12.50") == ["1", "2", ".", "5", "0"]


def test_overrides_apply_and_bad_values_name_the_field(tiny_checkpoint):
    loaded = load_checkpoint(tiny_checkpoint, device="cpu", overrides={"block_size": 8, "confidence_threshold": 0.7})
    assert loaded.config.block_size == 8 and loaded.config.settings.confidence_threshold == 0.7
    with pytest.raises(ConfigError, match="confidence_threshold"):
        load_checkpoint(tiny_checkpoint, device="cpu", overrides={"confidence_threshold": 1.5})
    with pytest.raises(ConfigError, match="remasking_strategy"):
        loaded.config.with_settings(remasking_strategy="random")
    with pytest.raises(ConfigError, match="unknown decoding setting"):
        loaded.config.with_settings(block=8)


def test_wam_diff2_model_type_loads_with_identical_logits(tmp_path, tiny_checkpoint, tiny_model):
    dst = tmp_path / "wam"
    shutil.copytree(tiny_checkpoint, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = "wam_diff2"
    cfg["text_config"]["model_type"] = "wam_diff2_text"
    cfg["vision_config"]["model_type"] = "wam_diff2"
    cfg["architectures"] = ["WAMDiff2ForConditionalGeneration"]
    (dst / "config.json").write_text(json.dumps(cfg))
    loaded = load_checkpoint(dst, device="cpu")
    assert type(loaded.model).__name__ == "Qwen3VLForConditionalGeneration"
    ids = [5, 17, 99, 3, 250]
    assert torch.equal(_logits(loaded, ids), _logits(tiny_model, ids))


def test_stock_ar_checkpoint_decodes_ar_and_refuses_blocks_until_converted(tmp_path, ar_checkpoint):
    loaded = load_checkpoint(ar_checkpoint, device="cpu")
    assert loaded.config.block_size == 1 and loaded.config.mask_token_id is None
    with pytest.raises(ConfigError, match="wam-diff2 convert"):
        load_checkpoint(ar_checkpoint, device="cpu", overrides={"block_size": 32})

    dst = convert_to_diffusion(ar_checkpoint, tmp_path / "diff", block_size=4)
    conv = load_checkpoint(dst, device="cpu")
    mask_id = conv.tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    assert conv.config.block_size == 4 and conv.config.mask_token_id == mask_id
    assert mask_id == len(loaded.tokenizer)                        # appended after the stock vocabulary
    assert conv.model.lm_head.weight.shape[0] == mask_id + 1       # the head grew by one row
    emb = conv.model.get_input_embeddings().weight
    assert torch.allclose(emb[mask_id], emb[:mask_id].mean(0), atol=1e-6)
    ids = [5, 17, 99, 3]
    assert torch.allclose(_logits(conv, ids)[:, :mask_id], _logits(loaded, ids), atol=1e-5)
    with pytest.raises(ConfigError, match="already exists"):
        convert_to_diffusion(ar_checkpoint, dst)


def _broken(tmp_path, tiny_checkpoint, edit):
    dst = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, dst)
    edit(dst)
    return dst


@pytest.mark.parametrize("edit,match", [
    (lambda d: shutil.rmtree(d), "does not exist"),
    (lambda d: (d / "config.json").unlink(), "config.json: missing"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json: not valid JSON"),
    (lambda d: (d / "config.json").write_text('{"model_type": "llama"}'), "model_type 'llama'"),
    (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "only safetensors"),
    (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
    (lambda d: (d / DIFFUSION_CONFIG_FILE).write_text('{"block_size": 4, "blok": 1}'), "unknown key"),
    (lambda d: (d / DIFFUSION_CONFIG_FILE).write_text('{"block_size": 4, "mask_token_id": 99999}'),
     "outside the LM head"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00002.safetensors"}}'),
     "shard file"),
])
def test_broken_checkpoints_name_the_file_and_reason(tmp_path, tiny_checkpoint, edit, match):
    with pytest.raises(ConfigError, match=match):
        load_checkpoint(_broken(tmp_path, tiny_checkpoint, edit), device="cpu")


def test_truncated_weights_are_a_checkpoint_error(tmp_path, tiny_checkpoint):
    def cut(d):
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot load the weights"):
        load_checkpoint(_broken(tmp_path, tiny_checkpoint, cut), device="cpu")


def test_export_casts_the_weights_and_keeps_everything_else(tmp_path, tiny_checkpoint, tiny_model):
    from safetensors import safe_open

    from wam_diff2_core.cli import main
    assert main(["export", str(tiny_checkpoint), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert _sha(tmp_path / "bf16" / DIFFUSION_CONFIG_FILE) == _sha(tiny_checkpoint / DIFFUSION_CONFIG_FILE)
    assert (tmp_path / "bf16" / "model.safetensors").stat().st_size < 0.6 * (tiny_checkpoint / "model.safetensors").stat().st_size
    shipped = load_checkpoint(tmp_path / "bf16", device="cpu", dtype="float32")
    assert shipped.config == tiny_model.config
    for (name, a), (_, b) in zip(shipped.model.state_dict().items(), tiny_model.model.state_dict().items()):
        assert torch.equal(a, b.to(torch.bfloat16).float()), name
    assert main(["export", str(tiny_checkpoint), str(tmp_path / "bf16")]) == 2     # exists: refused, untouched


def test_tiny_checkpoint_cli_sizes(tmp_path):
    from wam_diff2_core.cli import main
    from wam_diff2_core.model.checkpoint import read_model_config
    assert main(["tiny-checkpoint", str(tmp_path / "m"), "--ar", "--hidden-size", "64", "--layers", "3",
                 "--vision-depth", "3", "--vision-hidden-size", "128"]) == 0
    config = read_model_config(tmp_path / "m")
    assert (config.text_config.hidden_size, config.text_config.num_hidden_layers) == (64, 3)
    vision = config.vision_config
    assert (vision.depth, vision.hidden_size, vision.intermediate_size, vision.num_heads) == (3, 128, 256, 4)
    assert not (tmp_path / "m" / DIFFUSION_CONFIG_FILE).exists()
    loaded = load_checkpoint(tmp_path / "m", device="cpu", dtype="float32")     # the wider tower loads and runs
    assert sum(p.numel() for p in loaded.model.model.visual.parameters()) > 3 * 128 * 128 * 4
    for bad in (["--vision-hidden-size", "100"], ["--vision-hidden-size", "0"], ["--vision-depth", "0"]):
        assert main(["tiny-checkpoint", str(tmp_path / "bad"), *bad]) == 2
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------- what is ignored or likely wrong is said
def test_remote_code_and_a_partial_last_block_are_warned_about(tmp_path, tiny_checkpoint, caplog):
    """Before: auto_map was ignored without a word, and max_new_tokens 7 at B = 4 accepted silently."""
    ckpt = tmp_path / "remote"
    shutil.copytree(tiny_checkpoint, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (ckpt / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        loaded = load_checkpoint(ckpt, device="cpu", dtype="float32", overrides={"block_size": 4, "max_new_tokens": 7})
    assert "config.json: auto_map names remote code, which is not run" in caplog.text
    assert "max_new_tokens 7 is not a multiple of block_size 4" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        whole = loaded.config.with_settings(max_new_tokens=8)
        assert not caplog.text                                  # whole blocks: nothing to say
        whole.with_settings(block_size=3)
    assert "max_new_tokens 8 is not a multiple of block_size 3: the last block is decoded whole (3 tokens) " \
           "and cut to 2" in caplog.text


def test_a_checkpoint_without_remote_code_loads_without_warnings(tiny_checkpoint, caplog):
    with caplog.at_level("WARNING"):
        load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32")
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
