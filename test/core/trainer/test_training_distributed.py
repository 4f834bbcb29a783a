"""Two processes (torchrun, gloo on CPU) give the loss and the gradients of one process with the
combined batch, and the same losses over the following updates; for the finetune recipe and
for on-policy distillation (teacher forward, regeneration and rho_K under DDP)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from test.support import REPO_ROOT as REPO
from wam_diff2_core.model.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from wam_diff2_core.trainer.tiny_data import write_tiny_dataset

STEPS = 3

# For each (config, overrides) job: one optimizer step's forward/backward through the recipe,
# its loss and synchronised gradients, then the update and two more full steps.
HELPER = r'''
import json, sys, torch
from wam_diff2_core.trainer.training_config import load_training_config
from wam_diff2_core.trainer.training_data import make_loader
from wam_diff2_core.trainer.recipes import RECIPES


def run_job(config, overrides, steps):
    cfg = load_training_config(config, overrides)
    recipe = RECIPES[cfg.recipe](cfg)
    recipe.setup()
    loader = iter(make_loader(recipe.dataset, recipe.order, recipe.plan, 0, steps))
    accum = recipe.plan.accumulation_steps
    first = recipe.backward_step(0, [next(loader) for _ in range(accum)])
    grads = {n: p.grad.detach().clone() for n, p in recipe.hf_model.named_parameters() if p.grad is not None}
    recipe.apply_update(first)
    losses = [first.loss]
    for step in range(1, steps):
        result = recipe.backward_step(step, [next(loader) for _ in range(accum)])
        recipe.apply_update(result)
        losses.append(result.loss)
    out = {"losses": losses, "grads": grads, "samples": first.samples, "overlap": first.overlap,
           "processes": recipe.accelerator.num_processes, "accum": accum,
           "main": recipe.accelerator.is_main_process}
    recipe.cleanup()
    return out


if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    results = [run_job(job["config"], job["overrides"], job["steps"]) for job in jobs]
    if results[0]["main"]:
        torch.save(results, sys.argv[2])
'''




def _jobs(model, data, tmp_path, tag, micro_finetune, micro_distill):
    common = ["--model.path", str(model), "--data.train_file", str(data), "--data.data_root", str(data.parent),
              "--data.min_pixels", str(TINY_MIN_PIXELS), "--data.max_pixels", str(TINY_MAX_PIXELS),
              "--train.global_batch_size", "4", "--train.max_steps", str(STEPS), "--optim.lr", "2e-3",
              "--output.save_every_steps", "0", "--train.device", "cpu"]
    finetune = {"config": str(REPO / "training" / "block8.yaml"), "steps": STEPS, "overrides": common + [
        "--train.micro_batch_size", str(micro_finetune), "--output.dir", str(tmp_path / f"{tag}-finetune")]}
    distill = {"config": str(REPO / "training" / "distill_blockwise.yaml"), "steps": STEPS, "overrides": common + [
        "--distill.teacher_path", str(model), "--distill.teacher_block_size", "4", "--diffusion.block_size", "8",
        "--distill.temperature", "4", "--distill.on_policy", "true", "--distill.max_new_tokens", "8",
        "--train.micro_batch_size", str(micro_distill), "--output.dir", str(tmp_path / f"{tag}-distill")]}
    return [finetune, distill]


def _in_process(jobs):
    namespace: dict = {}
    exec(compile(HELPER, "ddp_helper", "exec"), namespace)
    return [namespace["run_job"](job["config"], job["overrides"], job["steps"]) for job in jobs]


def _two_processes(jobs, tmp_path):
    helper, spec, out = tmp_path / "ddp_helper.py", tmp_path / "jobs.json", tmp_path / "two.pt"
    helper.write_text(HELPER)
    spec.write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(helper),
           str(spec), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.slow
def test_two_processes_equal_one_with_the_combined_batch(tiny_checkpoint, tmp_path):
    data = write_tiny_dataset(tmp_path / "data", num_samples=8)
    # one process: the whole global batch of 4 in one micro-batch
    one = _in_process(_jobs(tiny_checkpoint, data, tmp_path, "one", micro_finetune=4, micro_distill=4))
    # two processes: finetune 2 x 2 accumulated micro-batches of 1; distillation 2 x 1 micro-batch of 2
    two = _two_processes(_jobs(tiny_checkpoint, data, tmp_path, "two", micro_finetune=1, micro_distill=2), tmp_path)
    assert [r["accum"] for r in one] == [1, 1] and [r["accum"] for r in two] == [2, 1]
    for a, b in zip(one, two):
        assert (a["processes"], b["processes"]) == (1, 2)
        assert a["samples"] == b["samples"] == 4
        assert b["losses"] == pytest.approx(a["losses"], rel=1e-5)
        assert a["grads"].keys() == b["grads"].keys() and len(a["grads"]) > 50
        for name, g in a["grads"].items():
            scale = float(g.abs().max())
            torch.testing.assert_close(b["grads"][name], g, rtol=1e-4, atol=1e-5 * scale, msg=name)
    assert one[1]["overlap"] is not None
    assert two[1]["overlap"] == pytest.approx(one[1]["overlap"], rel=1e-6)


@pytest.mark.slow
def test_two_processes_save_and_resume_exactly(tiny_checkpoint, tmp_path):
    """Each process writes and reads its own RNG file; the main one the optimizer and scheduler."""
    import shutil
    from safetensors.torch import load_file
    from wam_diff2_core.trainer.checkpointing import loss_curve, read_metrics
    data = write_tiny_dataset(tmp_path / "data", num_samples=8)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}

    def train(out, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "wam_diff2_core.trainer", "--log-level", "WARNING", "--config", str(REPO / "training" / "block8.yaml"),
               "--model.path", str(tiny_checkpoint), "--data.train_file", str(data), "--data.data_root",
               str(data.parent), "--data.min_pixels", str(TINY_MIN_PIXELS), "--data.max_pixels",
               str(TINY_MAX_PIXELS), "--train.global_batch_size", "4", "--train.micro_batch_size", "1",
               "--train.max_steps", "4", "--optim.lr", "2e-3", "--output.save_every_steps", "2",
               "--train.device", "cpu", "--output.dir", str(out), *extra]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    train(straight)
    state = straight / "checkpoints" / "step-000002" / "trainer_state"
    assert {"rng-0.safetensors", "rng-1.safetensors", "optimizer.safetensors"} <= {p.name for p in state.iterdir()}
    shutil.copytree(straight, resumed)                     # as if stopped right after the step-2 checkpoint
    shutil.rmtree(resumed / "final")
    train(resumed, "--resume")
    assert loss_curve(read_metrics(resumed)) == loss_curve(read_metrics(straight))
    a, b = (load_file(str(run / "final" / "model.safetensors")) for run in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
