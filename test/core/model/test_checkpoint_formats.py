"""The checkpoints users hold: the authors' WAM-Diff2 format with the real Qwen3-VL id layout, one
precedence rule for decoding settings, hub ids from the local cache, convert keeping the mask id.

The real-layout checkpoint is tiny in width (hidden 64) but has the real ids: a 151936-row embedding
and LM head, the specials at 151643 ... 151656, ``<|im_end|>`` 151645, no ``<|mask|>`` in the tokenizer,
MRoPE sections [24, 20, 20] (head_dim 128), deepstack layers; no diffusion_config.json, as shipped.
"""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from test.support import REPO_ROOT
from wam_diff2_core.cli import main
from wam_diff2_core.config import (AUTHORS_MASK_TOKEN_ID, DIFFUSION_CONFIG_FILE, SOURCE_FILE, SOURCE_USER,
                                   ConfigError, DecodingSettings)
from wam_diff2_core.model.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint_path
from wam_diff2_core.model.tiny import QWEN_LM_HEAD_ROWS, build_qwen_layout_checkpoint
from wam_diff2_core.outputs.prompts import format_planning_prompt

REAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
            "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656}


@pytest.fixture(scope="module")
def authors(tmp_path_factory):
    """The authors' labelling: model_type wam_diff2, mask_token_id 151671 in config.json."""
    return build_qwen_layout_checkpoint(tmp_path_factory.mktemp("authors") / "wam", seed=0)


def _variant(src, dst, **config_changes):
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


