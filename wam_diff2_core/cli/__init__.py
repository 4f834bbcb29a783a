"""``wam-diff2`` command line: one subcommand per module in this package (``train``'s lives with the
trainer, :mod:`wam_diff2_core.trainer.command_line`, which ``python -m wam_diff2_core.trainer`` runs too).

    wam-diff2 tiny-checkpoint /tmp/tiny
    wam-diff2 infer --model /tmp/tiny --input eval.json --output preds.json

Each subcommand module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``
and imports heavy libraries inside ``run`` so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# subcommand -> module (relative to this package)
SUBCOMMANDS = {
    "tiny-checkpoint": ".tiny_checkpoint",
    "convert": ".convert",
    "export": ".export",
    "quant-check": ".quant_check",
    "infer": ".infer",
    "bench": ".bench",
    "verify-device": ".verify_device",
    "train": "..trainer.command_line",
    "val-loss": ".val_loss",
    "synth": ".synth",
    "convert-data": ".convert_data",
    "eval-bag": ".eval_bag",
    "closed-loop": ".closed_loop",
}


def offline_environment() -> None:
    """Quiet transformers and keep the hub offline, without importing it (synth never needs it)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__
    parser = argparse.ArgumentParser(prog="wam-diff2", description="WAM-Diff2 block-diffusion driving VLA tools")
    parser.add_argument("--version", action="version", version=f"wam-diff2 {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name, __name__)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def run_reporting_errors(prog: str, run, args) -> int:
    """``run(args)``'s exit status; a ConfigError (bad settings or checkpoint) is one line naming it,
    no traceback (2), Ctrl-C one line (130). ``wam-diff2-ros`` runs its tools through this too."""
    from ..config import ConfigError
    try:
        return int(run(args) or 0)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    offline_environment()
    return run_reporting_errors(f"wam-diff2 {args.command}", args._run, args)


if __name__ == "__main__":
    sys.exit(main())
