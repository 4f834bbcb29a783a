"""Finetune recipe: train one block size B on a data file (B = 1: AR pretraining).

    wam-diff2 train --config training/block4.yaml --data.train_file train.json

setup -> train -> cleanup, like a torchtune recipe. One optimizer step runs this process's micro-batches
(training_data.py fixes which samples, noise.py lays them out) through the student and its loss as one module,
so DDP / FSDP / DeepSpeed see the whole graph, each scaled so the step's gradient is the mean over the global
batch's samples; then clip, AdamW and the schedule. distill.py and vision.py extend it through the hooks.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import torch

from ...camera_rig import read_camera_block
from ...config import ConfigError, write_diffusion_file
from ...data.samples import SampleError
from ...images import ImageLimits
from ...model.saving import save_checkpoint
from ...model.prompt_encoding import pixel_size
from ...utils.atomic import atomic_write_text
from ...utils.run_lock import RUN_LOCK, RunLock
from ..checkpointing import (CHECKPOINTS, FINAL, METRICS, TRAINER_STATE, append_metrics, begin_partial,
                             latest_checkpoint, partial_path, prune_checkpoints, publish, read_progress, step_dir_name,
                             truncate_metrics, write_progress)
from ..devices import apply_tf32, make_accelerator
from ..training_config import TrainingConfig, check_required, dump_yaml, parse_mix
from ..trainer_state import load_trainer_state, refuse_pickles, save_trainer_state
from ..training_data import BatchPlan, DataOrder, Example, SampleDataset, make_loader, total_steps
from ..losses import DiffusionObjective, LossSettings, objective_inputs
from ..noise import TrainingBatch, build_batch
from ..optim import build_optimizer, build_scheduler, freeze_vision_tower

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    step: int
    loss: float
    ce: float
    kd: float
    overlap: float | None
    samples: int
    tokens: int
    targets: int
    skipped: list[str]
    grad_norm: float | None = None
    lr: float | None = None


class FinetuneRecipe:
    """Masked-diffusion finetuning at one block size (B = 1: causal next-token training)."""

    reports_overlap = False         # StepResult.overlap: rho_K, measured with a teacher

    def __init__(self, cfg: TrainingConfig, *, resume: bool = False):
        check_required(cfg)
        self.cfg = cfg
        self.resume = resume
        self.run_dir = Path(cfg.output.dir)
        self.block_size = cfg.diffusion.block_size
        self.step = 0
        self.finished = False
        self.run_lock: RunLock | None = None

    def setup(self) -> None:
        from accelerate import PartialState
        from accelerate.utils import DistributedType

        from ...model.devices import resolve_device

        cfg = self.cfg
        device = resolve_device(cfg.train.device).type
        apply_tf32(cfg.train.tf32, device)
        state = PartialState(cpu=device == "cpu")          # joins the process group (torchrun / accelerate launch)
        if state.is_main_process:                           # one run writes output.dir at a time
            self.run_lock = RunLock(self.run_dir / RUN_LOCK, "run folder").acquire()
        self.plan = BatchPlan(cfg.train.global_batch_size, cfg.train.micro_batch_size, state.num_processes,
                              state.process_index)
        self.accelerator = acc = make_accelerator(cfg, device, self.plan)
        if acc.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP) and (
                cfg.output.save_every_steps or self.resume):
            raise ConfigError(f"output.save_every_steps: resumable checkpoints (and --resume) are supported with "
                              f"DDP or one process, not {acc.distributed_type.value}, whose optimizer states are "
                              "pickles; pass --output.save_every_steps 0 (final/ is still written)")

        resume_from = self._check_run_dir()
        if self.finished:
            return
        torch.manual_seed(cfg.train.seed)
        self.hf_model, self.processor, self.diffusion = self._load_student(resume_from or Path(cfg.model.path))
        self.pad_multiple = self.block_size         # responses are padded to this multiple (distill: lcm(B_s, B_t))
        self.setup_extra()
        self.dataset = SampleDataset(
            cfg.data.train_file, self.processor, eos_token_id=self.diffusion.eos_token_id,
            data_root=cfg.data.data_root, mix=parse_mix(cfg.data.mix), min_pixels=cfg.data.min_pixels,
            max_pixels=cfg.data.max_pixels, max_length=cfg.data.max_length, block_size=self.block_size,
            pad_multiple=self.pad_multiple, on_error=cfg.data.on_error,
            image_limits=ImageLimits(cfg.data.max_decoded_pixels, cfg.data.max_decoded_bytes),
            allow_absolute_paths=cfg.data.allow_absolute_image_paths, keep=self.keep_sample)
        self.order = DataOrder(len(self.dataset), cfg.train.seed, cfg.data.shuffle)
        self.total_steps = total_steps(len(self.dataset), cfg.train.epochs, cfg.train.global_batch_size,
                                       cfg.train.max_steps)

        if cfg.model.freeze_vision_tower:
            log.info("froze %d vision-tower tensors", freeze_vision_tower(self.hf_model))
        if cfg.model.activation_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(self.hf_model, "activation_checkpointing_enable"):       # transformers >= 5.2x
                self.hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.hf_model.train()
        module = self.build_objective()
        optimizer = build_optimizer(module, cfg.optim)
        self.scheduler = build_scheduler(optimizer, self.total_steps, cfg.optim)
        self.module, self.optimizer = acc.prepare(module, optimizer)
        if resume_from is not None:
            # Model weights come from the Hugging Face part of the checkpoint; trainer_state/ holds the rest.
            load_trainer_state(resume_from / TRAINER_STATE, self.optimizer, self.scheduler,
                               process_index=acc.process_index, device=acc.device)
            self.load_extra_state(resume_from / TRAINER_STATE)
            progress = read_progress(resume_from)
            self.step = int(progress["step"])
            acc.step = int(progress["accelerator_step"])          # micro-batches seen: accumulation phase
            if progress.get("total_steps") != self.total_steps:
                log.warning("resuming with %s total steps (the checkpoint planned %s)", self.total_steps,
                            progress.get("total_steps"))
            log.info("resumed %s at step %d", resume_from, self.step)
        if acc.is_main_process:
            atomic_write_text(self.run_dir / "config.yaml", dump_yaml(cfg))
            if resume_from is not None:
                truncate_metrics(self.run_dir, self.step)
        acc.wait_for_everyone()

    def setup_extra(self) -> None:
        """Hook: more setup after the student is loaded (the distillation recipe's teacher)."""

    def keep_sample(self, sample) -> bool:
        """Hook: whether a sample of the data is trained on (the vision recipe keeps grounding samples)."""
        return True

    def build_objective(self) -> torch.nn.Module:
        """Hook: the module Accelerate wraps, the student and its loss."""
        return DiffusionObjective(self.hf_model, LossSettings(chunk_size=self.cfg.loss.chunk_size, kd_ratio=0.0))

    def save_extra_state(self, trainer_state: Path) -> None:
        """Hook: what a resumable checkpoint needs beyond the model, optimizer and scheduler (nothing here)."""

    def load_extra_state(self, trainer_state: Path) -> None:
        """Hook: read back what :meth:`save_extra_state` wrote (nothing here)."""

    def _check_run_dir(self) -> Path | None:
        """The checkpoint to resume from (None: start from ``model.path``); a finished run sets ``finished``."""
        if not self.resume:
            if any((self.run_dir / name).exists() for name in (METRICS, CHECKPOINTS, FINAL)):
                raise ConfigError(f"output.dir: {self.run_dir} already holds a run; pass --resume to continue it "
                                  "or choose another directory")
            return None
        refuse_pickles(self.run_dir)
        if (self.run_dir / FINAL).exists():
            log.info("%s is already finished", self.run_dir / FINAL)
            self.finished = True
            return None
        found = latest_checkpoint(self.run_dir)
        if found is None:
            log.warning("--resume: no checkpoint in %s yet; starting from model.path", self.run_dir)
            if self.accelerator.is_main_process:
                (self.run_dir / METRICS).unlink(missing_ok=True)
        return found

    def _load_student(self, path: Path):
        from accelerate.utils import DistributedType

        from ...model.checkpoint import load_checkpoint
        load_device = "cpu" if self.accelerator.distributed_type == DistributedType.DEEPSPEED else str(
            self.accelerator.device)
        loaded = load_checkpoint(path, device=load_device, dtype=self.cfg.model.dtype,
                                 overrides={"block_size": self.block_size},
                                 attn_implementation=self.cfg.model.attn_implementation)
        if self.block_size > 1 and loaded.config.mask_token_id is None:
            raise ConfigError(f"diffusion.block_size: {self.block_size} needs a mask token; {path} has none "
                              "(convert it with `wam-diff2 convert`)")
        loaded.model.config.use_cache = False
        # The saved processor carries the pixel budget the model is trained with, so inference
        # (which uses the checkpoint's processor unless told otherwise) sees images the same way.
        loaded.processor.image_processor.size = pixel_size(self.cfg.data.min_pixels, self.cfg.data.max_pixels)
        return loaded.model, loaded.processor, loaded.config

    def make_batch(self, examples: Sequence[Example], noise_round: int = 0) -> TrainingBatch:
        return build_batch(examples, block_size=self.block_size, mask_token_id=self.diffusion.mask_token_id,
                           eos_token_id=self.diffusion.eos_token_id, rope_index=self.hf_model.model.get_rope_index,
                           seed=self.cfg.train.seed, min_ratio=self.cfg.diffusion.min_mask_ratio,
                           pad_multiple=self.pad_multiple, noise_round=noise_round)

    def prepare_examples(self, step: int, examples: list[Example]) -> tuple[list[Example], int]:
        """Hook: the distillation recipe regenerates answers here (on-policy). Returns the
        examples and the noise round (0 for ground-truth answers)."""
        return examples, 0

    def loss_inputs(self, batch: TrainingBatch) -> dict[str, Any]:
        return objective_inputs(batch)

    @cached_property
    def placeholder(self) -> Example:
        """Some valid example, for a micro-batch whose samples were all rejected: it still has to
        take part in the (synchronised) backward, with zero weight."""
        for item in map(self.dataset.__getitem__, range(len(self.dataset))):
            if isinstance(item, Example):
                item.position = 0
                return item
        raise ConfigError(f"data.train_file: no sample of {self.cfg.data.train_file} can be encoded")

    def backward_step(self, step: int, micro_batches: Sequence[Sequence[Example | SampleError]]) -> StepResult:
        """Forward and backward every micro-batch of one optimizer step; gradients are left in place."""
        acc = self.accelerator
        device = acc.device
        errors = [item for mb in micro_batches for item in mb if isinstance(item, SampleError)]
        for error in errors:
            log.warning("step %d: skipped %s", step, error)
        skipped = [error.sample_id for error in errors]
        if acc.num_processes > 1:
            from accelerate.utils import gather_object
            skipped = gather_object(skipped)          # every process's, for the metrics line
        valid = [[item for item in mb if isinstance(item, Example)] for mb in micro_batches]
        counts = torch.tensor([float(sum(len(v) for v in valid))], device=device)
        global_samples = float(acc.reduce(counts, reduction="sum").item())
        # DDP averages gradients over processes and Accelerate divides by the accumulation
        # steps: scaling by both makes the update the mean over the global batch's samples.
        scale = acc.num_processes * self.plan.accumulation_steps / max(global_samples, 1.0)
        sums = torch.zeros(6, device=device)       # total, ce, kd, overlap, targets, tokens
        for examples in valid:
            weight, noise_round = scale, 0
            if examples:
                examples, noise_round = self.prepare_examples(step, examples)
            else:
                examples, weight = [self.placeholder], 0.0
            batch = self.make_batch(examples, noise_round=noise_round).to(device)
            with acc.accumulate(self.module):
                out = self.module(**self.loss_inputs(batch))
                acc.backward(out["total"] * weight)
            if weight:
                sums += torch.stack([out[k].detach().float() for k in ("total", "ce", "kd", "overlap")]
                                    + [torch.tensor(float(n), device=device) for n in (batch.num_targets, batch.num_tokens)])
        assert acc.sync_gradients, "the last micro-batch of a step must synchronise gradients"
        sums = acc.reduce(sums, reduction="sum")
        n = max(global_samples, 1.0)
        return StepResult(step=step, loss=float(sums[0]) / n, ce=float(sums[1]) / n, kd=float(sums[2]) / n,
                          overlap=float(sums[3] / sums[4]) if self.reports_overlap and sums[4] > 0 else None,
                          samples=int(global_samples), tokens=int(sums[5]), targets=int(sums[4]), skipped=skipped)

    def apply_update(self, result: StepResult) -> None:
        """Clip, AdamW step, scheduler step (after :meth:`backward_step`)."""
        norm = self.accelerator.clip_grad_norm_(self.module.parameters(), self.cfg.optim.max_grad_norm or float("inf"))
        result.grad_norm = None if norm is None else float(norm)
        result.lr = self.scheduler.get_last_lr()[0]
        if result.samples:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def train(self) -> Path:
        from tqdm.auto import tqdm

        final = self.run_dir / FINAL
        if self.finished:
            return final
        acc, cfg = self.accelerator, self.cfg
        batches = iter(make_loader(self.dataset, self.order, self.plan, self.step, self.total_steps,
                                   cfg.data.num_workers))
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not acc.is_local_main_process,
                   desc=f"{cfg.recipe} B={self.block_size}", dynamic_ncols=True)
        started = time.perf_counter()
        first_loss = last_loss = None
        out_of_time, stopping = False, self.step >= self.total_steps
        while not stopping:
            t0 = time.perf_counter()
            result = self.backward_step(self.step, [next(batches) for _ in range(self.plan.accumulation_steps)])
            self.apply_update(result)
            self.step += 1
            elapsed = time.perf_counter() - t0
            first_loss = result.loss if first_loss is None else first_loss
            last_loss = result.loss
            record = {"step": self.step, "epoch": round(self.order.epoch(self.step * self.plan.global_batch_size), 4),
                      "loss": result.loss, "ce": result.ce, "lr": result.lr, "grad_norm": result.grad_norm,
                      "samples": result.samples, "tokens": result.tokens, "masked_tokens": result.targets,
                      "samples_per_s": result.samples / elapsed, "tokens_per_s": result.tokens / elapsed,
                      "block_size": self.block_size, **self.extra_metrics(result)}
            if result.skipped:
                record["skipped"] = result.skipped
            out_of_time = self.step < self.total_steps and self._time_is_up(started)
            stopping = out_of_time or self.step == self.total_steps
            if out_of_time:
                record["stopped_at_time_limit_s"] = cfg.train.time_limit_s
            if acc.is_main_process and (self.step % cfg.output.log_every_steps == 0 or stopping):
                append_metrics(self.run_dir, record)
            bar.set_postfix(loss=f"{result.loss:.4f}", samples_s=f"{record['samples_per_s']:.1f}",
                            tok_s=f"{record['tokens_per_s']:.0f}")
            bar.update(1)
            if cfg.output.save_every_steps and self.step % cfg.output.save_every_steps == 0 and not stopping:
                self.save_checkpoint()
        bar.close()
        if out_of_time and acc.is_main_process:
            log.warning("%s: train.time_limit_s %g s reached at step %d of %d; final/ holds the model of step %d "
                        "(its learning-rate schedule cut short)", self.run_dir, cfg.train.time_limit_s, self.step,
                        self.total_steps, self.step)
        self.save_checkpoint(resumable=False)
        if acc.is_main_process:
            log.info("%s: %d steps in %.1f s, loss %.4f -> %.4f; wrote %s", self.run_dir, self.step,
                     time.perf_counter() - started, first_loss or float("nan"), last_loss or float("nan"), final)
        return final

    def _time_is_up(self, started: float) -> bool:
        """Whether ``train.time_limit_s`` has passed since ``started``; every process takes the main one's answer
        (their clocks differ by a step at most, and all must stop at the same step)."""
        limit = self.cfg.train.time_limit_s
        if not limit:
            return False
        acc = self.accelerator
        up = time.perf_counter() - started >= limit
        if acc.num_processes > 1:
            flag = torch.tensor([float(up and acc.is_main_process)], device=acc.device)
            up = bool(acc.reduce(flag, reduction="sum").item())
        return up

    def extra_metrics(self, result: StepResult) -> dict[str, Any]:
        return {}

    def _write_hf(self, out: Path) -> None:
        """A loadable Hugging Face checkpoint (main process writes; every process must call)."""
        acc = self.accelerator
        state = acc.get_state_dict(self.module)            # gathers shards under ZeRO-3 / FSDP
        if acc.is_main_process:
            state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
            save_checkpoint(self.hf_model, self.processor, out, state_dict=state, is_main_process=True)
            if self.diffusion.mask_token_id is not None:
                # the camera the model was trained with stays with it (the leaderboard agent reads it)
                rig = read_camera_block(self.cfg.model.path) if Path(self.cfg.model.path).is_dir() else None
                write_diffusion_file(out, block_size=self.block_size, mask_token_id=self.diffusion.mask_token_id,
                                     eos_token_id=self.diffusion.eos_token_id, decoding=self.diffusion.settings,
                                     camera=rig)

    def save_checkpoint(self, resumable: bool = True) -> Path:
        """``checkpoints/step-N/`` (resumable: + trainer state), else ``final/``; written under its partial name
        and renamed into place when whole. Every process must call."""
        acc = self.accelerator
        final = self.run_dir / CHECKPOINTS / step_dir_name(self.step) if resumable else self.run_dir / FINAL
        if acc.is_main_process:
            begin_partial(final)
        acc.wait_for_everyone()
        tmp = partial_path(final)
        self._write_hf(tmp)
        if resumable:
            save_trainer_state(tmp / TRAINER_STATE, self.optimizer, self.scheduler, process_index=acc.process_index,
                               main=acc.is_main_process, device=acc.device)
            self.save_extra_state(tmp / TRAINER_STATE)
        acc.wait_for_everyone()
        if acc.is_main_process:
            if resumable:
                write_progress(tmp, {"step": self.step, "total_steps": self.total_steps, "accelerator_step": acc.step,
                                     "global_batch_size": self.plan.global_batch_size, "block_size": self.block_size})
            publish(tmp, final)
            if resumable:
                prune_checkpoints(self.run_dir, self.cfg.output.keep_last)
        acc.wait_for_everyone()
        return final

    def cleanup(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
        acc = getattr(self, "accelerator", None)
        if acc is not None:
            acc.free_memory()
            # Accelerate keeps its settings (mixed precision, accumulation) in process-wide
            # singletons; forget them so a next recipe in this process (a curriculum stage, a
            # test) may choose others. The process group (PartialState) stays.
            from accelerate.state import AcceleratorState, GradientState
            AcceleratorState._reset_state()
            GradientState._reset_state()
        for name in ("module", "optimizer", "hf_model", "teacher"):
            if hasattr(self, name):
                setattr(self, name, None)