@pytest.fixture(scope="module")
def qwen_labelled(authors, tmp_path_factory):
    """The same tensors labelled as stock Qwen3-VL (the relabelled form), mask id kept in config.json."""
    dst = tmp_path_factory.mktemp("qwen") / "qwen"
    shutil.copytree(authors, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw.update(model_type="qwen3_vl", architectures=["Qwen3VLForConditionalGeneration"])
    raw["text_config"]["model_type"], raw["vision_config"]["model_type"] = "qwen3_vl_text", "qwen3_vl_vision"
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def test_the_authors_format_decodes_with_the_papers_block32_settings(authors):
    loaded = load_checkpoint(authors, device="cpu")
    cfg = loaded.config
    assert cfg.settings == DecodingSettings()                      # B = 32, S = 32, dynamic at 0.9
    assert cfg.block_size == 32 and cfg.mask_token_id == AUTHORS_MASK_TOKEN_ID
    assert all(cfg.sources[name].startswith("wam_diff2 format") for name in ("block_size", "denoising_steps"))
    assert cfg.sources["mask_token_id"] == "config.json"
    assert "block_size=32" in cfg.describe() and "wam_diff2 format" in cfg.describe()


def test_the_qwen_labelling_without_settings_is_autoregressive(qwen_labelled):
    cfg = load_checkpoint(qwen_labelled, device="cpu").config
    assert cfg.block_size == 1 and cfg.sources["block_size"].startswith("qwen3_vl format")
    assert cfg.mask_token_id == AUTHORS_MASK_TOKEN_ID            # config.json's, ready for --block-size 32


def test_real_ids_prompt_image_tokens_eos_mask_and_banned(authors):
    loaded = load_checkpoint(authors, device="cpu")
    tok, cfg = loaded.tokenizer, loaded.config
    assert {t: tok.convert_tokens_to_ids(t) for t in REAL_IDS} == REAL_IDS
    assert len(tok) == 151669 and cfg.vocab_size == QWEN_LM_HEAD_ROWS
    assert loaded.model.get_input_embeddings().weight.shape[0] == QWEN_LM_HEAD_ROWS
    assert loaded.model.config.text_config.rope_parameters["mrope_section"] == [24, 20, 20]
    assert cfg.eos_token_id == 151645
    banned = set(cfg.banned_token_ids)
    assert {AUTHORS_MASK_TOKEN_ID, 151643, 151644, 151652, 151653, 151655} <= banned
    assert set(range(151669, QWEN_LM_HEAD_ROWS)) <= banned and 151645 not in banned
    assert tok.convert_tokens_to_ids("<think>") not in banned

    from wam_diff2_core.geometry import EgoMotion
    from wam_diff2_core.policy import DrivingPolicy
    policy = DrivingPolicy(loaded, tasks=("plan",))
    frame = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
    out = policy.step(frame, EgoMotion(velocity=(5.0, 0.0), acceleration=(0.0, 0.0)), "left")
    assert out.plan.stats.block_size == 32 and out.plan.stats.tokens >= 1
    from PIL import Image
    from wam_diff2_core.model.prompt_encoding import encode_prompts
    prompt = policy._conversation(format_planning_prompt("left", (5.0, 0.0), (0.0, 0.0)))
    ids = encode_prompts(loaded.processor, [prompt], [[Image.fromarray(frame)]])["input_ids"][0].tolist()
    assert ids[0] == 151644 and ids.count(151652) == 1 and ids.count(151653) == 1
    assert ids.count(151655) >= 1 and ids[-3:] == tok.encode("<|im_start|>assistant\n")[-3:]


def test_mask_id_falls_back_to_the_authors_row_with_a_warning(authors, tmp_path, caplog):
    bare = _variant(authors, tmp_path / "bare", mask_token_id=None)
    with caplog.at_level(logging.WARNING, logger="wam_diff2_core.config"):
        cfg = load_checkpoint(bare, device="cpu").config
    assert cfg.mask_token_id == AUTHORS_MASK_TOKEN_ID and "authors' fixed mask id 151671" in caplog.text


def test_mask_id_from_config_json_beats_a_disagreeing_settings_file(authors, tmp_path, caplog):
    both = _variant(authors, tmp_path / "both")
    (both / DIFFUSION_CONFIG_FILE).write_text(json.dumps({"block_size": 32, "mask_token_id": 151669}))
    with caplog.at_level(logging.WARNING, logger="wam_diff2_core.config"):
        cfg = load_checkpoint(both, device="cpu").config
    assert cfg.mask_token_id == AUTHORS_MASK_TOKEN_ID and "differ" in caplog.text


def test_precedence_user_over_settings_file_over_format(authors, tmp_path, caplog):
    ckpt = _variant(authors, tmp_path / "file")
    (ckpt / DIFFUSION_CONFIG_FILE).write_text(json.dumps({"block_size": 8, "decoding": {"denoising_steps": 4}}))
    cfg = load_checkpoint(ckpt, device="cpu").config
    assert (cfg.block_size, cfg.settings.denoising_steps) == (8, 4)
    assert cfg.sources["block_size"] == SOURCE_FILE and cfg.sources["confidence_threshold"] == "package default"
    with caplog.at_level(logging.WARNING, logger="wam_diff2_core.config"):
        cfg = load_checkpoint(ckpt, device="cpu", overrides={"block_size": 16, "denoising_steps": None}).config
    assert (cfg.block_size, cfg.settings.denoising_steps) == (16, 4) and cfg.sources["block_size"] == SOURCE_USER
    assert "trained with" in caplog.text                          # 16 differs from the trained 8


@pytest.mark.parametrize("value", [0, "32", "abc", 1000000])
def test_a_bad_block_size_in_the_settings_file_names_the_file_and_field(authors, tmp_path, value):
    ckpt = _variant(authors, tmp_path / "bad")
    (ckpt / DIFFUSION_CONFIG_FILE).write_text(json.dumps({"block_size": value}))
    with pytest.raises(ConfigError, match=rf"{DIFFUSION_CONFIG_FILE}: block_size"):
        load_checkpoint(ckpt, device="cpu")


def test_infer_uses_the_authors_format_defaults_and_logs_where_they_came_from(authors, tmp_path, caplog):
    from PIL import Image
    Image.fromarray(np.full((64, 96, 3), 120, np.uint8)).save(tmp_path / "f.png")
    (tmp_path / "eval.json").write_text(json.dumps([{"id": "a", "image": ["f.png"], "conversations": [
        {"from": "human", "value": format_planning_prompt("right", (3.0, 0.0), (0.0, 0.0))}]}]))
    with caplog.at_level(logging.INFO, logger="wam_diff2_core.model.checkpoint"):
        assert main(["infer", "--model", str(authors), "--input", str(tmp_path / "eval.json"), "--output",
                     str(tmp_path / "p.json"), "--device", "cpu", "--max-new-tokens", "32"]) == 0
    record = json.loads((tmp_path / "p.json").read_text())[0]
    assert "error" not in record and record["stats"]["block_size"] == 32
    assert "wam_diff2 format" in caplog.text and "mask_token_id=151671 (from config.json)" in caplog.text


# ----------------------------------------------------------------------------- hub ids
def _lay_out_hub_cache(cache, repo_id, src):
    """The cache layout huggingface_hub writes (blobs, snapshots/<commit> links, refs/main)."""
    import hashlib
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(f"../../blobs/{blob.name}")
    return snap


def test_hub_ids_resolve_offline_from_the_cache_under_hf_home(tiny_checkpoint, tmp_path, monkeypatch):
    from huggingface_hub import scan_cache_dir
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snap = _lay_out_hub_cache(tmp_path / "hf" / "hub", "acme/wam-tiny", tiny_checkpoint)
    assert [r.repo_id for r in scan_cache_dir(tmp_path / "hf" / "hub").repos] == ["acme/wam-tiny"]
    assert resolve_checkpoint_path("acme/wam-tiny") == snap
    assert load_checkpoint("acme/wam-tiny", device="cpu").config.block_size == 32
    with pytest.raises(CheckpointError, match=r"hf download acme/absent"):
        resolve_checkpoint_path("acme/absent")
    assert resolve_checkpoint_path("no/such/dir").as_posix() == "no/such/dir"   # a path, not an id


# ----------------------------------------------------------------------------- convert
def test_convert_keeps_the_mask_id_config_json_names(qwen_labelled, tmp_path):
    out = tmp_path / "converted"
    assert main(["convert", str(qwen_labelled), str(out), "--block-size", "32"]) == 0
    stored = json.loads((out / DIFFUSION_CONFIG_FILE).read_text())
    assert stored["mask_token_id"] == AUTHORS_MASK_TOKEN_ID
    cfg = load_checkpoint(out, device="cpu").config
    assert cfg.mask_token_id == AUTHORS_MASK_TOKEN_ID and cfg.block_size == 32


# ----------------------------------------------------------------------------- memory and dtype
def test_cpu_auto_dtype_is_bf16_only_for_large_models_where_supported():
    import torch
    from wam_diff2_core.model.devices import CPU_BF16_MIN_PARAMETERS, cpu_supports_bf16, resolve_dtype
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, parameters=3_000_000) == torch.float32          # the demo models
    large = resolve_dtype("auto", cpu, parameters=CPU_BF16_MIN_PARAMETERS)
    assert large == (torch.bfloat16 if cpu_supports_bf16() else torch.float32)
    assert resolve_dtype("float32", cpu, parameters=10**10) == torch.float32           # explicit wins


