"""The demo world's scoring protocol, in one place: which seeds train, which choose, which report.

models/README.md, "Protocol", says what each set is for; ``scripts/score_demo.sh`` reads its sets from here, the
closed loop's default routes are the selection set's first seed, ``closed-loop --expert-labels`` refuses the
held-out seeds.

    python -m wam_diff2_core.sim.protocol --shell report      # a set as bash assignments
    python -m wam_diff2_core.sim.protocol --seed demo-drive   # the held-out drive the demo, benches and examples use
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoringSet:
    name: str
    data: str                       # default folder of its planning drives (a ``wam-diff2 synth`` output)
    samples: str                    # the file of that folder its samples are read from
    synth: tuple[str, ...]          # the ``wam-diff2 synth`` options that make the drives
    every: int                      # every Nth sample is scored
    route_seeds: tuple[int, ...]    # closed-loop route seeds
    routes_per_seed: int = 10

    def shell(self) -> str:
        """Bash assignments of the set (``eval`` them): data, samples, synth (an array), every, route_seeds, routes."""
        values = {"data": self.data, "samples": f"{self.data}/{self.samples}", "every": str(self.every),
                  "route_seeds": " ".join(map(str, self.route_seeds)), "routes": str(self.routes_per_seed)}
        lines = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
        return "\n".join(lines + ["synth=(" + " ".join(shlex.quote(a) for a in self.synth) + ")"])


# the 40 held-out drives of the training data's seed 0 (its val.json) and three route seeds
SELECTION = ScoringSet("selection", "runs/demo/data", "val.json",
                       ("--seed", "0", "--episodes", "160", "--frames", "100", "--frame-stride", "5",
                        "--recovery-fraction", "0.3"),
                       every=50, route_seeds=(2000, 2001, 2002))
# 40 drives of seed 8000 (synth names an undivided set train.json) and two route seeds
REPORT = ScoringSet("report", "runs/report_set", "train.json",
                    ("--seed", "8000", "--episodes", "40", "--frames", "25", "--frame-stride", "5",
                     "--val-fraction", "0"),
                    every=5, route_seeds=(8001, 8002))
SETS = {s.name: s for s in (SELECTION, REPORT)}
DEFAULT_ROUTE_SEED = SELECTION.route_seeds[0]     # closed-loop's default routes: choices look at them
ROUTE_LENGTH_M = 200.0  # closed-loop's default routes: their length (m)
LOCKSTEP_N = 10         # the closed loops plan on every N-th 20 Hz tick (2 Hz), in process and over DDS
# One held-out drive (synth seed; the demo models trained on seed 0's drives) that `make demo`, the benches in
# scripts/ and the examples plan on; what it shows is no figure of either set.
DEMO_DRIVE_SEED = 1000
SEEDS = {"demo-drive": DEMO_DRIVE_SEED, "default-route": DEFAULT_ROUTE_SEED}


def held_out_route_seeds() -> frozenset[int]:
    """Route seeds no training label may come from (selection and report)."""
    return frozenset(seed for s in SETS.values() for seed in s.route_seeds)


def check_training_route_seed(seed: int) -> None:
    """ValueError when closed-loop training labels would be drawn on a held-out route seed."""
    for s in SETS.values():
        if seed in s.route_seeds:
            raise ValueError(f"route seed {seed} belongs to the {s.name} set (route seeds "
                             f"{', '.join(map(str, s.route_seeds))}): training labels must come from other seeds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_diff2_core.sim.protocol", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--shell", choices=sorted(SETS), help="print the set as bash assignments")
    what.add_argument("--seed", choices=sorted(SEEDS), help="print the seed")
    args = parser.parse_args(argv)
    print(SETS[args.shell].shell() if args.shell else SEEDS[args.seed])
    return 0


if __name__ == "__main__":
    sys.exit(main())
