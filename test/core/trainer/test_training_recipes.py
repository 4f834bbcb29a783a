"""Every shipped stage runs on a tiny checkpoint and learns (fixed-noise validation loss goes
down); checkpoints load for inference; accumulation, frozen parts and activation checkpointing
keep the objective; atomic checkpoints; on-policy regeneration; bad samples are reported."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from test.support import REPO_ROOT
from wam_diff2_core.config import ConfigError, read_diffusion_file
from wam_diff2_core.model.ar_to_diffusion import convert_to_diffusion
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build_tiny_checkpoint
from wam_diff2_core.trainer.checkpointing import checkpoint_dirs, latest_checkpoint, read_metrics
from wam_diff2_core.trainer.training_config import load_training_config
from wam_diff2_core.trainer.evaluate import validation_loss
from wam_diff2_core.trainer.losses import LossSettings
from wam_diff2_core.trainer.optim import VISION_TOWER, part_of
from wam_diff2_core.trainer.recipes import DistillRecipe, FinetuneRecipe, run_stage
from wam_diff2_core.trainer.devices import apply_tf32
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset




TRAINING = REPO_ROOT / "training"
LR = 2e-3
STEPS = 12
# The tiny random models are very confident (a scaled-up LM head): at tau = 1 the JSD between two
# near one-hot distributions saturates near ln 2 and barely moves in a few steps; tau = 4
# softens both sides (forward KL learns at tau = 1 too).
TAU = 4.0


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data"), num_samples=4)


def overrides(model_path, data_file, out_dir, **extra):
    base = {"model.path": str(model_path), "data.train_file": str(data_file), "data.data_root": str(data_file.parent),
            "data.min_pixels": TINY_MIN_PIXELS, "data.max_pixels": TINY_MAX_PIXELS,
            "train.global_batch_size": 4, "train.micro_batch_size": 2, "train.max_steps": STEPS,
            "optim.lr": LR, "optim.merger_lr": LR, "optim.vision_lr": LR, "output.dir": str(out_dir),
            "output.save_every_steps": 0}
    base.update(extra)
    return base


def shipped(name, model_path, data_file, out_dir, **extra):
    return load_training_config(TRAINING / f"{name}.yaml", overrides(model_path, data_file, out_dir, **extra))


def val(path_or_loaded, data_file, block_size, **kw):
    loaded = path_or_loaded if not isinstance(path_or_loaded, (str, Path)) else load_checkpoint(
        path_or_loaded, device="cpu", dtype="float32")
    return validation_loss(loaded, data_file, block_size=block_size, data_root=data_file.parent,
                           min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS, **kw)


def check_run(final: Path, block_size: int, steps: int = STEPS):
    assert read_diffusion_file(final)["block_size"] == block_size
    records = read_metrics(final.parent)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert r["samples"] == 4 and r["tokens"] > 0 and r["samples_per_s"] > 0 and r["tokens_per_s"] > 0
        assert r["lr"] > 0 and r["grad_norm"] > 0
    return records


@pytest.fixture(scope="module")
def block4_run(tiny_checkpoint, data_file, tmp_path_factory):
    """Stage I at B = 4 (also the block-wise distillation teacher)."""
    out = tmp_path_factory.mktemp("runs") / "block4"
    return run_stage(shipped("block4", tiny_checkpoint, data_file, out))


def test_block4_stage_learns(tiny_checkpoint, data_file, block4_run):
    check_run(block4_run, 4)
    before, after = val(tiny_checkpoint, data_file, 4), val(block4_run, data_file, 4)
    assert after.loss < 0.5 * before.loss


@pytest.mark.parametrize("name,block_size", [("ar_pretrain", 1), ("block8", 8), ("block16", 16), ("block32", 32)])
def test_stage_learns(tiny_checkpoint, data_file, tmp_path, name, block_size):
    final = run_stage(shipped(name, tiny_checkpoint, data_file, tmp_path / name))
    check_run(final, block_size)
    before, after = val(tiny_checkpoint, data_file, block_size), val(final, data_file, block_size)
    assert after.loss < 0.5 * before.loss


def test_blockwise_distillation_learns_from_its_teacher(tiny_checkpoint, data_file, tmp_path, block4_run):
    cfg = shipped("distill_blockwise", tiny_checkpoint, data_file, tmp_path / "bw", **{
        "distill.teacher_path": str(block4_run), "diffusion.block_size": 8, "distill.teacher_block_size": 4,
        "distill.temperature": TAU})
    final = run_stage(cfg)
    records = check_run(final, 8)
    teacher = load_checkpoint(block4_run, device="cpu", dtype="float32").model
    kw = {"teacher": teacher, "teacher_block_size": 4, "settings": LossSettings(kd_ratio=1.0, temperature=TAU)}
    before, after = val(tiny_checkpoint, data_file, 8, **kw), val(final, data_file, 8, **kw)
    assert after.kd < 0.5 * before.kd
    assert after.overlap > before.overlap
    assert after.ce < before.ce            # the teacher knows the data: matching it lowers the CE too
    for r in records:
        assert 0.0 <= r["top5_overlap"] <= 1.0 and r["kd"] > 0 and r["teacher_block_size"] == 4


def test_modelwise_distillation_from_a_wider_teacher(tiny_checkpoint, data_file, tmp_path):
    teacher_dir = build_tiny_checkpoint(tmp_path / "teacher", seed=1, hidden_size=192, layers=3)
    cfg = shipped("distill_modelwise", tiny_checkpoint, data_file, tmp_path / "mw", **{
        "distill.teacher_path": str(teacher_dir), "distill.temperature": TAU})
    final = run_stage(cfg)
    check_run(final, 32)
    teacher = load_checkpoint(teacher_dir, device="cpu", dtype="float32").model
    kw = {"teacher": teacher, "teacher_block_size": 32, "settings": LossSettings(kd_ratio=1.0, temperature=TAU)}
    before, after = val(tiny_checkpoint, data_file, 32, **kw), val(final, data_file, 32, **kw)
    assert after.kd < 0.7 * before.kd


def test_teacher_reads_with_its_own_block_size(tiny_checkpoint, data_file, tmp_path, block4_run):
    """The teacher's hidden states are those of a forward under the B_t mask, not the student's."""
    from wam_diff2_core.trainer.losses import teacher_hidden_states
    cfg = shipped("distill_blockwise", tiny_checkpoint, data_file, tmp_path / "t", **{
        "distill.teacher_path": str(block4_run), "diffusion.block_size": 8, "distill.teacher_block_size": 0})
    recipe = DistillRecipe(cfg)
    recipe.setup()
    try:
        assert recipe.teacher_block_size == 4              # 0 = the block size stored with the teacher
        examples = [recipe.dataset[i] for i in range(2)]
        for i, e in enumerate(examples):
            e.position = i
        batch = recipe.make_batch(examples)
        assert (batch.layout.response_lengths % 8 == 0).all()
        got = recipe.loss_inputs(batch)["teacher_hidden"]
        with torch.no_grad():
            own = recipe.teacher.model(**batch.model_inputs(batch.mask_for(4)), use_cache=False)
            students = recipe.teacher.model(**batch.model_inputs(batch.mask_for(8)), use_cache=False)
        torch.testing.assert_close(got, own.last_hidden_state.flatten(0, 1)[batch.target_index])
        assert not torch.allclose(got, students.last_hidden_state.flatten(0, 1)[batch.target_index], atol=1e-3)
        # an AR teacher reads the clean token before each target
        ar = teacher_hidden_states(recipe.teacher, batch, 1)
        with torch.no_grad():
            causal = recipe.teacher.model(**batch.model_inputs(batch.mask_for(1)), use_cache=False)
        torch.testing.assert_close(ar, causal.last_hidden_state.flatten(0, 1)[batch.ar_predecessor_index])
    finally:
        recipe.cleanup()


def test_an_ar_teacher_needs_no_mask_id_of_its_own(data_file, tmp_path):
    """An AR teacher (B_t = 1) reads only the clean tokens: a stock Qwen3-VL checkpoint (no mask token,
    no diffusion settings) guides the diffusion student converted from it; read with B_t = 4 it would see the student's
    MASKs, and the mismatch is refused, naming both ids."""
    teacher = build_tiny_checkpoint(tmp_path / "ar", diffusion=False)
    student = convert_to_diffusion(teacher, tmp_path / "student", block_size=8)
    overrides = {"distill.teacher_path": str(teacher), "diffusion.block_size": 8, "distill.teacher_block_size": 1}
    recipe = DistillRecipe(shipped("distill_blockwise", student, data_file, tmp_path / "d1", **overrides))
    recipe.setup()
    try:
        assert recipe.teacher_block_size == 1
        assert recipe.teacher.config.get_text_config().vocab_size == recipe.hf_model.config.get_text_config().vocab_size
    finally:
        recipe.cleanup()
    overrides["distill.teacher_block_size"] = 4
    recipe = DistillRecipe(shipped("distill_blockwise", student, data_file, tmp_path / "d4", **overrides))
    with pytest.raises(ConfigError, match="mask token id .* differs from the student's"):
        recipe.setup()
    recipe.cleanup()


def test_on_policy_regenerates_every_interval(tiny_checkpoint, data_file, tmp_path, block4_run, monkeypatch):
    cfg = shipped("distill_blockwise", tiny_checkpoint, data_file, tmp_path / "op", **{
        "distill.teacher_path": str(block4_run), "diffusion.block_size": 8, "distill.teacher_block_size": 4,
        "distill.on_policy": True, "distill.generate_interval": 2, "train.max_steps": 5})
    calls = []
    original = DistillRecipe.regenerate

    def spy(self, examples):
        out = original(self, examples)
        calls.append((self.step, [e.id for e in examples], out))
        # the student's own answers: its decoder output, then EOS
        from wam_diff2_core.decoding.decoder import BlockDiffusionDecoder
        from wam_diff2_core.trainer.training_data import prompt_batch
        settings = self.diffusion.settings.replace(block_size=8, max_new_tokens=max(
            -(-len(e.response_ids) // 8) * 8 for e in examples))
        again = BlockDiffusionDecoder(self.hf_model, self.diffusion).generate(prompt_batch(examples, 0), settings)
        for seq, new in zip(again.sequences, out):
            assert new.response_ids.tolist() == seq + [self.diffusion.eos_token_id]
        return out

    monkeypatch.setattr(DistillRecipe, "regenerate", spy)
    final = run_stage(cfg)
    assert sorted({step for step, _, _ in calls}) == [0, 2, 4]
    assert len(calls) == 3 * 2                             # two micro-batches per step
    records = read_metrics(final.parent)
    assert [r["on_policy_step"] for r in records] == [True, False, True, False, True]


def test_final_checkpoint_decodes_with_infer(data_file, block4_run, tmp_path):
    from wam_diff2_core.cli import main
    out = tmp_path / "preds.jsonl"
    assert main(["infer", "--model", str(block4_run), "--input", str(data_file), "--output", str(out),
                 "--device", "cpu", "--max-new-tokens", "16"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all("prediction" in r for r in records)
    loaded = load_checkpoint(block4_run, device="cpu")
    assert loaded.config.block_size == 4
    assert loaded.processor.image_processor.size == {"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS}


def test_a_trained_checkpoint_keeps_the_camera_block_of_the_model_it_started_from(tiny_checkpoint, data_file,
                                                                                    tmp_path, block4_run):
    """The camera a model was trained with (diffusion_config.json's camera block, read by the leaderboard agent)
    is carried from the starting checkpoint into the checkpoints a stage writes; none is made up."""
    import shutil
    from wam_diff2_core.camera_rig import PRESETS, read_camera_block
    start = tmp_path / "start"
    shutil.copytree(tiny_checkpoint, start)
    config = json.loads((start / "diffusion_config.json").read_text())
    (start / "diffusion_config.json").write_text(json.dumps({**config, "camera": dataclasses.asdict(PRESETS["demo"])}))
    final = run_stage(shipped("block8", start, data_file, tmp_path / "run", **{"train.max_steps": 1}))
    assert read_camera_block(final) == PRESETS["demo"]
    assert read_camera_block(tiny_checkpoint) is None and read_camera_block(block4_run) is None


# ---------------------------------------------------------------- equivalences of the step
def _gradients(cfg):
    recipe = FinetuneRecipe(cfg)
    recipe.setup()
    try:
        from wam_diff2_core.trainer.training_data import make_loader
        loader = iter(make_loader(recipe.dataset, recipe.order, recipe.plan, 0, 1))
        result = recipe.backward_step(0, [next(loader) for _ in range(recipe.plan.accumulation_steps)])
        grads = {n: p.grad.clone() for n, p in recipe.hf_model.named_parameters() if p.grad is not None}
        result.activation_checkpointing = recipe.hf_model.is_activation_checkpointing
        return result, grads
    finally:
        recipe.cleanup()


def test_accumulated_micro_batches_equal_one_big_batch(tiny_checkpoint, data_file, tmp_path):
    big, g_big = _gradients(shipped("block8", tiny_checkpoint, data_file, tmp_path / "a",
                                    **{"train.micro_batch_size": 4}))
    small, g_small = _gradients(shipped("block8", tiny_checkpoint, data_file, tmp_path / "b",
                                        **{"train.micro_batch_size": 1}))
    assert big.samples == small.samples == 4
    assert small.loss == pytest.approx(big.loss, rel=1e-5)
    assert g_big.keys() == g_small.keys() and len(g_big) > 50
    for name in g_big:     # float32 sums in another order: tolerance relative to the tensor's scale
        scale = float(g_big[name].abs().max())
        torch.testing.assert_close(g_small[name], g_big[name], rtol=1e-4, atol=1e-5 * scale)


def test_activation_checkpointing_keeps_the_gradients(tiny_checkpoint, data_file, tmp_path):
    plain, g_plain = _gradients(shipped("block4", tiny_checkpoint, data_file, tmp_path / "a"))
    ckpt, g_ckpt = _gradients(shipped("block4", tiny_checkpoint, data_file, tmp_path / "b",
                                      **{"model.activation_checkpointing": True}))
    assert ckpt.activation_checkpointing and not plain.activation_checkpointing
    assert ckpt.loss == pytest.approx(plain.loss, rel=1e-6)
    for name in g_plain:
        scale = float(g_plain[name].abs().max())
        torch.testing.assert_close(g_ckpt[name], g_plain[name], rtol=1e-4, atol=1e-5 * scale)


def test_frozen_vision_tower_stays_fixed(tiny_checkpoint, data_file, tmp_path):
    final = run_stage(shipped("block4", tiny_checkpoint, data_file, tmp_path / "f",
                              **{"model.freeze_vision_tower": True, "train.max_steps": 2}))
    before = dict(load_checkpoint(tiny_checkpoint, device="cpu", dtype="float32").model.named_parameters())
    after = dict(load_checkpoint(final, device="cpu", dtype="float32").model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(part_of(n) != VISION_TOWER for n in changed)
    assert any(".merger." in n for n in changed)


# ---------------------------------------------------------------- run directories
def test_existing_run_needs_resume_and_a_finished_run_is_kept(tiny_checkpoint, data_file, tmp_path):
    cfg = shipped("block4", tiny_checkpoint, data_file, tmp_path / "r", **{"train.max_steps": 1})
    final = run_stage(cfg)
    stamp = (final / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ConfigError, match="--resume"):
        run_stage(cfg)
    assert run_stage(cfg, resume=True) == final               # finished: nothing to do
    assert (final / "model.safetensors").stat().st_mtime_ns == stamp


def test_time_limit_stops_at_a_step_and_writes_final_with_the_steps_done(tiny_checkpoint, data_file, tmp_path):
    """train.time_limit_s: the run stops after the step during which the limit passed, writes final/ (the model
    of that step, loadable), marks the last metrics line, saves no resumable checkpoint it would only delete."""
    out = tmp_path / "limited"
    cfg = shipped("block4", tiny_checkpoint, data_file, out, **{"train.time_limit_s": 1e-6, "output.save_every_steps": 1})
    final = run_stage(cfg)
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1] and records[0]["stopped_at_time_limit_s"] == 1e-6
    assert checkpoint_dirs(out) == [] and read_diffusion_file(final)["block_size"] == 4
    load_checkpoint(final, device="cpu", dtype="float32")
    assert run_stage(cfg, resume=True) == final               # a stopped run is a finished one
    unlimited = read_metrics(run_stage(cfg.replace(**{"train.time_limit_s": 0.0, "train.max_steps": 2,
                                                      "output.dir": str(tmp_path / "unlimited")})).parent)
    assert [r["step"] for r in unlimited] == [1, 2] and not any("stopped_at_time_limit_s" in r for r in unlimited)


def test_tf32_is_set_for_cuda_only_and_only_when_asked():
    matmul = torch.backends.cuda.matmul          # a module-like object: monkeypatch cannot restore its flags
    attribute = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, attribute)
    try:
        assert not apply_tf32(False, "cuda") and not apply_tf32(True, "cpu")
        assert getattr(matmul, attribute) == before
        assert apply_tf32(True, "cuda") and getattr(matmul, attribute) in ("tf32", True)
    finally:
        setattr(matmul, attribute, before)


def test_checkpoint_write_is_atomic(tiny_checkpoint, data_file, tmp_path, monkeypatch):
    """A failure while a checkpoint is written leaves no directory that looks complete, and a
    resume continues from the last complete one."""
    out = tmp_path / "atomic"
    cfg = shipped("block4", tiny_checkpoint, data_file, out, **{"train.max_steps": 6, "output.save_every_steps": 2})
    original = FinetuneRecipe._write_hf
    calls = {"n": 0}

    def failing(self, target):
        calls["n"] += 1
        original(self, target)                    # weights and processor are on disk...
        if calls["n"] == 2:
            raise OSError("disk full")            # ...and then the write fails

    monkeypatch.setattr(FinetuneRecipe, "_write_hf", failing)
    with pytest.raises(OSError, match="disk full"):
        run_stage(cfg)
    assert [step for step, _ in checkpoint_dirs(out)] == [2]
    assert not (out / "final").exists()
    leftovers = [p.name for p in (out / "checkpoints").iterdir()]
    assert sorted(leftovers) == [".step-000004.partial", "step-000002"]
    monkeypatch.setattr(FinetuneRecipe, "_write_hf", original)
    final = run_stage(cfg, resume=True)
    assert latest_checkpoint(out).name == "step-000004"
    assert [r["step"] for r in read_metrics(out)] == list(range(1, 7))
    assert final.is_dir()


def test_bad_samples_are_skipped_and_logged_in_metrics(tiny_checkpoint, tmp_path):
    data = write_tiny_dataset(tmp_path / "data", num_samples=4)
    (tmp_path / "data" / "images" / "002.png").write_bytes(b"broken")
    final = run_stage(shipped("block4", tiny_checkpoint, data, tmp_path / "s", **{"train.max_steps": 2}))
    records = read_metrics(final.parent)
    assert all(r["skipped"] == ["tiny-002"] and r["samples"] == 3 for r in records)
    with pytest.raises(Exception, match="tiny-002"):
        run_stage(shipped("block4", tiny_checkpoint, data, tmp_path / "t", **{"data.on_error": "fail"}))


def test_bf16_autocast_and_bf16_teacher(tiny_checkpoint, data_file, tmp_path):
    """bf16 autocast (here on the CPU) with float32 trained weights and a bf16 teacher."""
    cfg = shipped("distill_modelwise", tiny_checkpoint, data_file, tmp_path / "bf16", **{
        "distill.teacher_path": str(tiny_checkpoint), "distill.teacher_dtype": "bfloat16",
        "train.mixed_precision": "bf16", "distill.temperature": TAU, "distill.kd_ratio": 0.5, "train.max_steps": 2})
    recipe = DistillRecipe(cfg)
    recipe.setup()
    try:
        assert recipe.accelerator.mixed_precision == "bf16"
        assert recipe.teacher.dtype == torch.bfloat16 and recipe.hf_model.dtype == torch.float32
        recipe.train()
    finally:
        recipe.cleanup()
    records = read_metrics(tmp_path / "bf16")
    assert len(records) == 2 and all(torch.isfinite(torch.tensor([r["loss"], r["kd"], r["ce"]])).all()
                                     for r in records)
    # the next recipe in this process may run without autocast again
    final = run_stage(shipped("block4", tiny_checkpoint, data_file, tmp_path / "fp32", **{"train.max_steps": 1}))
    assert final.is_dir()


def test_ar_pretraining_then_convert_then_block4(data_file, tmp_path):
    """Phase 1 on a stock AR checkpoint (no <|mask|>), then `wam-diff2 convert`, then Stage I."""
    from wam_diff2_core.model.ar_to_diffusion import convert_to_diffusion
    ar = build_tiny_checkpoint(tmp_path / "ar", seed=0, diffusion=False)
    ar_final = run_stage(shipped("ar_pretrain", ar, data_file, tmp_path / "phase1", **{"train.max_steps": 3}))
    assert not (ar_final / "diffusion_config.json").exists()           # still an AR checkpoint
    assert load_checkpoint(ar_final, device="cpu").config.block_size == 1
    with pytest.raises(ConfigError, match="convert"):
        run_stage(shipped("block4", ar_final, data_file, tmp_path / "too-early", **{"train.max_steps": 1}))
    converted = convert_to_diffusion(ar_final, tmp_path / "init", block_size=4)
    final = run_stage(shipped("block4", converted, data_file, tmp_path / "block4", **{"train.max_steps": 3}))
    assert read_diffusion_file(final)["block_size"] == 4