def test_a_model_too_large_for_the_device_is_announced_before_loading(authors, monkeypatch, caplog):
    from wam_diff2_core.model import checkpoint
    from wam_diff2_core.model.checkpoint import count_parameters, read_model_config
    parameters = count_parameters(read_model_config(authors))
    assert 20_000_000 < parameters < 40_000_000       # two 151936 x 64 tables dominate
    monkeypatch.setattr(checkpoint, "available_memory", lambda device: 1_000_000)
    with caplog.at_level(logging.WARNING, logger="wam_diff2_core.model.checkpoint"):
        load_checkpoint(authors, device="cpu")
    assert "expect an out-of-memory failure" in caplog.text and "1.0 MB" not in caplog.text


# ----------------------------------------------------------------------------- every entry point
def test_bench_takes_the_block_size_from_the_checkpoint_unless_given(tiny_checkpoint, tmp_path):
    tiny_args = ["--device", "cpu", "--prompt-lengths", "16", "--repeats", "1", "--skip-decode",
                 "--variants", "plain", "--threads", "1"]
    assert main(["bench", "--model", str(tiny_checkpoint), *tiny_args, "--json", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["block_size"] == 32          # diffusion_config.json
    assert main(["bench", "--model", str(tiny_checkpoint), *tiny_args, "--block-size", "8",
                 "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["block_size"] == 8


def test_bench_refuses_an_ar_checkpoint_without_a_block_size_and_says_why(tmp_path, capsys):
    from wam_diff2_core.model.tiny import build_tiny_checkpoint
    ar = build_tiny_checkpoint(tmp_path / "ar", seed=1, diffusion=False)
    assert main(["bench", "--model", str(ar), "--device", "cpu", "--prompt-lengths", "16", "--repeats", "1",
                 "--skip-decode", "--variants", "plain"]) == 2
    assert "block_size: 1 (from qwen3_vl format (autoregressive))" in capsys.readouterr().err


def test_the_cli_flags_and_the_node_yaml_leave_decoding_to_the_checkpoint():
    """infer, eval-bag, closed-loop share these flags: none given hands no override to load_checkpoint;
    eval-bag --params-file reads the node's YAML, which leaves decoding unset. So every entry point
    resolves the same settings (the node: test_demo's AR / Block-32 runs of scripts/demo.sh)."""
    import argparse

    from wam_diff2_core.cli.common import add_decoding_arguments, decoding_overrides
    from wam_diff2_core.params.parameter_file import read_node_params
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser)
    assert decoding_overrides(parser.parse_args([])) == {}
    assert decoding_overrides(parser.parse_args(["--block-size", "4"])) == {"block_size": 4}
    node_values = read_node_params(REPO_ROOT / "config" / "planner.yaml")
    assert node_values and not any(k.startswith("decoding.") for k in node_values)


# ----------------------------------------------------------------------------- transformers 4.57
@pytest.mark.parametrize("kind", ["convert", "export"])
def test_written_folders_carry_the_fields_transformers_457_reads(qwen_labelled, tiny_checkpoint, tmp_path, kind):
    """transformers 4.57.3 (the authors' version) cannot be installed beside 5.x in CI, so this reads
    the files the way 4.57 does: text_config.rope_scaling (its rotary embedding calls
    ``rope_scaling.get("mrope_section")``) and rope_theta, and tokenizer_config.json without a *list*
    ``extra_special_tokens`` (4.57 calls ``.keys()`` on it). Checked by hand with 4.57.3 itself: these
    files, the converted and exported folders and the demo models load with identical logits."""
    from wam_diff2_core.model.tiny import build_tiny_checkpoint
    out = tmp_path / kind
    if kind == "convert":
        ar = build_tiny_checkpoint(tmp_path / "ar", seed=2, diffusion=False)
        assert main(["convert", str(ar), str(out)]) == 0
    else:
        assert main(["export", str(tiny_checkpoint), str(out)]) == 0
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["rope_scaling"]["mrope_section"] == text["rope_parameters"]["mrope_section"]
    assert text["rope_scaling"]["mrope_interleaved"] is True and text["rope_theta"] == 5_000_000.0
    tok = json.loads((out / "tokenizer_config.json").read_text())
    assert not isinstance(tok.get("extra_special_tokens"), list)
    loaded = load_checkpoint(out, device="cpu")                       # and 5.x reads them unchanged
    assert loaded.tokenizer.convert_ids_to_tokens(loaded.config.mask_token_id) == "<|mask|>"
    assert loaded.model.config.text_config.rope_parameters["mrope_section"] == [6, 5, 5]


def test_documented_memory_tables_are_what_the_script_prints():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "model_memory.py")], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    readme = (REPO_ROOT / "docs" / "checkpoints.md").read_text()
    assert "| 2B | 2.13 B | 4.3 GB | 8.5 GB |" in out and "| 8B | 8.77 B | 17.5 GB | 35.1 GB |" in out
    assert "| 2.13 B | 4.3 GB | 8.5 GB |" in readme and "| 8.77 B | 17.5 GB | 35.1 GB |" in readme
    assert "1920x1080 max_pixels=2073600: resized 1920x1056, 1980 image tokens" in out
    assert "| 1920 x 1080 | 1980 (resized 1920 x 1056) | 943 | 364 |" in readme
    assert "1600x900 max_pixels=2073600: resized 1600x896, 1400 image tokens" in out
    assert "| 1600 x 900 | 1400 (1600 x 896) | 943 | 364 |" in readme


@pytest.mark.ros
@pytest.mark.parametrize("labelling", ["authors", "qwen_labelled"])
def test_the_node_configures_either_labelling_with_the_checkpoints_settings(labelling, request):
    """The planner node with its YAML defaults (decoding.* unset) on the real-id-layout checkpoint:
    the authors' labelling decodes Block-32, the qwen3_vl labelling AR; the loaded policy plans."""
    rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from wam_diff2_core.geometry import EgoMotion
    from wam_diff2_ros.planner.node import PlannerNode
    from test.support.ros_helpers import unique_domain_id
    ckpt = request.getfixturevalue(labelling)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=unique_domain_id(9))
    node = PlannerNode("layout_planner", context=context, parameter_overrides=[
        Parameter("model_path", value=str(ckpt)), Parameter("autostart", value=False),
        Parameter("warmup", value=False), Parameter("parse_retry", value="none")])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS, node._model_message
        expected = 32 if labelling == "authors" else 1
        assert f"block size {expected}" in node._model_message
        config = node._policy.loaded.config
        assert config.mask_token_id == AUTHORS_MASK_TOKEN_ID and config.eos_token_id == 151645
        frame = np.full((48, 64, 3), 90, np.uint8)
        out = node._policy.step(frame, EgoMotion(velocity=(4.0, 0.0), acceleration=(0.0, 0.0)), "straight")
        assert out.plan.stats.block_size == expected and out.plan.stats.tokens >= 1
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)
