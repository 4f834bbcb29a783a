"""`wam-diff2 eval-bag` alone and beside busy torch processes: median seconds per frame
(docs/reliability.md, CPU contention).

    python scripts/contention_bench.py                      # a tiny random checkpoint and a synthetic bag
    python scripts/contention_bench.py --model models/wam-diff2-demo-b32 --bag BAG --frames 8 --threads 0 1

For each --spin-counts value (``GOMP_SPINCOUNT``: how long a waiting OpenMP thread spins before it sleeps;
300000 is libgomp's default, what torch does on its own; the package's choice: wam_diff2_core/_openmp.py)
and --threads value, eval-bag runs over the first --frames camera frames of the bag once alone
and once beside --busy processes that multiply matrices with torch's default threads (what a
vehicle computer's other torch programs do), and the medians of its per-frame latency
(frames.jsonl ``latency_ms``) are printed with their ratio and the 1-minute load average seen
at the end of each run (other work on the machine counts too); a run over --timeout-s is shown
as such.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wam_diff2_core._openmp import LIBGOMP_DEFAULT_SPIN, SPIN_COUNT, USER_CHOICES
from wam_diff2_core.sim.protocol import DEMO_DRIVE_SEED

BUSY = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n"


# the environment without any OpenMP wait setting (importing wam_diff2_core above set ours): torch's own behaviour,
# the busy processes' (other torch programs on the machine) and, with the spin count given, eval-bag's
torch_default_env = {k: v for k, v in os.environ.items() if k not in USER_CHOICES}


def _run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> bool:
    """Whether ``cmd`` finished within ``timeout_s`` (a failure stops the benchmark)."""
    env = torch_default_env | (env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return False
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return True


def _median_s(report: Path) -> float:
    latencies = [json.loads(line)["latency_ms"] for line in (report / "frames.jsonl").read_text().splitlines()]
    return statistics.median(latencies) / 1e3


def _cell(value: float | None, timeout_s: float) -> str:
    return f"{value:.2f}" if value is not None else f"(> {timeout_s:.0f} s run)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: a tiny random one, built here)")
    p.add_argument("--bag", default=None, help="bag (default: one synthetic episode, built here)")
    p.add_argument("--frames", type=int, default=2, help="camera frames evaluated per run (default 2)")
    p.add_argument("--busy", type=int, default=2, help="busy torch processes beside it (default 2)")
    p.add_argument("--threads", type=int, nargs="+", default=[0, 1], help="eval-bag --threads values (0: default)")
    p.add_argument("--spin-counts", type=int, nargs="+", default=[SPIN_COUNT, LIBGOMP_DEFAULT_SPIN],
                   help=f"eval-bag's GOMP_SPINCOUNT values (default: the package's {SPIN_COUNT} and libgomp's "
                        f"{LIBGOMP_DEFAULT_SPIN})")
    p.add_argument("--timeout-s", type=float, default=600, help="longest one eval-bag run may take")
    args = p.parse_args()
    tool = [sys.executable, "-m", "wam_diff2_core.cli"]
    with tempfile.TemporaryDirectory(prefix="contention-") as tmp:
        tmp = Path(tmp)
        model = args.model or str(tmp / "tiny")
        if args.model is None:
            _run(tool + ["tiny-checkpoint", model, "--seed", "0"], 300)
        bag = args.bag
        if bag is None:
            _run(tool + ["synth", str(tmp / "synth"), "--episodes", "1", "--frames", "40", "--formats", "mcap",
                         "--seed", str(DEMO_DRIVE_SEED), "--no-progress"], 300)
            bag = str(next((tmp / "synth").rglob("*.mcap")))
        print(f"eval-bag --max-frames {args.frames} on {os.cpu_count()} CPUs (affinity "
              f"{len(os.sched_getaffinity(0))}), model {model}, beside {args.busy} busy torch processes")
        print(f"{'spin':>8} {'--threads':>9} {'alone s/frame':>16} {'busy s/frame':>16} {'ratio':>6} {'load alone/busy':>16}")
        for spin, threads in ((w, t) for w in args.spin_counts for t in args.threads):
            medians, loads = [], []
            for busy in (0, args.busy):
                workers = [subprocess.Popen([sys.executable, "-c", BUSY], env=torch_default_env) for _ in range(busy)]
                try:
                    time.sleep(2 if busy else 0)              # let them spin up
                    out = tmp / f"s{spin}-t{threads}-b{busy}"
                    done = _run(tool + ["eval-bag", bag, "--model", model, "--out", str(out), "--max-frames",
                                        str(args.frames), "--threads", str(threads), "--no-progress"], args.timeout_s,
                                {"GOMP_SPINCOUNT": str(spin)})
                    loads.append(os.getloadavg()[0])
                finally:
                    for w in workers:
                        w.kill()
                        w.wait()
                medians.append(_median_s(out) if done else None)
            ratio = f"{medians[1] / medians[0]:.1f}" if None not in medians else "-"
            print(f"{spin:>8} {threads:>9} {_cell(medians[0], args.timeout_s):>16} {_cell(medians[1], args.timeout_s):>16} "
                  f"{ratio:>6} {loads[0]:>7.1f} / {loads[1]:<7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
