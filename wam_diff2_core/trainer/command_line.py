"""Train WAM-Diff2: AR pretraining, block adaptation (one stage or the B = 4 -> 32 curriculum),
block-wise and model-wise distillation. Settings come from a YAML file (training/*.yaml);
any ``--section.key value`` overrides the matching YAML field.

    wam-diff2 train --config training/block4.yaml --data.train_file train.json --output.dir runs/block4
    wam-diff2 train --config training/curriculum.yaml --model.path ckpt/ar --output.dir runs/curriculum
    wam-diff2 train --config training/block4.yaml --output.dir runs/block4 --resume
    accelerate launch --config_file training/accelerate/ddp.yaml -m wam_diff2_core.trainer \\
        --config training/block4.yaml

Run directory: config.yaml, metrics.jsonl, checkpoints/step-N/ (resumable), final/ (the
stage's Hugging Face checkpoint; a curriculum writes OUTPUT/blockB/final/ per stage).

The ``wam-diff2 train`` subcommand and ``python -m wam_diff2_core.trainer`` both take these
options (``HELP``, ``add_arguments``, ``run``: the interface of a ``wam-diff2`` subcommand module).
"""
from __future__ import annotations

import argparse
import os

HELP = "train (AR pretraining, block curriculum, distillation) from a YAML config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="training YAML (see training/*.yaml)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run directory's latest checkpoint (finished curriculum stages are skipped)")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings and exit")
    from ..config import add_threads_argument

    add_threads_argument(p)                    # torch's CPU threads per process (torchrun sets OMP_NUM_THREADS=1)
    p.allow_abbrev = False
    p.set_defaults(overrides=[])
    # ``--section.key value`` pairs are not argparse options: keep whatever this parser does not
    # know as overrides (validated against the config, which names an unknown key).
    parse_known = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extras = parse_known(args, namespace)
        namespace.overrides = list(getattr(namespace, "overrides", []) or []) + list(extras)
        return namespace, []

    p.parse_known_args = parse_known_args


def run(args) -> int:
    from .training_config import dump_yaml, load_training_config

    cfg = load_training_config(args.config, args.overrides)
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    from ..config import apply_cpu_threads
    from .recipes import run as run_training

    args.cpu_threads = apply_cpu_threads(args.cpu_threads)
    final = run_training(cfg, resume=args.resume)
    if os.environ.get("RANK", "0") == "0":     # one line per run, not per process
        print(f"wrote {final}")
    return 0
