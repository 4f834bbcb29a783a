"""The leaderboard pacing of docs/carla.md, planner at full speed and slowed: the same routes driven by
``wam-diff2-ros closed-loop ... --timing leaderboard --bridge --pacing hold --planner-slowdown S`` for each S,
route completion side by side and paired per route with its 95 % bootstrap interval.

    . scripts/env.sh && python scripts/pacing_runs.py --model models/wam-diff2-demo-b32 --device cuda --routes 10 \\
        --jobs 10 --chunk 2 --out runs/pacing                              # a GPU: 20 route runs in 10 processes
    python scripts/pacing_runs.py --figures runs/pacing                    # the figures of what is there

The routes are split into chunks of ``--chunk`` consecutive routes, each chunk driven once per slowdown by its
own ``closed-loop`` process in its own DDS domain (``--domain-base`` + n), at most ``--jobs`` at a time (chunks
of both slowdowns interleaved, so what finishes first pairs). Each process writes ``OUT/x<S>_r<first>/summary.json``
when its routes are done; a row per finished process goes to ``OUT/pacing.jsonl`` as it finishes, then the
figures. The figures read whatever summaries are there (a run stopped at its bound leaves the chunks it
finished): per slowdown the route completion over its routes with its interval (scripts/score_summary.py's
``closed_loop``), the routes completed and the controller's holds and hold timeouts; per route both completions;
and the slower run minus full speed paired over the routes both drove (``closed_loop_paired``).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from score_summary import closed_loop, closed_loop_paired

REPO = Path(__file__).resolve().parents[1]


def chunk_dir(out: Path, slowdown: float, first: int) -> Path:
    return out / f"x{slowdown:g}_r{first:03d}"


def closed_loop_command(args, slowdown: float, first: int, routes: int, domain: int) -> list[str]:
    """docs/carla.md's pacing command for ``routes`` routes from ``first``, slowed ``slowdown`` x."""
    return [sys.executable, "-m", "wam_diff2_ros.tools.cli", "closed-loop", "--model", args.model,
            "--device", args.device, "--routes", str(routes), "--first-route", str(first),
            "--route-length-m", f"{args.route_length_m:g}", "--timing", "leaderboard", "--bridge", "--pacing", "hold",
            "--planner-slowdown", f"{slowdown:g}", "--no-plots", "--overwrite", "--domain-id", str(domain),
            "--out", str(chunk_dir(args.out, slowdown, first)), *(["--seed", str(args.seed)] if args.seed else [])]


def drive(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    rows = args.out / "pacing.jsonl"
    rows.write_text("")
    firsts = range(0, args.routes, args.chunk)
    jobs = [(s, f, min(args.chunk, args.routes - f)) for f in firsts for s in args.slowdowns]   # both sides of a chunk
    t0 = time.perf_counter()

    def one(n: int, slowdown: float, first: int, routes: int) -> dict:
        t = time.perf_counter()
        log = chunk_dir(args.out, slowdown, first).with_suffix(".log")
        with log.open("w") as f:
            rc = subprocess.run(closed_loop_command(args, slowdown, first, routes, args.domain_base + n), cwd=REPO,
                                stdout=f, stderr=subprocess.STDOUT).returncode
        row = {"row": "chunk", "slowdown": slowdown, "first_route": first, "routes": routes, "exit": rc,
               "wall_s": round(time.perf_counter() - t, 1)}
        summary = chunk_dir(args.out, slowdown, first) / "summary.json"
        if rc == 0 and summary.is_file():
            row["route_completion"] = [r["route_completion"] for r in json.loads(summary.read_text())["results"]]
        else:
            row["log_tail"] = log.read_text().splitlines()[-5:]
        with rows.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"pacing: x{slowdown:g} routes {first}..{first + routes - 1}: exit {rc} after {row['wall_s']} s "
              f"(completion {row.get('route_completion', 'none')})", flush=True)
        return row

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda job: one(*job), [(n, *job) for n, job in enumerate(jobs)]))
    print(f"pacing: {len(done)} closed-loop runs in {time.perf_counter() - t0:.0f} s, at most {args.jobs} at a time")
    table = figures(args.out)
    with rows.open("a") as f:
        f.write(json.dumps({"row": "figures", **table}) + "\n")
    print(markdown(table))
    return 0 if all(r["exit"] == 0 for r in done) else 1


