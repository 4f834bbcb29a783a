"""What boxes cost per frame: the policy planning alone, and planning with detection batched into the same
decode every frame or only every N-th frame, side by side.

    python scripts/detection_schedule.py --model CKPT                   # 8 held-out frames, CPU, 1 thread
    python scripts/detection_schedule.py --model CKPT --every 2 4 --frames 12 --repeats 2 --json out.json

Each frame of a held-out demo-world drive (sim.protocol's DEMO_DRIVE_SEED) is stepped by the same loaded
model under every schedule in turn (frame-major, so load on the machine falls on every schedule alike),
through DrivingPolicy.step as the node runs it: ``plan`` (tasks plan), ``both/1`` (plan and detect, one
batched decode each frame) and ``both/N`` (the detect prompt joins the plan's decode on frames 1, N + 1,
...). One warm-up step per schedule first. Printed per schedule: the mean and median frame latency (ms),
the mean's ratio to planning alone (the per-frame figure: a schedule's slow frames count), the
slowest frame, boxes per frame and the median answer tokens of the detection decodes. The frames are the
same, so the schedules differ only in what is decoded.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from candidates_bench import held_out_frames   # scripts/ is the script's own folder, first on sys.path
from wam_diff2_core.config import EngineSettings, add_threads_argument
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.policy import DrivingPolicy


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/wam-diff2-demo-b32")
    p.add_argument("--every", type=int, nargs="+", default=[2, 4], help="detection every N-th frame (N >= 2)")
    p.add_argument("--frames", type=int, default=8, help="held-out frames (from frame --first on)")
    p.add_argument("--first", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="passes over the frames")
    p.add_argument("--json", type=Path, help="also write every frame's figures here")
    add_threads_argument(p)
    args = p.parse_args()
    if any(n < 2 for n in args.every) or args.frames < 1 or args.repeats < 1:
        p.error(f"--every must be >= 2 (got {args.every}), --frames and --repeats >= 1")
    threads = args.cpu_threads or 1
    loaded = load_checkpoint(args.model, device="cpu", dtype="float32")
    engine = EngineSettings(cpu_threads=threads)
    schedules = {"plan": DrivingPolicy(loaded, engine=engine, tasks=("plan",)),
                 **{f"both/{n}": DrivingPolicy(loaded, engine=engine, tasks=("plan", "detect"),
                                               detection_every_n_frames=n) for n in [1, *args.every]}}
    frames = [frame[:3] for frame in held_out_frames(args.frames, args.first)]
    rows = {name: {"ms": [], "boxes": [], "tokens": []} for name in schedules}
    for policy in schedules.values():                     # one warm-up step each
        rgb, ego, truth = frames[0]
        policy.step(rgb, ego, truth.command)
        policy.frames = 0                                 # the measured frames start the schedule afresh
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        for rgb, ego, truth in frames:
            for name, policy in schedules.items():
                out = policy.step(rgb, ego, truth.command)
                rows[name]["ms"].append(out.latency_ms)
                if out.detections is not None:
                    rows[name]["boxes"].append(len(out.detections.boxes))
                    rows[name]["tokens"].append(out.detections.stats.tokens)
    steps = len(frames) * args.repeats
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "threads": threads, "frames": steps, "schedules": rows},
                                        indent=1))
    base = statistics.fmean(rows["plan"]["ms"])
    print(f"detection schedule: {args.model}, cpu, {threads} thread(s), {len(frames)} frames x {args.repeats} "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"  {'schedule':>9} {'mean ms':>9} {'x plan':>7} {'median ms':>10} {'max ms':>8} {'boxes/frame':>12} "
          f"{'detect tokens':>14}")
    for name, r in rows.items():
        mean = statistics.fmean(r["ms"])
        tokens = f"{statistics.median(r['tokens']):.0f}" if r["tokens"] else "-"
        print(f"  {name:>9} {mean:>9.1f} {mean / base:>7.2f} {statistics.median(r['ms']):>10.1f} {max(r['ms']):>8.1f} "
              f"{sum(r['boxes']) / steps:>12.2f} {tokens:>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
