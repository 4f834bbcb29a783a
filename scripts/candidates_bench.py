"""What plan candidates cost per frame: the policy's latency at N = 1, 2, 4, 8 candidates, side by side.

    python scripts/candidates_bench.py                                  # the demo model, 6 held-out frames, CPU
    python scripts/candidates_bench.py --counts 1 4 --frames 10 --repeats 2 --threads 2

Each frame of a held-out demo-world drive (sim.protocol's DEMO_DRIVE_SEED) is planned by the same loaded
model at every N in turn (frame-major, so load on the machine falls on every N alike), through
DrivingPolicy.step with candidate selection as the node runs it: N rows in one batched decode (row 1
greedy, rows 2..N sampled), each candidate scored online (the ego lane as the route, the frame's
traffic as tracked objects at constant velocity). One warm-up step per N first. Printed per N: the
median frame latency (ms), its ratio to N = 1, the median denoise time, the median of what is not a
decode stage (candidate scoring is in it), the median valid candidates, and the cost of one added row
((latency(N) - latency(1)) / (N - 1)).
"""
from __future__ import annotations

import argparse
import statistics
import time

from wam_diff2_core.candidate_selection import MAX_CANDIDATES, CandidateSettings
from wam_diff2_core.config import EngineSettings, add_threads_argument
from wam_diff2_core.geometry import EgoMotion
from wam_diff2_core.model.checkpoint import load_checkpoint
from wam_diff2_core.policy import DrivingPolicy
from wam_diff2_core.sim.episode import EpisodeSettings, simulate_episode
from wam_diff2_core.sim.pdm_scenes import frame_online_scene
from wam_diff2_core.sim.protocol import DEMO_DRIVE_SEED


def held_out_frames(count: int, first: int):
    """(rgb, ego motion, truth, online scene) of frames first .. first + count - 1 of the held-out drive."""
    episode = simulate_episode(seed=DEMO_DRIVE_SEED, index=0, settings=EpisodeSettings(frames=first + count))
    for k, frame in enumerate(episode.frames()):
        if k < first:
            continue
        truth = frame.truth
        ego = EgoMotion(velocity=truth.velocity, acceleration=truth.acceleration_estimated)
        yield frame.rgb, ego, truth, frame_online_scene(episode, k)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/wam-diff2-demo-b32")
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8], help="candidate counts N")
    p.add_argument("--frames", type=int, default=6, help="held-out frames (from frame --first on)")
    p.add_argument("--first", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="passes over the frames")
    p.add_argument("--temperature", type=float, default=CandidateSettings().temperature)
    p.add_argument("--top-p", type=float, default=CandidateSettings().top_p)
    add_threads_argument(p)
    args = p.parse_args()
    bad = [n for n in args.counts if not 1 <= n <= MAX_CANDIDATES]
    if bad or args.frames < 1 or args.repeats < 1:
        p.error(f"--counts must lie in 1..{MAX_CANDIDATES} (got {bad}), --frames and --repeats >= 1")
    threads = args.cpu_threads or 1
    loaded = load_checkpoint(args.model, device="cpu", dtype="float32")
    engine = EngineSettings(cpu_threads=threads)
    policies = {n: DrivingPolicy(loaded, engine=engine, candidates=CandidateSettings(
        count=n, temperature=args.temperature, top_p=args.top_p)) for n in args.counts}
    frames = list(held_out_frames(args.frames, args.first))
    rows: dict[int, dict[str, list[float]]] = {n: {"ms": [], "denoise": [], "other": [], "valid": []}
                                               for n in args.counts}
    for policy in policies.values():                      # one warm-up step each
        rgb, ego, truth, _ = frames[0]
        policy.step(rgb, ego, truth.command)
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        for rgb, ego, truth, scene in frames:
            for n, policy in policies.items():
                out = policy.step(rgb, ego, truth.command, scene=scene if n > 1 else None)
                rows[n]["ms"].append(out.latency_ms)
                rows[n]["denoise"].append(out.stages.denoise_ms)
                rows[n]["other"].append(out.stages.other_ms)
                rows[n]["valid"].append(out.valid_candidates)
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in rows.items()}
    base = med[args.counts[0]]["ms"] if args.counts[0] == 1 else None
    print(f"candidates bench: {args.model}, cpu, {threads} thread(s), {len(frames)} frames x {args.repeats}, "
          f"temperature {args.temperature}, top-p {args.top_p}; medians ({time.perf_counter() - t0:.0f} s)")
    print(f"  {'N':>3} {'frame ms':>10} {'x N=1':>7} {'denoise ms':>11} {'other ms':>9} {'valid':>6} "
          f"{'ms / added row':>15}")
    for n in args.counts:
        m = med[n]
        ratio = f"{m['ms'] / base:.2f}" if base else "-"
        per_row = f"{(m['ms'] - base) / (n - 1):.1f}" if base and n > 1 else "-"
        print(f"  {n:>3} {m['ms']:>10.1f} {ratio:>7} {m['denoise']:>11.1f} {m['other']:>9.1f} {m['valid']:>6.1f} "
              f"{per_row:>15}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
