"""The demo models' figures with their spread, from what scripts/score_demo.sh wrote.

    python scripts/score_summary.py --bench OUT/bench --closed-loop OUT/closed_loop_8001 OUT/closed_loop_8002

Open loop (``wam-diff2 bench --data`` output, bench.json): per configuration the number of samples,
L2 at 1-4 s (mean over parsed answers), the mean L2 at 4 s with its 95 % bootstrap interval over
samples, the same over the AR row's on the samples both parsed (paired), forwards per token (median
with interval) and unparseable answers; where bench scored PDMS (NAVSIM v1, the demo world's road and traffic),
the mean PDMS with its interval, the sub-scores and the paired difference from the AR row (an answer that does
not parse scores 0). Closed loop (``wam-diff2 closed-loop`` summary.json, one per
route seed): route completion per seed and over all routes with its interval over routes; with
``--closed-loop-baseline`` (the same routes driven otherwise) the paired difference in route completion.
Prints markdown tables (the model card's); ``--json`` writes every number.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from wam_diff2_core.evaluation.metrics import PDM_SUBSCORES, pdm_means
from wam_diff2_core.evaluation.spread import bootstrap_interval, format_with_interval
from wam_diff2_core.outputs.prompts import WAYPOINT_DT_S

HORIZONS = (1, 2, 3, 4)   # s


def _load(path: Path, name: str) -> dict:
    file = path / name if path.is_dir() else path
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"score_summary: cannot read {file}: {exc}") from None


def open_loop(bench: dict) -> list[dict]:
    configs = bench["configurations"]
    ar = configs[0]
    ar_errors = {r["id"]: r["errors"] for r in ar["per_sample"]}
    rows = []
    for c in configs:
        samples = c["per_sample"]
        errors = np.array([r["errors"] for r in samples if r["errors"] is not None])   # [parsed, 8]
        fpt = np.array([r["forwards"] / r["tokens"] for r in samples if r["tokens"]])
        paired = np.array([[r["errors"][-1], ar_errors[r["id"]][-1]] for r in samples
                           if r["errors"] is not None and ar_errors.get(r["id"]) is not None])   # [both, 2]
        at = {t: float(errors[:, round(t / WAYPOINT_DT_S) - 1].mean()) for t in HORIZONS}
        row = {"label": c["label"], "samples": len(samples), "parsed": len(errors),
               "unparseable": len(samples) - len(errors), "l2_at_s": at,
               "l2_4s_mean_interval": bootstrap_interval(errors[:, -1], np.mean),
               "forwards_per_token_median": float(np.median(fpt)),
               "forwards_per_token_interval": bootstrap_interval(fpt, np.median),
               "paired_with_ar": len(paired)}
        if c is not ar and len(paired):
            ratio = lambda r: r[:, 0].mean() / r[:, 1].mean()   # noqa: E731
            row["l2_4s_vs_ar"] = float(ratio(paired))
            row["l2_4s_vs_ar_interval"] = bootstrap_interval(paired, ratio)
            # the exposure-bias curve: per-waypoint mean error over the AR model's, on the same samples
            both = [(r["errors"], ar_errors[r["id"]]) for r in samples
                    if r["errors"] is not None and ar_errors.get(r["id"]) is not None]
            model_k, ar_k = (np.array(x).mean(0) for x in zip(*both))
            row["per_waypoint_vs_ar"] = (model_k / ar_k).tolist()
        row.update(pdm_figures(samples, None if c is ar else ar["per_sample"]))
        rows.append(row)
    return rows


def pdm_figures(samples: list[dict], ar_samples: list[dict] | None) -> dict:
    """Mean PDMS with its interval over the scored samples, the sub-score means, and (``ar_samples``) the paired
    difference from the AR row with its interval; {} when bench scored no PDMS."""
    scored = [r for r in samples if r.get("pdm") is not None]
    if not scored:
        return {}
    pdms = np.array([r["pdm"]["pdms"] for r in scored])
    out = {"pdm": pdm_means([r["pdm"] for r in scored]), "pdms_interval": bootstrap_interval(pdms, np.mean)}
    if ar_samples is not None:
        ar_pdms = {r["id"]: r["pdm"]["pdms"] for r in ar_samples if r.get("pdm") is not None}
        pairs = np.array([r["pdm"]["pdms"] - ar_pdms[r["id"]] for r in scored if r["id"] in ar_pdms])
        if len(pairs):
            out["pdms_minus_ar"] = float(pairs.mean())
            out["pdms_minus_ar_interval"] = bootstrap_interval(pairs, np.mean)
    return out


def closed_loop(summaries: list[tuple[str, dict]]) -> dict:
    per_seed, completion = [], []
    for name, s in summaries:
        routes = [r["route_completion"] for r in s["results"]]
        completion += routes
        per_seed.append({"run": name, "seed": s["results"][0]["seed"] if s["results"] else None,
                         "routes": len(routes), "route_completion": float(np.mean(routes)),
                         "completed": s["summary"]["completed"], "collisions": s["summary"]["collisions"],
                         "lane_departures": s["summary"]["lane_departures"]})
    values = np.array(completion)
    return {"per_seed": per_seed, "routes": len(values), "route_completion": float(values.mean()),
            "route_completion_interval": bootstrap_interval(values, np.mean)}


# what a paired closed-loop comparison may vary between its two sides (everything else must be equal)
VARIANT_SETTINGS = ("planner", "candidates", "quantization")


def closed_loop_paired(runs: list[dict], baseline: list[dict]) -> dict:
    """Route completion of ``runs`` minus ``baseline`` (closed-loop summary.json each), paired per route (the same
    seed and index, driven under the same settings but :data:`VARIANT_SETTINGS`), with its 95 % bootstrap
    interval over routes; collisions and lane departures summed."""
    def routes(summaries, side):
        out, settings = {}, {}
        for s in summaries:
            for r in s["results"]:
                key = (r["seed"], r["index"])
                if key in out:
                    raise SystemExit(f"score_summary: {side}: route {key} (seed, index) is given twice")
                out[key] = r
                settings[key] = {k: v for k, v in s.get("settings", {}).items() if k not in VARIANT_SETTINGS}
        return out, settings
    (a, a_settings), (b, b_settings) = routes(runs, "--closed-loop"), routes(baseline, "--closed-loop-baseline")
    keys = sorted(a)
    if not keys or sorted(b) != keys:
        raise SystemExit("score_summary: --closed-loop and --closed-loop-baseline must drive the same routes "
                         f"(seed, index): {len(keys)} against {len(b)}, {len(set(keys) ^ set(b))} unmatched")
    for k in keys:
        differ = sorted(n for n in set(a_settings[k]) | set(b_settings[k])
                        if a_settings[k].get(n) != b_settings[k].get(n))
        if differ:
            raise SystemExit(f"score_summary: route {k} was driven under other settings by the two sides "
                             f"({', '.join(differ)}); only {', '.join(VARIANT_SETTINGS)} may differ")
    diff = np.array([a[k]["route_completion"] - b[k]["route_completion"] for k in keys])
    return {"routes": len(keys), "route_completion_minus_baseline": float(diff.mean()),
            "interval": bootstrap_interval(diff, np.mean),
            "routes_better": int((diff > 1e-9).sum()), "routes_worse": int((diff < -1e-9).sum()),
            **{f"{k}_{side}": int(sum(len(r[k]) if isinstance(r[k], list) else r[k] for r in rs.values()))
               for k in ("collisions", "lane_departures") for side, rs in (("run", a), ("baseline", b))}}


def markdown(open_rows: list[dict] | None, loop: dict | None, cv: dict | None, paired: dict | None = None) -> str:
    out = []
    if open_rows:
        n = open_rows[0]["samples"]
        out += [f"Open loop: {n} planning samples; L2 in m, mean over parsed answers; [95 % bootstrap interval over "
                "samples]; /AR paired on the samples both parsed", "",
                "| config | L2@1s | L2@2s | L2@3s | L2@4s mean | /AR | forwards/token (median) | tokens/forward | "
                "unparseable |", "|---|---|---|---|---|---|---|---|---|"]
        for r in open_rows:
            vs_ar = format_with_interval(r["l2_4s_vs_ar"], r["l2_4s_vs_ar_interval"], 2) if "l2_4s_vs_ar" in r else "1"
            out.append(f"| {r['label']} | " + " | ".join(f"{r['l2_at_s'][t]:.3f}" for t in HORIZONS[:3])
                       + f" | {format_with_interval(r['l2_at_s'][4], r['l2_4s_mean_interval'])} | {vs_ar} | "
                       f"{format_with_interval(r['forwards_per_token_median'], r['forwards_per_token_interval'])} | "
                       f"{1 / r['forwards_per_token_median']:.2f} | {r['unparseable']} of {r['samples']} |")
        pdm_rows = [r for r in open_rows if "pdm" in r]
        if pdm_rows:
            out += ["", "PDM score (NAVSIM v1 definition, docs/evaluation.md) x 100 over the same samples; an "
                    "unparseable answer scores 0; sub-scores over parsed answers; -AR paired on the same samples", "",
                    "| config | PDMS | -AR | " + " | ".join(k.upper() for k in PDM_SUBSCORES) + " |",
                    "|---|---|---|" + "---|" * len(PDM_SUBSCORES)]
            for r in pdm_rows:
                pct = lambda v, i: format_with_interval(100 * v, (100 * i[0], 100 * i[1]), 1)   # noqa: E731
                diff = pct(r["pdms_minus_ar"], r["pdms_minus_ar_interval"]) if "pdms_minus_ar" in r else "0"
                out.append(f"| {r['label']} | {pct(r['pdm']['pdms'], r['pdms_interval'])} | {diff} | "
                           + " | ".join("-" if r["pdm"][k] is None else f"{100 * r['pdm'][k]:.1f}" for k in PDM_SUBSCORES)
                           + " |")
        if cv:
            out += ["", f"constant velocity: L2@4s mean {cv['l2_4s_mean']:.3f} m over {cv['samples']} samples"]
    if loop:
        out += ["", f"Closed loop: {loop['routes']} routes; route completion "
                f"{100 * loop['route_completion']:.1f} % [95 % bootstrap interval over routes: "
                f"{100 * loop['route_completion_interval'][0]:.1f}, {100 * loop['route_completion_interval'][1]:.1f}]",
                "", "| route seed | routes | route completion | completed | collisions | lane departures |",
                "|---|---|---|---|---|---|"]
        out += [f"| {s['seed']} | {s['routes']} | {100 * s['route_completion']:.1f} % | {s['completed']} | "
                f"{s['collisions']} | {s['lane_departures']} |" for s in loop["per_seed"]]
    if paired:
        lo, hi = paired["interval"]
        out += ["", f"Against the baseline, paired over the same {paired['routes']} routes: route completion "
                f"{100 * paired['route_completion_minus_baseline']:+.1f} points [95 %: {100 * lo:+.1f}, {100 * hi:+.1f}]; "
                f"better on {paired['routes_better']} routes, worse on {paired['routes_worse']}; collisions "
                f"{paired['collisions_run']} (baseline {paired['collisions_baseline']}), lane departures "
                f"{paired['lane_departures_run']} (baseline {paired['lane_departures_baseline']})"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", type=Path, help="a `wam-diff2 bench --data` output folder (bench.json)")
    p.add_argument("--closed-loop", type=Path, nargs="*", default=[], help="`wam-diff2 closed-loop` output folders")
    p.add_argument("--closed-loop-baseline", type=Path, nargs="*", default=[],
                   help="closed-loop output folders of the same routes driven by a baseline: the paired difference")
    p.add_argument("--json", type=Path, help="also write every number here")
    args = p.parse_args(argv)
    if not args.bench and not args.closed_loop:
        p.error("give --bench and/or --closed-loop")
    if args.closed_loop_baseline and not args.closed_loop:
        p.error("--closed-loop-baseline needs --closed-loop")
    bench = _load(args.bench, "bench.json") if args.bench else None
    open_rows = open_loop(bench) if bench else None
    runs = [_load(d, "summary.json") for d in args.closed_loop]
    loop = closed_loop(list(zip(map(str, args.closed_loop), runs))) if runs else None
    paired = (closed_loop_paired(runs, [_load(d, "summary.json") for d in args.closed_loop_baseline])
              if args.closed_loop_baseline else None)
    print(markdown(open_rows, loop, bench["baseline"] if bench else None, paired))
    if args.json:
        args.json.write_text(json.dumps({"open_loop": open_rows, "closed_loop": loop, "closed_loop_paired": paired},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