def side_figures(summaries: list[dict]) -> dict:
    """One slowdown's routes: completion with its interval, completed, the controller's holds and timeouts."""
    results = [r for s in summaries for r in s["results"]]
    controller = [r.get("extra", {}).get("controller", {}) for r in results]
    return {**closed_loop([(str(i), s) for i, s in enumerate(summaries)]),
            "completed": sum(r["completed"] for r in results),
            "pacing_holds": sum(c.get("pacing_holds", 0) for c in controller),
            "pacing_timeouts": sum(c.get("pacing_timeouts", 0) for c in controller),
            "fallback_tick_rate": float(np.mean([r["controls_fallback"] / max(1, r["ticks"]) for r in results])),
            "wall_s": float(sum(r["wall_s"] for r in results))}


def figures(out: Path) -> dict:
    """The figures of the summaries under ``out``: per slowdown, per route, and the slowest minus full speed
    (the smallest slowdown) paired over the routes both drove."""
    sides: dict[float, list[dict]] = {}
    for summary in sorted(out.glob("x*_r*/summary.json")):
        slowdown = float(summary.parent.name[1:].split("_r")[0])
        sides.setdefault(slowdown, []).append(json.loads(summary.read_text()))
    if not sides:
        return {"sides": {}, "routes": [], "paired": None}
    per_route: dict[tuple[int, int], dict[str, float]] = {}
    for slowdown, summaries in sides.items():
        for s in summaries:
            for r in s["results"]:
                per_route.setdefault((r["seed"], r["index"]), {})[f"x{slowdown:g}"] = r["route_completion"]
    table = {"sides": {f"x{s:g}": side_figures(v) for s, v in sorted(sides.items())},
             "routes": [{"seed": seed, "index": index, **c} for (seed, index), c in sorted(per_route.items())],
             "paired": None}
    if len(sides) > 1:
        base, slow = min(sides), max(sides)
        both = {(r["seed"], r["index"]) for s in sides[base] for r in s["results"]} & \
            {(r["seed"], r["index"]) for s in sides[slow] for r in s["results"]}
        if both:
            keep = lambda summaries: [{**s, "results": [r for r in s["results"] if (r["seed"], r["index"]) in both]}   # noqa: E731
                                      for s in summaries]
            table["paired"] = {"slowdown": f"x{slow:g} - x{base:g}",
                               **closed_loop_paired(keep(sides[slow]), keep(sides[base]))}
    return table


def markdown(table: dict) -> str:
    sides, out = table["sides"], []
    if not sides:
        return "pacing: no closed-loop run finished"
    names = list(sides)
    out += ["| planner | routes | route completion [95 %] | completed | holds / past the bound | fallback ticks |",
            "|---|---|---|---|---|---|"]
    for name, s in sides.items():
        lo, hi = s["route_completion_interval"]
        out.append(f"| {name} | {s['routes']} | {100 * s['route_completion']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] "
                   f"| {s['completed']} / {s['routes']} | {s['pacing_holds']} / {s['pacing_timeouts']} | "
                   f"{100 * s['fallback_tick_rate']:.1f} % |")
    out += ["", "| route (seed, index) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in table["routes"]:
        out.append(f"| {r['seed']}, {r['index']} | " + " | ".join(
            f"{100 * r[n]:.1f} %" if n in r else "-" for n in names) + " |")
    paired = table["paired"]
    if paired:
        lo, hi = paired["interval"]
        out += ["", f"paired over {paired['routes']} routes, {paired['slowdown']}: route completion "
                f"{100 * paired['route_completion_minus_baseline']:+.1f} points [95 %: {100 * lo:+.1f}, {100 * hi:+.1f}]; "
                f"better on {paired['routes_better']}, worse on {paired['routes_worse']}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--figures", type=Path, metavar="OUT", help="only print the figures of the runs in OUT")
    p.add_argument("--model", default=str(REPO / "models" / "wam-diff2-demo-b32"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--routes", type=int, default=10)
    p.add_argument("--route-length-m", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None, help="route seed (default: the closed loop's)")
    p.add_argument("--slowdowns", type=float, nargs="+", default=[1.0, 3.0])
    p.add_argument("--chunk", type=int, default=2, help="routes per closed-loop process (default 2)")
    p.add_argument("--jobs", type=int, default=4, help="closed-loop processes at a time (default 4)")
    p.add_argument("--domain-base", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0") or 0) + 1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.figures:
        print(markdown(figures(args.figures)))
        return 0
    if args.out is None:
        p.error("--out is required to drive routes")
    if min(args.routes, args.chunk, args.jobs) < 1:
        p.error("--routes, --chunk and --jobs must be at least 1")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
