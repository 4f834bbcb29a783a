"""The table of a scripts/device_ros.sh run: the planner node at camera rate and the pacing runs, from the rows its
parts wrote (whatever they wrote before a bound stopped them).

    python scripts/device_ros_summary.py RAW --device cuda          # RAW: the run's folder (device_ros.tar.gz unpacked)

Node rows (scripts/node_rate.py, node-*.jsonl): camera -> trajectory p50 / p95 from the stamps, the node's own
decode p50, where the frames went (planned, dropped by keep-latest, skipped, lost on the wire, not accounted for),
configure -> active, peak memory. Pacing (scripts/pacing_runs.py, pacing/): route completion per slowdown, per route
and paired. On CUDA each figure is set against the H200 targets: the 2B shape's p50 at most 60 ms, no frame
dropped beyond the keep-latest policy, configure -> active at most 60 s, and the same route completion at full
speed and 3x slower within the paired interval.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pacing_runs import figures, markdown

P50_TARGET_MS = 60.0              # the 2B shape at 1080p and 10 Hz
CONFIGURE_TARGET_S = 60.0


def read_rows(path: Path) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(row["row"], []).append(row)
    return rows


def fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def node_lines(raw: Path, device: str) -> tuple[list[str], list[str]]:
    """(the node table, the targets' lines) of every node-*.jsonl in ``raw``."""
    table = ["| run | frames | camera -> trajectory p50 / p95 ms | decode p50 ms | planned / dropped (keep-latest) / "
             "skipped / lost / unaccounted | plans valid | configure -> active s (node's load, warm-up) | peak memory "
             "MB | GPU process MB |", "|---|---|---|---|---|---|---|---|---|"]
    targets = []
    for path in sorted(raw.glob("node-*.jsonl")):
        rows = read_rows(path)
        start = (rows.get("start") or [{}])[0]
        summary = (rows.get("summary") or [None])[0]
        name = start.get("label") or path.stem
        if summary is None:          # stopped at its bound: the plans it had received
            frames = rows.get("frame", [])
            latency = [f["latency_ms"] for f in frames]
            p50, p95 = (float(np.percentile(latency, q)) for q in (50, 95)) if latency else (None, None)
            table.append(f"| {name} | stopped before its summary: {len(frames)} plans received | {fmt(p50)} / "
                         f"{fmt(p95)} | | | {sum(f['valid'] for f in frames)} | "
                         f"{fmt(start.get('configure_to_active_s'), '.1f')} | | |")
            continue
        s = summary
        table.append(
            f"| {name} | {s['frames_published']} x {s['size']} at {s['rate_hz']:g} Hz | "
            f"{fmt(s['latency_p50_ms'])} / {fmt(s['latency_p95_ms'])} | {fmt(s['policy_p50_ms'])} | "
            f"{s['planned']} / {s['dropped_keep_latest']} / {s['skipped']} / {s['lost_on_wire']} / {s['unaccounted']} | "
            f"{s['valid_plans']} | {fmt(start.get('configure_to_active_s'), '.1f')} "
            f"({fmt(start.get('node_load_s'), '.1f')}, {fmt(start.get('node_warmup_s'), '.1f')}) | "
            f"{fmt(s['peak_memory_mb'])} ({s['memory_kind']}) | {fmt(s['gpu_process_mb'])} |")
        if device.startswith("cuda"):
            clean = s["skipped"] == 0 and s["lost_on_wire"] == 0 and s["unaccounted"] == 0
            if "2b" in name:
                targets.append(f"{name}: p50 {fmt(s['latency_p50_ms'])} ms (target <= {P50_TARGET_MS:.0f}): "
                               f"{'met' if (s['latency_p50_ms'] or 1e9) <= P50_TARGET_MS else 'NOT met'}")
            targets.append(f"{name}: no frame dropped beyond keep-latest: {'met' if clean else 'NOT met'}")
            c2a = start.get("configure_to_active_s")
            targets.append(f"{name}: configure -> active {fmt(c2a, '.1f')} s (target <= {CONFIGURE_TARGET_S:.0f}): "
                           f"{'met' if c2a is not None and c2a <= CONFIGURE_TARGET_S else 'NOT met'}")
    return table, targets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path, help="a scripts/device_ros.sh run's folder")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    machine = args.raw / "machine.txt"
    if machine.is_file():
        print(machine.read_text().strip())
    table, targets = node_lines(args.raw, args.device)
    print("\nThe planner node over DDS (camera -> trajectory from the image stamp to the trajectory's arrival)\n")
    print("\n".join(table))
    pacing = figures(args.raw / "pacing") if (args.raw / "pacing").is_dir() else None
    if pacing is not None:
        print("\nPacing: docs/carla.md's closed loop, --timing leaderboard --bridge --pacing hold\n")
        print(markdown(pacing))
        paired = pacing["paired"]
        if args.device.startswith("cuda") and paired:
            lo, hi = paired["interval"]
            targets.append(f"pacing: {paired['slowdown']} within the paired interval [{100 * lo:+.1f}, {100 * hi:+.1f}] "
                           f"points: {'met (0 inside)' if lo <= 0.0 <= hi else 'NOT met'}")
    if targets:
        print("\nTargets (H200):\n" + "\n".join(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
