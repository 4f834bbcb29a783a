"""``python -m wam_diff2_core.training`` = ``wam-diff2 train`` (for torchrun / accelerate launch -m).

    accelerate launch --config_file training/accelerate/ddp.yaml -m wam_diff2_core.training \
        --config training/block4.yaml
"""
import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
