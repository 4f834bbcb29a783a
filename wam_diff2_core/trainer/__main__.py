"""``python -m wam_diff2_core.trainer ARGS`` = ``wam-diff2 train ARGS``, for launchers that take a
module (torchrun, accelerate launch) and without loading the other subcommands.

    torchrun --nproc-per-node 8 -m wam_diff2_core.trainer --config training/block4.yaml
    accelerate launch --config_file training/accelerate/ddp.yaml -m wam_diff2_core.trainer \\
        --config training/block4.yaml
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..config import ConfigError
from . import command_line as train_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_diff2_core.trainer", description=train_cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    train_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return train_cli.run(args)
    except ConfigError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
