"""The report-set figures' spread: bootstrap intervals and scripts/score_summary.py on known inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.evaluation.spread import bootstrap_interval

SCRIPT = ROOT / "scripts" / "score_summary.py"


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_more_rows():
    rng = np.random.default_rng(1)
    few, many = rng.normal(2.0, 1.0, 20), rng.normal(2.0, 1.0, 2000)
    lo_few, hi_few = bootstrap_interval(few, np.mean)
    lo_many, hi_many = bootstrap_interval(many, np.mean)
    assert lo_few < few.mean() < hi_few and lo_many < many.mean() < hi_many
    assert (hi_many - lo_many) < (hi_few - lo_few) / 5            # ~ 1/sqrt(n): 10x narrower
    # the normal-theory 95 % half-width, 1.96 sigma / sqrt(n), within 20 %
    assert (hi_many - lo_many) / 2 == pytest.approx(1.96 * many.std() / np.sqrt(len(many)), rel=0.2)
    assert bootstrap_interval(few, np.mean) == (lo_few, hi_few)   # deterministic for a seed
    assert bootstrap_interval(np.full(10, 3.0), np.mean) == (3.0, 3.0)


def test_bootstrap_interval_keeps_rows_paired():
    ar = np.linspace(1.0, 5.0, 50)
    rows = np.stack([1.1 * ar, ar], 1)                            # the model is 10 % worse on every sample
    assert bootstrap_interval(rows, lambda r: r[:, 0].mean() / r[:, 1].mean()) == pytest.approx((1.1, 1.1))


@pytest.mark.parametrize("rows, match", [(np.array([]), "no rows"), (np.ones(3), "level")])
def test_bootstrap_interval_refuses_bad_input(rows, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_interval(rows, np.mean, level=0.95 if len(rows) == 0 else 1.5)


def _sample(i: int, l2_4s: float | None, forwards: int, tokens: int = 80) -> dict:
    errors = None if l2_4s is None else [l2_4s * (k + 1) / 8 for k in range(8)]
    return {"id": f"s{i}", "errors": errors, "forwards": forwards, "tokens": tokens}


def _write_inputs(tmp_path: Path) -> tuple[Path, list[Path]]:
    ar = [_sample(i, 1.0 + i % 2, 80) for i in range(10)]                        # L2@4s 1, 2, 1, 2 ... mean 1.5
    b32 = [_sample(i, None if i == 0 else 1.2 * (1.0 + i % 2), 20 + i) for i in range(10)]
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({
        "baseline": {"samples": 10, "l2_4s_mean": 3.0},
        "configurations": [{"label": "AR", "per_sample": ar}, {"label": "Block-32 t=0.9", "per_sample": b32}]}))
    loops = []
    for seed, completion in ((8001, [1.0, 0.5]), (8002, [1.0, 1.0, 0.7])):
        d = tmp_path / f"closed_loop_{seed}"
        d.mkdir()
        results = [{"seed": seed, "route_completion": c} for c in completion]
        (d / "summary.json").write_text(json.dumps({"results": results, "summary": {
            "completed": sum(c == 1.0 for c in completion), "collisions": 0, "lane_departures": 1}}))
        loops.append(d)
    return bench, loops


def test_score_summary_reports_known_figures(tmp_path):
    bench, loops = _write_inputs(tmp_path)
    out = subprocess.run([sys.executable, str(SCRIPT), "--bench", str(bench), "--closed-loop", *map(str, loops),
                          "--json", str(tmp_path / "s.json")], capture_output=True, text=True, check=True).stdout
    figures = json.loads((tmp_path / "s.json").read_text())
    ar, b32 = figures["open_loop"]
    assert ar["l2_at_s"]["4"] == pytest.approx(1.5) and ar["l2_at_s"]["2"] == pytest.approx(0.75)
    assert ar["forwards_per_token_median"] == pytest.approx(1.0)
    assert b32["unparseable"] == 1 and b32["parsed"] == 9 and b32["paired_with_ar"] == 9
    assert b32["l2_4s_vs_ar"] == pytest.approx(1.2)                            # paired: the same 9 samples
    assert b32["l2_4s_vs_ar_interval"] == pytest.approx([1.2, 1.2])
    assert b32["per_waypoint_vs_ar"] == pytest.approx([1.2] * 8)
    assert b32["forwards_per_token_median"] == pytest.approx(np.median([(20 + i) / 80 for i in range(10)]))
    loop = figures["closed_loop"]
    assert loop["routes"] == 5 and loop["route_completion"] == pytest.approx(4.2 / 5)
    assert [s["route_completion"] for s in loop["per_seed"]] == pytest.approx([0.75, 0.9])
    lo, hi = loop["route_completion_interval"]
    assert lo < 0.84 < hi <= 1.0
    assert "| Block-32 t=0.9 | 0.467 | 0.933 | 1.400 | 1.867 [" in out and "1 of 10" in out
    assert "| 8001 | 2 | 75.0 % |" in out and "constant velocity: L2@4s mean 3.000 m over 10 samples" in out


def _pdm(pdms: float | None) -> dict:
    """A bench per-sample PDM entry (None: the answer did not parse, PDMS 0)."""
    if pdms is None:
        return {"pdms": 0.0, "parsed": False}
    return {"pdms": pdms, "parsed": True, "nc": 1.0, "dac": 1.0, "ttc": pdms, "ep": 0.5, "c": 1.0}


def test_score_summary_reports_pdms_with_the_paired_difference_from_ar(tmp_path):
    """PDMS x 100 with its interval, sub-scores over parsed answers, and B32 - AR paired per sample: AR scores
    0.9 everywhere, Block-32 0.8 except one unparsed answer (0), so its mean is 0.72 and its paired
    difference (-0.9 once, -0.1 nine times) -0.18."""
    bench, _ = _write_inputs(tmp_path)
    data = json.loads((bench / "bench.json").read_text())
    ar, b32 = (c["per_sample"] for c in data["configurations"])
    for i, (a, b) in enumerate(zip(ar, b32)):
        a["pdm"], b["pdm"] = _pdm(0.9), _pdm(None if i == 0 else 0.8)
    (bench / "bench.json").write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(SCRIPT), "--bench", str(bench), "--json", str(tmp_path / "s.json")],
                         capture_output=True, text=True, check=True).stdout
    ar_row, b32_row = json.loads((tmp_path / "s.json").read_text())["open_loop"]
    assert ar_row["pdm"]["pdms"] == pytest.approx(0.9) and ar_row["pdms_interval"] == pytest.approx([0.9, 0.9])
    assert "pdms_minus_ar" not in ar_row
    assert b32_row["pdm"]["pdms"] == pytest.approx(0.72) and b32_row["pdm"]["pdm_parsed"] == 9
    assert b32_row["pdm"]["ttc"] == pytest.approx(0.8)                     # over the 9 parsed answers
    assert b32_row["pdms_minus_ar"] == pytest.approx(-0.18)
    lo, hi = b32_row["pdms_minus_ar_interval"]
    assert -0.9 < lo < -0.18 < hi < -0.099
    assert "| AR | 90.0 [90.0, 90.0] | 0 | 100.0 | 100.0 | 90.0 | 50.0 | 100.0 |" in out
    assert "| Block-32 t=0.9 | 72.0 [" in out and "| -18.0 [" in out


def test_score_summary_names_an_unreadable_input(tmp_path):
    missing = tmp_path / "nowhere"
    r = subprocess.run([sys.executable, str(SCRIPT), "--bench", str(missing)], capture_output=True, text=True)
    assert r.returncode != 0 and f"cannot read {missing}" in r.stderr


def test_ablation_table_puts_each_scored_arm_in_the_recipe_order(tmp_path):
    """scripts/ablation_table.py over two arms' score_summary JSON: the AR reference first, then the
    arms in the recipe's order (not the order found), each with its figures and selection-set CE."""
    bench, loops = _write_inputs(tmp_path)
    runs = tmp_path / "ablation"
    for arm in ("stage2_jsd", "direct"):
        (runs / "report" / arm).mkdir(parents=True)
        subprocess.run([sys.executable, str(SCRIPT), "--bench", str(bench), "--closed-loop", *map(str, loops),
                        "--json", str(runs / "report" / arm / "summary.json")], capture_output=True, check=True)
    (runs / "selection").mkdir()
    (runs / "selection" / "stage2_jsd.json").write_text(json.dumps({"ce": 0.61234}))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ablation_table.py"), str(runs)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[2].startswith("| AR model (reference) | - | 0.375 | 0.750 | 1.125 | 1.500 [")
    assert out[3].startswith("| direct adaptation") and out[4].startswith("| + Stage II, JSD") and len(out) == 5
    assert "| 0.6123 | 0.467 | 0.933 | 1.400 | 1.867 [" in out[4] and "| 1.20 [1.20, 1.20] |" in out[4]
    assert "| 1.20 1.20 1.20 1.20 1.20 1.20 1.20 1.20 |" in out[4] and "| 1 of 10 | 84.0 % [" in out[4]
    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / "ablation_table.py"), str(tmp_path / "none")],
                           capture_output=True, text=True)
    assert empty.returncode != 0 and "no report/<row>/summary.json" in empty.stderr


