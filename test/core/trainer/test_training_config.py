"""Training settings: every shipped YAML loads and carries the paper's settings; overrides and
unknown keys; the README's settings table; the accelerate launcher configs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from test.support import REPO_ROOT as REPO
from wam_diff2_core.config import ConfigError
from wam_diff2_core.model.prompt_encoding import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
from wam_diff2_core.trainer.training_config import (TrainingConfig, check_required, load_training_config, parse_mix,
                                                    parse_overrides, settings_table)
from wam_diff2_core.trainer.recipes import curriculum_stages

TRAINING = REPO / "training"
SHIPPED = sorted(TRAINING.glob("*.yaml"))
DEMO = sorted((TRAINING / "demo").glob("*.yaml"))      # the demo models' recipe (scripts/train_demo.sh)
EXPECTED = {"ar_pretrain", "block4", "block8", "block16", "block32", "curriculum", "distill_blockwise",
            "distill_modelwise"}


def test_the_paper_configs_are_shipped():
    assert {p.stem for p in SHIPPED} == EXPECTED


@pytest.mark.parametrize("path", SHIPPED + DEMO, ids=lambda p: str(p.relative_to(TRAINING)))
def test_shipped_yaml_loads_validates_and_shows_its_command(path):
    cfg = load_training_config(path)
    check_required(cfg)
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    header = re.sub(r"\\\s+", " ", header)                        # join shell line continuations
    command = re.compile(r"(wam-diff2 train|-m wam_diff2_core\.trainer)\b[^#]*?--config training/"
                         + re.escape(path.relative_to(TRAINING).as_posix()))
    assert command.search(header), f"{path.name}: header shows no command that runs it"
    # every key the YAML sets is one the config knows (load would have raised otherwise) and is not dead
    assert yaml.safe_load(path.read_text())


def _stage_i_settings(cfg: TrainingConfig):
    o, t = cfg.optim, cfg.train
    assert (o.lr, o.merger_lr, o.vision_lr, o.weight_decay) == (4e-5, 4e-5, 2e-6, 0.05)
    assert (o.beta1, o.beta2, o.max_grad_norm) == (0.9, 0.95, 1.0)
    assert (o.warmup_start_factor, o.warmup_max_steps, o.warmup_fraction, o.final_lr_factor) == (0.1, 1000, 0.1, 0.01)
    assert (t.global_batch_size, t.epochs) == (128, 5.0)
    assert not cfg.model.freeze_vision_tower


def test_shipped_settings_are_the_papers():
    load = {p.stem: load_training_config(p) for p in SHIPPED}
    assert load["ar_pretrain"].diffusion.block_size == 1 and load["ar_pretrain"].train.epochs == 5
    for b in (4, 8, 16, 32):
        assert load[f"block{b}"].diffusion.block_size == b
        _stage_i_settings(load[f"block{b}"])
    assert load["curriculum"].curriculum.block_sizes == [4, 8, 16, 32]
    _stage_i_settings(load["curriculum"])
    bw = load["distill_blockwise"]
    assert bw.recipe == "distill" and (bw.diffusion.block_size, bw.distill.teacher_block_size) == (32, 4)
    assert (bw.distill.loss, bw.distill.beta, bw.distill.kd_ratio, bw.distill.generate_interval) == ("jsd", 0.5, 1.0, 2)
    mw = load["distill_modelwise"]
    assert (mw.diffusion.block_size, mw.distill.teacher_block_size) == (32, 32)
    assert (mw.optim.lr, mw.optim.vision_lr, mw.optim.weight_decay, mw.train.epochs) == (5e-6, 2e-6, 0.0, 5.0)
    assert (mw.distill.loss, mw.distill.beta, mw.distill.kd_ratio) == ("jsd", 0.5, 1.0)


def test_block_stage_configs_chain_their_outputs():
    cfgs = {b: load_training_config(TRAINING / f"block{b}.yaml") for b in (4, 8, 16, 32)}
    for prev, nxt in ((4, 8), (8, 16), (16, 32)):
        assert Path(cfgs[nxt].model.path) == Path(cfgs[prev].output.dir) / "final"
    blockwise = load_training_config(TRAINING / "distill_blockwise.yaml")
    modelwise = load_training_config(TRAINING / "distill_modelwise.yaml")
    assert Path(modelwise.model.path) == Path(blockwise.output.dir) / "final"


def test_curriculum_stages_start_from_the_previous_output():
    cfg = load_training_config(TRAINING / "curriculum.yaml", ["--output.dir", "/runs/c", "--model.path", "/m/init"])
    stages = curriculum_stages(cfg)
    assert [s.diffusion.block_size for s in stages] == [4, 8, 16, 32]
    assert [s.model.path for s in stages] == ["/m/init", "/runs/c/block4/final", "/runs/c/block8/final",
                                              "/runs/c/block16/final"]
    assert [s.output.dir for s in stages] == [f"/runs/c/block{b}" for b in (4, 8, 16, 32)]
    assert all(s.curriculum.block_sizes == [] and s.optim == cfg.optim for s in stages)


def test_defaults_come_from_one_place():
    cfg = TrainingConfig()
    assert (cfg.data.min_pixels, cfg.data.max_pixels) == (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)


def test_readme_settings_table_matches_the_config():
    readme = (TRAINING / "README.md").read_text()
    assert settings_table() in readme


# ---------------------------------------------------------------- overrides and errors
def test_overrides_are_typed_like_the_yaml():
    cfg = load_training_config(TRAINING / "block4.yaml", [
        "--optim.lr", "1e-5", "--train.max_steps=7", "--curriculum.block_sizes", "[4, 8]",
        "--model.freeze_vision_tower", "true", "--recipe", "finetune", "--train.epochs", "2"])
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.train.max_steps == 7 and cfg.curriculum.block_sizes == [4, 8]
    assert cfg.model.freeze_vision_tower is True and cfg.train.epochs == 2.0
    assert parse_overrides(["--a.b=x y"]) == {"a.b": "x y"}
    cfg = load_training_config(TRAINING / "block4.yaml", ["--data.mix", "[dagger/train.json*3, more.jsonl]"])
    assert parse_mix(cfg.data.mix) == [(Path("dagger/train.json"), 3), (Path("more.jsonl"), 1)]


def test_yaml_booleans_are_only_true_and_false(tmp_path):
    # YAML 1.1 reads no/yes/on/off as booleans; a choice named "no" must stay a string
    cfg = load_training_config(TRAINING / "block4.yaml", ["--train.mixed_precision", "no"])
    assert cfg.train.mixed_precision == "no"
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  mixed_precision: no\ndata:\n  shuffle: False\n")
    cfg = load_training_config(path)
    assert cfg.train.mixed_precision == "no" and cfg.data.shuffle is False
    with pytest.raises(ConfigError, match="data.shuffle: expected bool, got 'yes'"):
        load_training_config(path, ["--data.shuffle", "yes"])


@pytest.mark.parametrize("args,key", [
    (["--optim.lrr", "1"], "optim.lrr"),
    (["--trian.epochs", "1"], "trian.epochs"),
    (["--bogus", "1"], "bogus"),
    (["--optim.lr.x", "1"], "optim.lr.x"),
])
def test_unknown_override_is_an_error_naming_the_key(args, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_training_config(TRAINING / "block4.yaml", args)


def test_unknown_yaml_key_is_an_error_naming_the_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: 1.0e-4\n  warmpu_steps: 10\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*optim\.warmpu_steps"):
        load_training_config(bad)


@pytest.mark.parametrize("args,message", [
    (["--train.max_steps", "1.5"], "train.max_steps: expected int"),
    (["--diffusion.block_size", "0"], "diffusion.block_size: 0 is below 1"),
    (["--distill.loss", "l2"], "distill.loss: 'l2' is not one of jsd"),
    (["--train.global_batch_size", "10", "--train.micro_batch_size", "3"], "not a multiple"),
    (["--model.freeze_vision_tower", "maybe"], "model.freeze_vision_tower: expected bool"),
    (["--curriculum.block_sizes", "[4, 0]"], "curriculum.block_sizes[1]: 0 is below 1"),
    (["--data.mix", "[a.json, 3]"], "data.mix: expected a list of str"),
    (["--data.mix", "[a.json, 'b.json*0']"], "data.mix[1]: 'b.json*0' is not FILE or FILE*N with N >= 1"),
    (["--data.mix", "['*2']"], "data.mix[0]"),
])
def test_invalid_values_name_the_field(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_training_config(TRAINING / "block4.yaml", args)


def test_required_settings():
    with pytest.raises(ConfigError, match="model.path"):
        check_required(load_training_config(None))
    cfg = load_training_config(TRAINING / "distill_blockwise.yaml", ["--distill.teacher_path", ""])
    with pytest.raises(ConfigError, match="distill.teacher_path"):
        check_required(cfg)


def test_cli_reports_an_unknown_key_and_prints_config(capsys):
    from wam_diff2_core.cli import main
    assert main(["train", "--config", str(TRAINING / "block8.yaml"), "--optim.lrr", "1"]) == 2
    assert "optim.lrr" in capsys.readouterr().err
    assert main(["train", "--config", str(TRAINING / "block8.yaml"), "--print-config", "--optim.lr", "3e-5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 3e-5 and printed["diffusion"]["block_size"] == 8


# ---------------------------------------------------------------- launcher configs
ACCELERATE = sorted((TRAINING / "accelerate").glob("*.yaml"))


def test_accelerate_configs_are_shipped():
    assert {p.stem for p in ACCELERATE} >= {"ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp"}


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.stem)
def test_accelerate_config_is_valid(path):
    from accelerate.commands.config.config_args import ClusterConfig
    cfg = ClusterConfig.from_yaml_file(str(path))       # raises on keys accelerate does not know
    expected = {"ddp": "MULTI_GPU", "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED", "fsdp": "FSDP"}
    assert str(cfg.distributed_type).split(".")[-1] == expected[path.stem]
    assert cfg.mixed_precision == "bf16"
    if cfg.deepspeed_config:
        assert cfg.deepspeed_config["zero_stage"] == int(path.stem[-1])
        # accumulation comes from the recipe (global batch / micro batch / processes)
        assert "gradient_accumulation_steps" not in cfg.deepspeed_config
    if cfg.fsdp_config:
        from transformers.models.qwen3_vl import modeling_qwen3_vl
        for cls in cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"].split(","):
            assert hasattr(modeling_qwen3_vl, cls)
    assert "-m wam_diff2_core.trainer" in path.read_text().splitlines()[1] + path.read_text().splitlines()[2]


def test_module_entry_point_reports_an_unknown_key(capsys):
    """``python -m wam_diff2_core.trainer`` (torchrun / accelerate launch) takes the same arguments."""
    from wam_diff2_core.trainer.__main__ import main
    assert main(["--config", str(TRAINING / "block4.yaml"), "--loss.chunksize", "8"]) == 2
    assert "loss.chunksize" in capsys.readouterr().err
