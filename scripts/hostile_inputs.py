"""10,000 hostile messages into the localization node and into the controller node (real DDS), and what held.

    . scripts/env.sh && python scripts/hostile_inputs.py                          # 10,000 each, seed 0
    python scripts/hostile_inputs.py --messages 2000 --seed 3 --node controller --json out.json

The fuzz of test/ros/tools/test_hostile_inputs.py (``wam_diff2_ros/tools/hostile_inputs.py``: every field of every
input message random or adversarial, stamps going backwards, bursts, silence) at benchmark size: prints
one summary line per node (messages, rate, outputs, bad outputs, diagnostics, crash, recovery), the
refusal / fallback counters, and any problem found; exits 1 when one is. Runs in its own DDS domain
(``--domain-id`` or ROS_DOMAIN_ID). The generated messages check their fields' types and ranges here
(ROS_PYTHON_CHECK_FIELDS=1, set unless given), as Humble's always do: a node that builds an output
from a hostile value (a float32 overflowing, a stamp's seconds beyond int32) raises there, and the
fuzz must see it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="hostile messages per node (default 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node", choices=("localization", "controller", "both"), default="both")
    parser.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0")))
    parser.add_argument("--json", help="also write the reports here")
    args = parser.parse_args(argv)

    os.environ.setdefault("ROS_PYTHON_CHECK_FIELDS", "1")     # read when the message modules are imported
    import rclpy

    from wam_diff2_ros.tools.hostile_inputs import fuzz_controller, fuzz_localization

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=args.domain_id)
    runs = {"localization": fuzz_localization, "controller": fuzz_controller}
    reports = []
    try:
        for name, fuzz in runs.items():
            if args.node in (name, "both"):
                reports.append(fuzz(context, args.messages, args.seed))
    finally:
        rclpy.shutdown(context=context)
    failed = False
    for report in reports:
        print(report.summary())
        print(f"  counters: {json.dumps(report.refused)}")
        for problem in report.problems():
            failed = True
            print(f"  PROBLEM: {problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in reports], f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