@pytest.mark.parametrize("env, message", [
    ({"SET": "train"}, "SET must be report or selection, got 'train'"),
    ({"ROUTE_SEEDS": "8001 2000"}, "ROUTE_SEEDS: 2000 is not a route seed of the report set (8001 8002)"),
    ({"THREADS": "0"}, "THREADS must be a positive integer, got '0'"),
    ({"THREADS": "two"}, "THREADS must be a positive integer, got 'two'"),
])
def test_score_demo_refuses_bad_settings_before_any_work(tmp_path, env, message):
    """scripts/score_demo.sh names the bad setting and stops before it makes data or writes OUT."""
    data, out = tmp_path / "report_set", tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "score_demo.sh")], capture_output=True, text=True,
                       env={**os.environ, "DATA": str(data), "OUT": str(out), **env})
    assert r.returncode == 2 and message in r.stderr
    assert not data.exists() and not out.exists()


def _loop(folder, seed: int, completion: list[float], collisions: list[int], traffic: bool = False):
    folder.mkdir()
    results = [{"seed": seed, "index": i, "route_completion": c, "collisions": [{}] * k, "lane_departures": 1}
               for i, (c, k) in enumerate(zip(completion, collisions))]
    (folder / "summary.json").write_text(json.dumps({"settings": {"seed": seed, "traffic": traffic,
                                                                  "planner": folder.name}, "results": results, "summary": {
        "completed": sum(c == 1.0 for c in completion), "collisions": sum(collisions), "lane_departures": len(results)}}))
    return folder


