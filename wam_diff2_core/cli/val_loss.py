"""Fixed-noise validation loss of a checkpoint on held-out samples, and a teacher's agreement with it.

    wam-diff2 val-loss --model runs/b32/final --data val.json --limit 200
    wam-diff2 val-loss --model runs/b32/final --data val.json --teacher runs/b4/final --teacher-block-size 4

Every sample is noised ``--rounds`` times from fixed seeds, so two checkpoints are compared on
exactly the same masked inputs (``wam_diff2_core.trainer.evaluate``). Without a teacher it prints the
training objective (1/t-weighted cross-entropy); with one, also the distillation divergence
(``--loss``) and rho_K, the overlap of the two models' top-K tokens at masked positions (the
paper's measure of how well a teacher's distribution suits a student; K = 5).
"""
from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, add_threads_argument
from ..trainer.losses import KD_LOSSES, LossSettings
from .common import add_model_arguments, add_sample_path_arguments, apply_threads

HELP = "fixed-noise validation loss on held-out samples (and a teacher's top-5 overlap with the model)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_threads_argument(p)
    p.add_argument("--data", required=True, help="samples (the authors' JSON / JSONL)")
    add_sample_path_arguments(p)
    p.add_argument("--block-size", type=int, default=None,
                   help="the model's block size for the noise and the mask (default: its diffusion_config.json)")
    p.add_argument("--teacher", default=None, help="a teacher checkpoint: also report the divergence and rho_K")
    p.add_argument("--teacher-block-size", type=int, default=None,
                   help="the teacher's block size (default: its diffusion_config.json; 1 = an AR teacher)")
    p.add_argument("--loss", choices=KD_LOSSES, default="jsd", help="the divergence to report (default jsd)")
    p.add_argument("--top-k", type=int, default=5, help="K of rho_K (default 5)")
    p.add_argument("--rounds", type=int, default=4, help="noise draws per sample (default 4)")
    p.add_argument("--limit", type=int, default=None, help="only the first N samples")
    p.add_argument("--seed", type=int, default=1234, help="noise seed (default 1234)")
    p.add_argument("--json", default=None, help="also write the figures here")


def run(args) -> int:
    from ..model.checkpoint import load_checkpoint
    from ..trainer.evaluate import validation_loss

    for name in ("rounds", "limit", "top_k", "block_size", "teacher_block_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    apply_threads(args)
    student = load_checkpoint(args.model, device=args.device, dtype=args.dtype)
    block_size = args.block_size or student.config.block_size
    teacher, teacher_block_size = None, 0
    if args.teacher:
        loaded_teacher = load_checkpoint(args.teacher, device=args.device, dtype=args.dtype)
        teacher, teacher_block_size = loaded_teacher.model, args.teacher_block_size or loaded_teacher.config.block_size
    settings = LossSettings(kd_loss=args.loss, kd_ratio=1.0 if teacher is not None else 0.0, overlap_k=args.top_k)
    data_root = args.data_root or str(Path(args.data).parent)
    result = validation_loss(student, args.data, block_size=block_size, data_root=data_root, rounds=args.rounds,
                             min_pixels=args.min_pixels, max_pixels=args.max_pixels,
                             seed=args.seed, teacher=teacher, teacher_block_size=teacher_block_size,
                             settings=settings, limit=args.limit,
                             allow_absolute_paths=args.allow_absolute_image_paths)
    figures = {"model": args.model, "block_size": block_size, "data": args.data, "samples": result.samples,
               "rounds": args.rounds, "ce": result.ce}
    line = f"val-loss: {result.samples} samples x {args.rounds} noise draws, B = {block_size}: CE {result.ce:.4f}"
    if teacher is not None:
        figures.update(teacher=args.teacher, teacher_block_size=teacher_block_size, loss=args.loss,
                       divergence=result.kd, **{f"top{args.top_k}_overlap": result.overlap})
        line += (f"; teacher {args.teacher} (B = {teacher_block_size}): {args.loss} {result.kd:.4f}, "
                 f"rho_{args.top_k} {result.overlap:.3f}")
    print(line)
    if args.json:
        from ..utils.atomic import atomic_write_json
        atomic_write_json(args.json, figures)
    return 0

