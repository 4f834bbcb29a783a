"""``wam-diff2 eval-bag`` end to end with the real tiny checkpoint, on an mcap and a sqlite3 bag.

The tiny model is random: its planning answers do not parse, so these runs exercise the real
decode -> parse-failure path, the decode statistics, the report and the plots; the metric
values themselves are pinned with scripted policies in test_eval_bag.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test.support import REPO_ROOT as REPO
from wam_diff2_core.cli import main
from wam_diff2_core.evaluation.bags import Bag
from test.support.scenes import straight_scene, write_scene_bag

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tiny_checkpoint, tmp_path_factory):
    """One run per storage format: mcap at the checkpoint's block size with --record; sqlite3 with the
    planner node's parameter file and the AR baseline (--block-size 1)."""
    root = tmp_path_factory.mktemp("eval_cli")
    scene = straight_scene(8.0, duration_s=4.6, camera_hz=10.0, odometry_hz=20.0)
    results = {}
    for storage, extra in (("mcap", ["--record", str(root / "predictions")]),
                           ("sqlite3", ["--block-size", "1", "--params-file", str(REPO / "config" / "planner.yaml")])):
        bag = write_scene_bag(root / f"bag_{storage}", scene, storage=storage)
        out = root / f"run_{storage}"
        rc = main(["eval-bag", str(bag), "--model", str(tiny_checkpoint), "--out", str(out), "--device", "cpu",
                   "--max-new-tokens", "8", "--max-frames", "2", "--no-progress", *extra])
        results[storage] = (rc, out, bag)
    results["root"] = root
    return results


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_eval_bag_writes_metrics_report_and_plots(runs, storage, tiny_checkpoint):
    rc, out, _ = runs[storage]
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    frames = [json.loads(line) for line in (out / "frames.jsonl").read_text().splitlines()]
    assert metrics["complete"] is True and metrics["model"]["path"] == str(Path(tiny_checkpoint).resolve())
    assert metrics["model"]["decoding"]["block_size"] == (32 if storage == "mcap" else 1)
    assert metrics["model"]["decoding"]["max_new_tokens"] == 8
    counts = metrics["counts"]
    # 47 frames at 10 Hz over 4.6 s; --max-frames 2 evaluates the first two (both have 4 s of future)
    assert (counts["images"], counts["evaluated"], counts["not_selected"]) == (47, 2, 45)
    o = metrics["overall"]
    assert o["frames"] == 2 == len(frames)
    assert o["parse_failures"] == sum(not f["valid"] for f in frames) and o["valid"] == 2 - o["parse_failures"]
    for f in frames:
        assert isinstance(f["raw_text"], str) and f["command"] == "straight" and f["velocity"] == [8.0, 0.0]
        assert (f["predicted"] is None) == (not f["valid"]) and (f["invalid_reason"] != "") == (not f["valid"])
        assert 1 <= f["stats"]["tokens"] <= 8 and f["stats"]["forwards"] >= 1 and f["latency_ms"] > 0
        assert f["stats"]["block_size"] == metrics["model"]["decoding"]["block_size"]
    assert o["decode"]["tokens_per_frame"]["mean"] >= 1 and o["latency_ms"]["p50"] > 0
    assert o["constant_velocity_all_frames"]["ade"] == pytest.approx(0.0, abs=1e-9)
    for name in ("per_waypoint_error.png", "bev_samples.png", "error_histogram.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    report = (out / "report.md").read_text()
    assert "L2 at t (UniAD convention)" in report and "L2 averaged up to t (ST-P3 / VAD convention)" in report
    assert f"Parse failures: {o['parse_failures']} of 2" in report


def test_params_file_supplies_the_node_settings_and_flags_win(runs):
    _, out, _ = runs["sqlite3"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"]["params_file"] == str(REPO / "config" / "planner.yaml")
    assert metrics["settings"]["inputs"]["odometry_timeout_s"] == 0.5
    assert metrics["settings"]["inputs"]["default_command"] == "straight"
    # the file says block size 32 and 256 tokens; the command line said 1 and 8
    assert (metrics["model"]["decoding"]["block_size"], metrics["model"]["decoding"]["max_new_tokens"]) == (1, 8)


def test_record_bag_holds_the_predictions_with_the_frame_stamps(runs):
    _, out, _ = runs["mcap"]
    frames = [json.loads(line) for line in (out / "frames.jsonl").read_text().splitlines()]
    with Bag(runs["root"] / "predictions") as bag:
        assert bag.storage == "mcap"
        messages = [m for _, _, m in bag.messages(["/wam_diff2/trajectory"])]
    assert [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in messages] == [f["stamp_ns"] for f in frames]
    assert [m.raw_text for m in messages] == [f["raw_text"] for f in frames]
    assert [m.valid for m in messages] == [f["valid"] for f in frames]
    assert [m.stats.tokens for m in messages] == [f["stats"]["tokens"] for f in frames]


def test_compare_block32_with_the_ar_run(runs, capsys):
    root = runs["root"]
    rc = main(["eval-bag", "--compare", str(runs["mcap"][1]), str(runs["sqlite3"][1]), "--out", str(root / "cmp")])
    assert rc == 0
    result = json.loads((root / "cmp" / "compare.json").read_text())
    assert list(result["runs"]) == ["run_mcap (B=32)", "run_sqlite3 (B=1)"]
    md = (root / "cmp" / "compare.md").read_text()
    assert "| frames evaluated | 2 | 2 |" in md and "tokens / forward" in md
    assert "compare: run_mcap (B=32) vs run_sqlite3 (B=1)" in capsys.readouterr().out
