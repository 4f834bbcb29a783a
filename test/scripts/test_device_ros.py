"""The ROS device call on CPU, the twin of scripts/device_ros.sh: the venv's own ROS (the prefix and msgs parts
skip), the tiny random checkpoint and the demo model fed over real DDS at 5 Hz, and the pacing runs of docs/carla.md
at full speed and 3x slower on 2 short routes; every figure checked against where it comes from (stamps, counters).
Also: the wheel unpacker's layout on a wheel built here, a prefix part that fails clearly, the pairing of partial
pacing runs and the targets' lines. On the lent GPU the same script runs the 2B shape and the demo model at 1080p."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile

import pytest

from test.support import REPO_ROOT as ROOT
from test.support.ros_helpers import unique_domain_id

SCRIPT = ROOT / "scripts" / "device_ros.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import device_ros_summary  # noqa: E402
import pacing_runs  # noqa: E402
import ros_prefix  # noqa: E402

RATE_HZ, DURATION_S = 5, 6
TWIN = {"DEVICE": "cpu", "RANDOM_SHAPE": "tiny", "NODE_SIZE": "320 180", "NODE_RATE_HZ": str(RATE_HZ),
        "NODE_DURATION_S": str(DURATION_S), "NODE_THREADS": "1", "PACING_ROUTES": "2", "PACING_ROUTE_M": "10",
        "PACING_CHUNK": "2", "PACING_JOBS": "2", "TOTAL_S": "900",
        "PARTS": "prefix:15 msgs:75 node-random:150 node-demo:150 pacing:400"}


def _run(tmp_path, env: dict[str, str], timeout_s: float = 1200):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1",
           "WHEELS": str(tmp_path / "none"), "DOMAIN_BASE": str(unique_domain_id(6)),
           "PACING_DOMAIN": str(unique_domain_id(8)), **env}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


def _packed(tmp_path) -> dict[str, str]:
    with tarfile.open(tmp_path / "out" / "device_ros.tar.gz") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read().decode() for m in tar if m.isfile()}


def _rows(text: str) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for line in text.splitlines():
        row = json.loads(line)
        rows.setdefault(row["row"], []).append(row)
    return rows


def _check_node_run(rows: dict[str, list[dict]], valid_plans: bool) -> None:
    """A node run's figures against where they come from: the frames published here, the node's counters, the
    trajectories' stamps."""
    (start,) = rows["start"]
    (s,) = rows["summary"]
    frames = rows.get("frame", [])
    # configure -> active over the lifecycle services holds the node's own configure (load, check, warm-up)
    assert start["configure_s"] >= start["node_configure_s"] - 0.05 > 0 and start["activate_s"] >= 0
    assert start["configure_to_active_s"] == pytest.approx(start["configure_s"] + start["activate_s"])
    assert start["node_load_s"] <= start["node_configure_s"] and start["process_up_s"] > 0
    # every frame published is accounted for: received by the node (none lost on loopback), then planned, dropped
    # by keep-latest because a newer one arrived, or skipped with a cause
    assert s["frames_published"] == RATE_HZ * DURATION_S
    assert s["received_by_node"] + s["lost_on_wire"] == s["frames_published"] and s["lost_on_wire"] == 0
    assert s["planned"] + s["dropped_keep_latest"] + s["skipped"] == s["received_by_node"] and s["unaccounted"] == 0
    assert s["skipped"] == sum(s["skips"].values())
    assert s["planned"] >= 2 and s["trajectories_received"] == s["planned"] == len(frames)
    # latencies from real stamps: each trajectory carries a stamp this run published, once, and arrived after
    # its own decode
    assert s["unknown_stamps"] == 0 and all(f["known_stamp"] for f in frames)
    assert len({f["stamp_ns"] for f in frames}) == len(frames)
    assert all(f["latency_ms"] > f["policy_ms"] > 0 and f["tokens"] > 0 for f in frames)
    assert 0 < s["latency_p50_ms"] <= s["latency_p95_ms"] <= s["latency_max_ms"] < 1000 * (DURATION_S + 60)
    assert s["policy_p50_ms"] < s["latency_p50_ms"]
    assert s["peak_memory_mb"] > 0 and s["memory_kind"] == "rss" and s["gpu_process_mb"] is None
    assert 0 < s["stage_total_p50_ms"] <= s["stage_total_p95_ms"]
    assert (s["valid_plans"] == s["planned"]) if valid_plans else s["valid_plans"] == 0


