"""The distillation ablation's table (models/README.md's), from what scripts/ablation_demo.sh wrote.

    python scripts/ablation_table.py runs/ablation            # reads report/<row>/summary.json, selection/*.json

One row per trained arm that has a report-set summary (scripts/score_demo.sh's report protocol),
in the recipe's order: L2 at 1-4 s (mean over parsed answers; 4 s with its 95 % bootstrap interval),
L2 at 4 s over the AR model's on the samples both parsed (paired, with interval), the per-waypoint
ratio to AR at 0.5 .. 4 s (the exposure-bias curve: does the gap widen with the horizon?), tokens
per forward at threshold 0.9, unparseable answers, closed-loop route completion (with interval);
the AR model's own figures first. Beside it, the selection-set validation loss each Stage II arm
was chosen by (``selection/<arm>.json``; that choice never saw the report set).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wam_diff2_core.evaluation.spread import format_with_interval

ROWS = {   # name under report/ -> what the row is (scripts/ablation_demo.sh's runs)
    "direct": "direct adaptation: AR -> B = 32, Stage I CE at B = 32 only",
    "stage1_control": "+ Stage I CE at B = 32 (the control: Stage II's steps)",
    "stage2_jsd": "+ Stage II, JSD (B = 4 teacher, on-policy)",
    "stage2_fkl": "+ Stage II, forward KL",
    "stage2_rkl": "+ Stage II, reverse KL",
    "stage2_jsd_off_policy": "+ Stage II, JSD off-policy (ground-truth answers noised)",
    "stage2_ar_teacher": "+ Stage II, JSD from the AR model (same size, next-token view)",
    "stage3": "+ Stage III (3.4x larger B = 32 teacher, JSD off-policy)",
    "stage3_control": "+ Stage I CE at B = 32 from Stage III's start (its control: its steps)",
}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"ablation_table: cannot read {path}: {exc}") from None


def _open_row(summary: dict, ar: bool) -> dict:
    """The AR reference row of a score_summary JSON, or the model's row beside it."""
    return next(r for r in summary["open_loop"] if (r["label"] == "AR") == ar)


def _cells(r: dict, loop: dict | None) -> list[str]:
    l2 = r["l2_at_s"]                                  # keys "1".."4" (JSON)
    cells = [f"{l2[str(t)]:.3f}" for t in (1, 2, 3)]
    cells.append(format_with_interval(l2["4"], r["l2_4s_mean_interval"]))
    if "l2_4s_vs_ar" in r:
        cells.append(format_with_interval(r["l2_4s_vs_ar"], r["l2_4s_vs_ar_interval"], 2))
        cells.append(" ".join(f"{x:.2f}" for x in r["per_waypoint_vs_ar"]))
    else:
        cells += ["1", "-"]
    cells.append(f"{1 / r['forwards_per_token_median']:.2f}")
    cells.append(f"{r['unparseable']} of {r['samples']}")
    if loop:
        lo, hi = loop["route_completion_interval"]
        cells.append(f"{100 * loop['route_completion']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] ({loop['routes']})")
    else:
        cells.append("-")
    return cells


def table(runs: Path) -> str:
    report, selection = runs / "report", runs / "selection"
    rows = [(name, what, _read(report / name / "summary.json")) for name, what in ROWS.items()
            if (report / name / "summary.json").is_file()]
    if not rows:
        raise SystemExit(f"ablation_table: no report/<row>/summary.json under {runs}")
    header = ("| row | selection-set CE | L2@1s | L2@2s | L2@3s | L2@4s mean | L2@4s / AR | per waypoint / AR "
              "(0.5 .. 4 s) | tokens/forward | unparseable | route completion (routes) |")
    out = [header, "|" + "---|" * (header.count("|") - 1)]
    out.append("| AR model (reference) | - | " + " | ".join(_cells(_open_row(rows[0][2], ar=True), None)) + " |")
    for name, what, summary in rows:
        chosen = selection / f"{name}.json"
        ce = f"{_read(chosen)['ce']:.4f}" if chosen.is_file() else "-"
        out.append(f"| {what} | {ce} | " + " | ".join(_cells(_open_row(summary, ar=False), summary.get("closed_loop")))
                   + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, help="scripts/ablation_demo.sh's RUNS folder (runs/ablation)")
    print(table(p.parse_args(argv).runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
