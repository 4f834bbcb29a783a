"""scripts/train_device.py, the one-call device recipe, as its CPU twin: every stage at toy scale (a few steps, four
short drives, a 1-layer model), what comes back in OUT (two files: the packed run and its summary), a stage stopped
at its bound (the call cut short still returns what was done), and the next call continuing from there without
redoing a finished stage. On the GPU machine the same script runs the demo recipe's sizes."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.model.checkpoint import load_checkpoint

SCRIPT = ROOT / "scripts" / "train_device.py"
TOY = ["--device", "cpu", "--episodes", "4", "--frames", "4", "--hidden-size", "64", "--layers", "1",
       "--vision-depth", "1", "--vision-hidden-size", "32", "--batch", "4", "--vision-steps", "2", "--ar-steps", "2",
       "--block-steps", "1", "--distill-steps", "2", "--score-every", "1", "--score-limit", "2", "--synth-workers", "2",
       "--budget-s", "3000"]
# CI's 2 shared cores are slower than the device, and start Python more slowly: every stage gets room
CPU_BOUNDS = "synth:120 init:120 vision:180 ar:240 curriculum:400 distill:240 score:300"


def _run(tmp_path, *extra, timeout=900, cache="cache"):
    env = {**os.environ, "WAM_DIFF2_CACHE": str(tmp_path / cache), "OUT": str(tmp_path / "out"),
           "OMP_NUM_THREADS": "1"}
    env.pop("WAM_DIFF2_RUNS", None)
    return subprocess.run([sys.executable, str(SCRIPT), *TOY, *extra], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


def _packed(tmp_path) -> dict[str, bytes]:
    with tarfile.open(tmp_path / "out" / "device_train.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _stamps(folder):
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_cpu_twin_trains_every_stage_returns_what_was_done_and_resumes_without_redoing(tmp_path):
    # a call cut short: the distillation stage is stopped at a 2 s bound (its process has not even loaded)
    first = _run(tmp_path, "--bounds", CPU_BOUNDS.replace("distill:240", "distill:2"))
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    runs = tmp_path / "cache" / "runs" / "device-demo"           # run state in the user's cache by default
    status = (runs / "status.txt").read_text()
    for stage in ("synth", "init", "vision", "ar", "curriculum"):
        assert f"{stage}: done after" in status, status
    assert "distill: STOPPED at its bound" in status and "\nscore:" not in status
    assert sorted(os.listdir(tmp_path / "out")) == ["device_train.tar.gz", "summary.txt"]     # within 8 files
    packed = _packed(tmp_path)
    assert "models/wam-diff2-demo-ar/model.safetensors" in packed            # what was done came back
    assert not any(name.startswith("models/wam-diff2-demo-b32") for name in packed)
    assert [json.loads(line)["step"] for line in packed["ar/metrics.jsonl"].decode().splitlines()] == [1, 2]
    assert {f"curriculum/block{b}/metrics.jsonl" for b in (4, 8, 16, 32)} <= set(packed)
    assert not any(name.startswith("data/") or "/checkpoints/" in name for name in packed)
    assert "distill: STOPPED at its bound" in (tmp_path / "out" / "summary.txt").read_text()
    finished = {p: t for p, t in _stamps(runs).items() if p.parts[len(runs.parts)] in ("data", "init", "vision", "ar",
                                                                                        "curriculum", "models")}

    # the next call: the finished stages are skipped (their files untouched), distillation and scoring run
    second = _run(tmp_path, "--bounds", CPU_BOUNDS)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    status = (runs / "status.txt").read_text().split("\n== ")[-1]
    for stage in ("synth", "init", "vision", "ar", "curriculum"):
        assert f"{stage}: skipped (its outputs exist)" in status, status
    assert "distill: done after" in status and "score: done after" in status
    assert {p: t for p, t in _stamps(runs).items() if p in finished} == finished
    assert (runs / "logs" / "ar.log").read_text().count("$ wam-diff2 train") == 1      # trained once

    packed = _packed(tmp_path)
    bench = json.loads(packed["scores/planning-grounding/bench.json"])
    assert [c["label"] for c in bench["configurations"]] == ["AR", "Block-32 t=0.9"]
    assert bench["samples"] == 2 and bench["grounding_samples"] == 2 and bench["device"] == "cpu"
    assert all(c["grounding"]["coco"]["images"] == 2 for c in bench["configurations"])
    assert [json.loads(line)["step"] for line in packed["distill/metrics.jsonl"].decode().splitlines()] == [1, 2]
    settings = json.loads(packed["settings.json"])
    assert settings["device"] == "cpu" and settings["hidden_size"] == 64 and settings["score_tasks"] == [
        "planning", "grounding"]
    models = runs / "models"
    for name, block_size in (("wam-diff2-demo-ar", 1), ("wam-diff2-demo-b32", 32)):
        loaded = load_checkpoint(models / name, device="cpu", dtype="float32")
        assert loaded.config.block_size == block_size
        assert loaded.model.config.text_config.hidden_size == 64
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "distill: done after" in summary and "grounding answers: COCO AP" in summary
    assert "curriculum/block32: 1 steps" in summary and "ar: 2 steps" in summary

    # where the GPU image lacks pycocotools: the returned tar, unpacked on another machine, scores the grounding
    # answers there from the same drives made again (training/README.md's commands)
    elsewhere = tmp_path / "here" / "runs" / "device-demo"
    elsewhere.mkdir(parents=True)
    with tarfile.open(tmp_path / "out" / "device_train.tar.gz") as tar:
        tar.extractall(elsewhere, filter="data")
    third = _run(tmp_path, "--stages", "synth", "score", "--score-tasks", "grounding", "--bounds", CPU_BOUNDS,
                 cache="here")
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    grounding = json.loads((elsewhere / "scores" / "grounding" / "bench.json").read_text())
    assert grounding["samples"] == 0 and grounding["grounding_samples"] == 2
    assert [c["grounding"]["coco"]["truth_boxes"] for c in grounding["configurations"]] == [
        c["grounding"]["coco"]["truth_boxes"] for c in bench["configurations"]]       # the same drives again


def test_a_stopped_call_ends_the_stage_it_was_in_and_packs_what_was_done(tmp_path):
    """SIGTERM to the runner (a device call's end): the running stage's processes are killed with it (no training
    left behind on the machine), its status says INTERRUPTED and OUT holds what was done."""
    env = {**os.environ, "WAM_DIFF2_CACHE": str(tmp_path / "cache"), "OUT": str(tmp_path / "out"),
           "OMP_NUM_THREADS": "1"}
    runs = tmp_path / "cache" / "runs" / "device-demo"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *TOY, "--stages", "synth", "init", "--bounds", CPU_BOUNDS],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("== init"):
                break
        time.sleep(1.0)                     # tiny-checkpoint has started (it takes several seconds)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    status = (runs / "status.txt").read_text()
    assert "synth: done after" in status and "init: INTERRUPTED" in status, status
    left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p) and str(runs) in _cmdline(p)]
    assert left == [], [_cmdline(p) for p in left]
    assert "init: INTERRUPTED" in _packed(tmp_path)["status.txt"].decode()


def _cmdline(proc_dir) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _load_script():
    spec = importlib.util.spec_from_file_location("train_device", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)          # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


@pytest.mark.parametrize("extra,message", [
    (["--bounds", "warmup:30"], "--bounds: 'warmup:30': unknown stage 'warmup'"),
    (["--bounds", "ar:soon"], "--bounds: 'ar:soon' is not STAGE:SECONDS"),
    (["--bounds", "ar:3000", "--budget-s", "540"], "bounds add up to 3360 s, over --budget-s 540"),
    (["--ar-steps", "0"], "--ar-steps: 0 must be at least 1"),
    (["--hidden-size", "0"], "--hidden-size: 0 must be at least 1"),
])
def test_a_bad_option_is_refused_naming_it(tmp_path, extra, message):
    done = _run(tmp_path, *extra, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_the_gpu_recipe_is_refused_where_torch_sees_no_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, str(SCRIPT), "--stages", "init"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "WAM_DIFF2_CACHE": str(tmp_path)})
    assert done.returncode == 2 and "--device cuda: torch sees no CUDA device" in done.stderr, done.stderr


def test_defaults_are_one_call_the_shipped_language_model_and_the_recipe_yamls(tmp_path):
    """The stages' bounds fit one call; the model defaults are the shipped demo models' language model; steps and
    batch are left to each stage's YAML unless given."""
    module = _load_script()
    assert sum(module.BOUNDS_S.values()) <= module.CALL_BUDGET_S <= 570
    shipped = json.loads((ROOT / "models" / "wam-diff2-demo-ar" / "config.json").read_text())["text_config"]
    args = module.parse_args(["--device", "cpu", "--runs", str(tmp_path / "runs")])
    assert (args.hidden_size, args.layers) == (shipped["hidden_size"], shipped["num_hidden_layers"])
    commands = [c for stage in module.plan(args) for c in stage.commands]
    trains = [c.argv for c in commands if c.train_runs]
    assert [a[a.index("--config") + 1] for a in trains] == [f"training/demo/{n}.yaml" for n in
                                                              ("vision", "ar", "curriculum", "distill")]
    assert all((ROOT / a[a.index("--config") + 1]).is_file() for a in trains)
    assert not any("--train.max_steps" in a or "--train.global_batch_size" in a for a in trains)
    assert all(a[a.index("--train.device") + 1] == "cpu" for a in trains)
    synth = commands[0].argv
    assert synth[synth.index("--seed") + 1] == "0" and "--no-detection" not in synth     # grounding samples too


def test_a_model_too_large_to_bring_back_is_refused_after_init(tmp_path):
    module = _load_script()
    args = module.parse_args(["--device", "cpu", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    runner = module.Runner(args)
    init = tmp_path / "runs" / "init"
    init.mkdir(parents=True)
    with open(init / "model.safetensors", "wb") as f:            # sparse: 40 MiB of float32 weights, 20 per export
        f.truncate(40 << 20)
    assert runner.check_model_size() is None
    with open(init / "model.safetensors", "wb") as f:
        f.truncate(60 << 20)
    assert "two bf16 exports of this model (60 MiB" in runner.check_model_size()