@pytest.mark.slow
def test_device_ros_twin_runs_every_part_on_cpu(tmp_path):
    done = _run(tmp_path, TWIN)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for part in ("prefix", "msgs"):
        assert f"{part}: skipped (this Python already imports rclpy and the messages)" in out
    for part in ("node-random", "node-demo", "pacing"):
        assert f"== {part} (at most" in out and f"{part}: passed after" in out, out
    assert "device_ros: every part passed" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["device_ros.tar.gz", "summary.txt"]   # within a call's 8 files
    raw = _packed(tmp_path)
    _check_node_run(_rows(raw["node-random.jsonl"]), valid_plans=False)     # a random model's answers never parse
    _check_node_run(_rows(raw["node-demo.jsonl"]), valid_plans=True)
    assert _rows(raw["node-random.jsonl"])["checkpoint"][0]["write_s"] > 0
    assert "active: realtime mode" in raw["node-demo.planner.log"]

    pacing = _rows(raw["pacing/pacing.jsonl"])
    assert sorted((c["slowdown"], c["exit"]) for c in pacing["chunk"]) == [(1.0, 0), (3.0, 0)]
    (table,) = pacing["figures"]
    assert set(table["sides"]) == {"x1", "x3"} and all(side["routes"] == 2 for side in table["sides"].values())
    assert table["sides"]["x1"]["pacing_holds"] > 0                     # the controller held for the planner's plans
    assert [(r["seed"], r["index"]) for r in table["routes"]] == [(table["routes"][0]["seed"], i) for i in (0, 1)]
    for side, chunk in ((f"x{c['slowdown']:g}", c) for c in pacing["chunk"]):
        assert [r[side] for r in table["routes"]] == chunk["route_completion"]
        assert all(0.0 <= v <= 1.0 for v in chunk["route_completion"])
    paired = table["paired"]
    assert paired["routes"] == 2 and paired["slowdown"] == "x3 - x1"
    assert paired["route_completion_minus_baseline"] == pytest.approx(
        table["sides"]["x3"]["route_completion"] - table["sides"]["x1"]["route_completion"])
    lo, hi = paired["interval"]
    assert lo <= paired["route_completion_minus_baseline"] <= hi
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for line in ("camera -> trajectory p50 / p95 ms", "| random tiny | 30 x 320x180 at 5 Hz |",
                 "| wam-diff2-demo-b32 | 30 x 320x180 at 5 Hz |", "paired over 2 routes, x3 - x1",
                 "pacing: passed after", "device cpu"):
        assert line in summary, summary
    assert "Targets (H200)" not in summary                            # the targets are the GPU's