def test_score_summary_pairs_closed_loop_routes_with_a_baseline(tmp_path):
    """Route completion paired per (seed, index): +0.5, 0, -0.2 and +0.3 average +0.15; routes must match."""
    runs = [_loop(tmp_path / "n4_1", 1, [1.0, 0.6], [0, 1]), _loop(tmp_path / "n4_2", 2, [0.8, 0.9], [0, 0])]
    base = [_loop(tmp_path / "n1_1", 1, [0.5, 0.6], [0, 0]), _loop(tmp_path / "n1_2", 2, [1.0, 0.6], [2, 0])]
    out = subprocess.run([sys.executable, str(SCRIPT), "--closed-loop", *map(str, runs), "--closed-loop-baseline",
                          *map(str, base), "--json", str(tmp_path / "s.json")], capture_output=True, text=True,
                         check=True).stdout
    paired = json.loads((tmp_path / "s.json").read_text())["closed_loop_paired"]
    assert paired["routes"] == 4 and paired["route_completion_minus_baseline"] == pytest.approx(0.15)
    lo, hi = paired["interval"]
    assert -0.2 <= lo < 0.15 < hi <= 0.5
    assert (paired["routes_better"], paired["routes_worse"]) == (2, 1)
    assert (paired["collisions_run"], paired["collisions_baseline"]) == (1, 2)
    assert "route completion +15.0 points" in out and "better on 2 routes, worse on 1" in out
    fewer = subprocess.run([sys.executable, str(SCRIPT), "--closed-loop", *map(str, runs), "--closed-loop-baseline",
                            str(base[0])], capture_output=True, text=True)
    assert fewer.returncode != 0 and "must drive the same routes" in fewer.stderr
    twice = subprocess.run([sys.executable, str(SCRIPT), "--closed-loop", *map(str, runs), str(runs[0]),
                            "--closed-loop-baseline", *map(str, base)], capture_output=True, text=True)
    assert twice.returncode != 0 and "route (1, 0) (seed, index) is given twice" in twice.stderr
    traffic = _loop(tmp_path / "n1_2_traffic", 2, [1.0, 0.6], [0, 0], traffic=True)
    other = subprocess.run([sys.executable, str(SCRIPT), "--closed-loop", *map(str, runs), "--closed-loop-baseline",
                            str(base[0]), str(traffic)], capture_output=True, text=True)
    assert other.returncode != 0 and "driven under other settings by the two sides (traffic)" in other.stderr