def test_without_ros_and_without_wheels_the_prefix_part_fails_clearly(tmp_path):
    """A Python without rclpy (here the venv's without its site-packages) runs the prefix part; with no wheels it
    stops with the reason, the run fails, and the packed status says so."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    done = _run(tmp_path, {"PYTHON": str(python), "ROS_WHEELS": str(tmp_path / "no_wheels"),
                           "ROS_PREFIX": str(tmp_path / "prefix"), "PARTS": "prefix:30"}, timeout_s=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "prefix: FAILED (exit 1)" in done.stdout and "device_ros: FAILED" in done.stdout
    raw = _packed(tmp_path)
    assert "no wheels in" in raw["prefix.log"] and raw["status.txt"].startswith("prefix: FAILED")


def _wheel(path, files: dict[str, bytes], modes: dict[str, int] | None = None):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (modes or {}).get(name, 0o644) << 16
            archive.writestr(info, data)
    return path


def test_a_wheel_is_laid_out_on_the_prefix_as_pip_installs_it(tmp_path, monkeypatch):
    import numpy
    import sysconfig

    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cmake = ("set_target_properties(x PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "
             '"/opt/python/cp312-cp312/include/python3.12;'
             '/opt/python/cp312-cp312/lib/python3.12/site-packages/numpy/_core/include")\n')
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels / f"ros_demo-1.0-{ours}-{ours}-manylinux_2_28_x86_64.whl", {
        "demo/__init__.py": b"", "ros_demo-1.0.dist-info/METADATA": b"Name: ros-demo\n",
        "ros_demo.libs/libvendored.so": b"\x7fELF",
        "ros_demo-1.0.data/data/lib/libdemo.so": b"\x7fELF",
        "ros_demo-1.0.data/data/share/demo/cmake/demoExport.cmake": cmake.encode(),
        "ros_demo-1.0.data/scripts/demo-tool": b"#!/bin/sh\n",
        "ros_demo-1.0.data/purelib/demo_extra.py": b"X = 1\n"}, {"ros_demo-1.0.data/scripts/demo-tool": 0o755})
    _wheel(wheels / "ros_wheels_bootstrapper-0.1.2-py3-none-any.whl", {"ros_wheels_bootstrapper.pth": b"import x\n"})
    prefix = tmp_path / "prefix"
    assert ros_prefix.unpack(wheels, prefix) == 0
    site = ros_prefix.site_packages(prefix)
    assert (site / "demo" / "__init__.py").is_file() and (site / "demo_extra.py").read_text() == "X = 1\n"
    assert (prefix / "lib" / "libdemo.so").is_file() and os.access(prefix / "bin" / "demo-tool", os.X_OK)
    assert not (site / "ros_wheels_bootstrapper.pth").exists()       # it would re-execute Python
    exported = (prefix / "share" / "demo" / "cmake" / "demoExport.cmake").read_text()
    assert sysconfig.get_paths()["include"] in exported and numpy.get_include() in exported
    assert "/opt/python" not in exported
    env = (prefix / "env.sh").read_text()
    assert f'PYTHONPATH="{site}' in env and f"{site}/ros_demo.libs" in env and "RMW_IMPLEMENTATION=rmw_fastrtps_cpp" in env
    other = "cp313" if ours != "cp313" else "cp312"
    _wheel(wheels / f"ros_other-1.0-{other}-{other}-manylinux_2_28_x86_64.whl", {"other/__init__.py": b""})
    with pytest.raises(SystemExit, match=f"is for {other}, not this Python"):
        ros_prefix.unpack(wheels, tmp_path / "prefix2")


def _summary(routes: list[tuple[int, float]]) -> dict:
    results = [{"seed": 2000, "index": i, "route_completion": c, "completed": c == 1.0, "ticks": 100,
                "controls_fallback": 10, "wall_s": 5.0, "collisions": [], "lane_departures": 0,
                "extra": {"controller": {"pacing_holds": 9, "pacing_timeouts": 1}}} for i, c in routes]
    return {"settings": {"seed": 2000, "route_length_m": 60.0, "routes": [i for i, _ in routes]},
            "summary": {"completed": sum(r["completed"] for r in results), "collisions": 0, "lane_departures": 0},
            "results": results}


def test_pacing_pairs_only_the_routes_both_slowdowns_drove(tmp_path):
    """A chunk stopped at its bound leaves no summary: its routes are shown for the side that drove them and left
    out of the pairing."""
    for name, routes in (("x1_r000", [(0, 1.0), (1, 1.0)]), ("x3_r000", [(0, 1.0), (1, 0.5)]),
                         ("x1_r002", [(2, 1.0), (3, 0.8)])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(_summary(routes)))
    table = pacing_runs.figures(tmp_path)
    assert table["sides"]["x1"]["routes"] == 4 and table["sides"]["x3"]["routes"] == 2
    assert [r.get("x3") for r in table["routes"]] == [1.0, 0.5, None, None]
    assert table["paired"]["routes"] == 2
    assert table["paired"]["route_completion_minus_baseline"] == pytest.approx(-0.25)
    text = pacing_runs.markdown(table)
    assert "| 2000, 3 | 80.0 % | - |" in text and "paired over 2 routes, x3 - x1: route completion -25.0 points" in text


def test_the_targets_are_set_against_the_figures_on_cuda(tmp_path, capsys):
    start = {"row": "start", "label": "random 2b", "configure_to_active_s": 75.0, "node_load_s": 9.0,
             "node_warmup_s": 30.0}
    summary = {"row": "summary", "label": "random 2b", "frames_published": 600, "size": "1920x1080", "rate_hz": 10.0,
               "latency_p50_ms": 52.0, "latency_p95_ms": 70.0, "policy_p50_ms": 40.0, "planned": 590,
               "dropped_keep_latest": 9, "skipped": 1, "lost_on_wire": 0, "unaccounted": 0, "valid_plans": 0,
               "peak_memory_mb": 5200.0, "memory_kind": "cuda_allocated", "gpu_process_mb": 6100.0}
    (tmp_path / "node-random.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(summary) + "\n")
    stopped = [{"row": "start", "label": "wam-diff2-demo-b32", "configure_to_active_s": 12.0}] + [
        {"row": "frame", "latency_ms": ms, "valid": True} for ms in (40.0, 30.0, 50.0)]    # no summary: cut short
    (tmp_path / "node-demo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stopped))
    assert device_ros_summary.main([str(tmp_path), "--device", "cuda"]) == 0
    text = capsys.readouterr().out
    assert "| wam-diff2-demo-b32 | stopped before its summary: 3 plans received | 40 / 49 | | | 3 | 12.0 |" in text
    assert "| random 2b | 600 x 1920x1080 at 10 Hz | 52 / 70 | 40 | 590 / 9 / 1 / 0 / 0 |" in text
    assert "random 2b: p50 52 ms (target <= 60): met" in text
    assert "random 2b: no frame dropped beyond keep-latest: NOT met" in text       # one frame skipped
    assert "random 2b: configure -> active 75.0 s (target <= 60): NOT met" in text
    assert device_ros_summary.main([str(tmp_path / "nothing"), "--device", "cuda"]) == 0       # parts decide
    assert "Targets" not in capsys.readouterr().out
