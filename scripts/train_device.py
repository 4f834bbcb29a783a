#!/usr/bin/env python3
"""The whole demo recipe in one device call: data, every training stage and the selection set's scores.

    python3 scripts/train_device.py                                   # the lent GPU machine, its image as it is
    python3 scripts/train_device.py --device cpu --episodes 4 --frames 4 --hidden-size 64 ...   # the CPU twin (CI)

Stages, in order, each its own processes under its own time bound (``--bounds``), on the existing tools
(``wam-diff2 synth / tiny-checkpoint / train / convert / export / bench``) and configs (``training/demo/*.yaml``):

- ``synth``: the demo world's drives of the selection set's protocol (``sim/protocol.py``: seed 0, 160 episodes, the
  last 40 held out as ``val.json``) with planning, recovery and grounding samples, on every core;
- ``init``: a Qwen3-VL built from code (``--hidden-size`` ...), checked to fit what a call brings back;
- ``vision``: the vision tower's warm-up on the grounding samples (``vision.yaml``);
- ``ar``: AR training on planning and grounding samples from the warmed-up tower (``ar.yaml``), exported in bf16;
- ``curriculum``: convert, then Stage I, B = 4 -> 8 -> 16 -> 32 (``curriculum.yaml``);
- ``distill``: Stage II, the B = 32 model distilled from Stage I's B = 4 model (``distill.yaml``), exported in bf16;
- ``score``: ``wam-diff2 bench`` of the two exports on the selection set (``val.json``, every ``--score-every``-th
  sample): L2, PDMS and, where pycocotools imports, the grounding answers' COCO AP.

A training stage stops itself before its bound (``train.time_limit_s``: the bound less ``--reserve-s`` for the
process start, loading and saving; a curriculum splits it over its block sizes) and still writes its model; the
bound itself is a hard stop. After every stage the run's state that matters (status, settings, logs, each run's
metrics and config, the bf16 models, the scores) is packed into ``OUT/device_train.tar.gz``, beside
``summary.txt``: two files, as a device call brings back at most eight (64 MiB). A call cut short returns what was
done.

Run state lives in ``--runs`` (default ``~/.cache/wam-diff2/runs/device-demo``, wam_diff2_core/utils/cache_dirs.py):
a command whose output exists is skipped and a training run resumes from its checkpoint, so a stopped run continues
where it stopped (``--stages`` runs a subset). Defaults of steps and batch are the demo recipe's YAMLs' own; the GPU
settings (``--mixed-precision``, ``--tf32``, ``--batch``, the steps, the model size, ``--num-workers``) are options,
none of them measured on a GPU yet (training/README.md, "The demo recipe in one device call").
Exit status: 0 when every stage passed or was done already, 1 when one failed or was stopped at its bound, 2 for
bad options.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))          # the GPU image has the checkout, not an installed package

from wam_diff2_core.benchmark.model_comparison import DEFAULT_THRESHOLD, SWEEP_BLOCK  # noqa: E402
from wam_diff2_core.sim.protocol import SELECTION  # noqa: E402
from wam_diff2_core.trainer.training_config import MIXED_PRECISION, TrainSection  # noqa: E402
from wam_diff2_core.utils.cache_dirs import run_dir  # noqa: E402

STAGES = ("synth", "init", "vision", "ar", "curriculum", "distill", "score")
# seconds per stage on the GPU machine; they add up to within CALL_BUDGET_S (guesses until a device run measures)
BOUNDS_S = {"synth": 45, "init": 15, "vision": 60, "ar": 140, "curriculum": 100, "distill": 50, "score": 90}
CALL_BUDGET_S = 540              # a device call runs 10 minutes at most; its start and transfers take ~30 s
RETURN_LIMIT_BYTES = 64 << 20    # what a device call brings back from $OUT
TAR_NAME, SUMMARY_NAME = "device_train.tar.gz", "summary.txt"
MODELS = {"ar": "wam-diff2-demo-ar", "b32": "wam-diff2-demo-b32"}     # the shipped models' names (models/)
TASKS = ("planning", "grounding")
TRAINING_RUNS = ("vision", "ar", "curriculum", "distill")   # run folders under --runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where it trains and scores")
    p.add_argument("--out", type=Path, default=os.environ.get("OUT") or None,
                   help="folder for device_train.tar.gz and summary.txt (default: $OUT, else RUNS/out)")
    p.add_argument("--runs", type=Path, default=None,
                   help="run state (data, checkpoints, logs); default: the cache's runs/device-demo")
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES, help="stages to run (in order)")
    p.add_argument("--bounds", default="", help="per-stage bounds overriding the defaults, 'STAGE:SECONDS ...' "
                   f"(default: {' '.join(f'{k}:{v}' for k, v in BOUNDS_S.items())})")
    p.add_argument("--budget-s", type=float, default=CALL_BUDGET_S,
                   help="the selected stages' bounds must add up to at most this (one device call)")
    p.add_argument("--reserve-s", type=float, default=20.0,
                   help="of a training stage's bound, kept for the process start, loading and saving")
    g = p.add_argument_group("data (the selection set's drives: sim/protocol.py)")
    g.add_argument("--episodes", type=int, default=None, help="synth episodes (default: the protocol's)")
    g.add_argument("--frames", type=int, default=None, help="camera frames per episode (default: the protocol's)")
    g.add_argument("--synth-workers", type=int, default=os.cpu_count() or 1, help="synth processes")
    g = p.add_argument_group("model (default: the shipped demo models' language model, a vision tower of depth 4, "
                             "width 128)")
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--vision-depth", type=int, default=4)
    g.add_argument("--vision-hidden-size", type=int, default=128)
    g = p.add_argument_group("training (default: each stage's training/demo/*.yaml)")
    g.add_argument("--batch", type=int, default=None, help="samples per optimizer step, in one forward")
    g.add_argument("--vision-steps", type=int, default=None)
    g.add_argument("--ar-steps", type=int, default=None)
    g.add_argument("--block-steps", type=int, default=None, help="steps of each curriculum block size")
    g.add_argument("--distill-steps", type=int, default=None)
    g.add_argument("--mixed-precision", default=TrainSection.mixed_precision, choices=MIXED_PRECISION,
                   help="train.mixed_precision (auto: bf16 autocast on CUDA)")
    g.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=TrainSection.tf32,
                   help="train.tf32: float32 matrix products outside autocast in TF32 (CUDA)")
    g.add_argument("--num-workers", type=int, default=None,
                   help="data.num_workers: processes reading images and tokenising (default: 8 on cuda, 0 on cpu)")
    g = p.add_argument_group("scores (wam-diff2 bench on the selection set)")
    g.add_argument("--score-every", type=int, default=SELECTION.every, help="every N-th sample of each task "
                   "(default: the protocol's)")
    g.add_argument("--score-limit", type=int, default=None, help="at most this many samples of each task")
    g.add_argument("--score-tasks", nargs="+", default=None, choices=TASKS,
                   help="default: both where pycocotools imports (grounding AP needs it), else planning")
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        p.error(str(exc))
    return args


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the option that is wrong; fills in the defaults that depend on others."""
    bounds = dict(BOUNDS_S)
    for entry in args.bounds.split():
        stage, _, seconds = entry.partition(":")
        if stage not in STAGES:
            raise ValueError(f"--bounds: {entry!r}: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
        try:
            bounds[stage] = float(seconds)
        except ValueError:
            raise ValueError(f"--bounds: {entry!r} is not STAGE:SECONDS") from None
        if bounds[stage] <= 0:
            raise ValueError(f"--bounds: {entry!r}: a bound must be positive")
    args.bound_s = bounds
    total = sum(bounds[s] for s in args.stages)
    if total > args.budget_s:
        raise ValueError(f"--bounds: the stages' bounds add up to {total:g} s, over --budget-s {args.budget_s:g} "
                         "(one device call)")
    for name in ("episodes", "frames", "batch", "vision_steps", "ar_steps", "block_steps", "distill_steps",
                 "score_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}: {value} must be at least 1")
    for name in ("synth_workers", "hidden_size", "layers", "vision_depth", "vision_hidden_size", "score_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: {getattr(args, name)} must be at least 1")
    if args.num_workers is None:
        args.num_workers = 8 if args.device == "cuda" else 0
    elif args.num_workers < 0:
        raise ValueError(f"--num-workers: {args.num_workers} must be 0 or more")
    if args.reserve_s < 0:
        raise ValueError(f"--reserve-s: {args.reserve_s} must be 0 or more")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA device here (the CPU twin is --device cpu)")
    if args.score_tasks is None:
        try:
            import pycocotools  # noqa: F401
            args.score_tasks = list(TASKS)
        except ImportError:
            args.score_tasks = ["planning"]
    args.runs = (args.runs or run_dir("device-demo")).absolute()
    args.out = Path(args.out or args.runs / "out").absolute()


@dataclass
class Command:
    """One ``wam-diff2`` command of a stage: skipped when ``output`` exists; ``train_runs`` > 0 marks a ``train``
    command (resumed when its run folder exists, its stage's time split over that many runs)."""
    argv: list[str]
    output: Path
    needs: tuple[Path, ...] = ()
    train_runs: int = 0
    run_folder: Path | None = None


@dataclass
class Stage:
    name: str
    commands: list[Command] = field(default_factory=list)


def plan(args: argparse.Namespace) -> list[Stage]:
    """Every stage's commands, from the options (nothing runs here)."""
    runs, data = args.runs, args.runs / "data"
    models = runs / "models"
    synth = list(SELECTION.synth)
    for flag in ("episodes", "frames"):
        if getattr(args, flag) is not None:
            synth[synth.index(f"--{flag}") + 1] = str(getattr(args, flag))

    def train(config: str, model: Path, out: Path, steps: int | None, final: Path, *extra: str,
              runs_in_stage: int = 1, needs: tuple[Path, ...] = ()) -> Command:
        argv = ["train", "--config", f"training/demo/{config}.yaml", "--model.path", str(model),
                "--output.dir", str(out), "--data.train_file", str(data / "train.json"), "--data.data_root", str(data),
                "--train.device", args.device, "--train.mixed_precision", args.mixed_precision,
                "--train.tf32", str(args.tf32).lower(), "--data.num_workers", str(args.num_workers), *extra]
        if args.batch:
            argv += ["--train.global_batch_size", str(args.batch), "--train.micro_batch_size", str(args.batch)]
        if steps:
            argv += ["--train.max_steps", str(steps)]
        return Command(argv, final, needs=(model, data / "train.json", *needs), train_runs=runs_in_stage,
                       run_folder=out)

    def export(src: Path, name: str) -> Command:
        return Command(["export", str(src), str(models / name), "--dtype", "bfloat16"], models / name, needs=(src,))

    scores = runs / "scores" / "-".join(args.score_tasks)
    bench = ["--log-level", "WARNING", "bench", "--model", str(models / MODELS["b32"]),
             "--ar-model", str(models / MODELS["ar"]), "--data", str(data / SELECTION.samples),
             "--every", str(args.score_every), "--tasks", *args.score_tasks, "--block-sizes", str(SWEEP_BLOCK),
             "--thresholds", str(DEFAULT_THRESHOLD), "--device", args.device, "--out", str(scores), "--overwrite"]
    if args.score_limit:
        bench += ["--limit", str(args.score_limit)]
    block4, block32 = runs / "curriculum" / "block4" / "final", runs / "curriculum" / "block32" / "final"
    return [
        Stage("synth", [Command(["synth", str(data), *synth, "--formats", "json", "--vqa-per-frame", "0",
                                 "--workers", str(args.synth_workers), "--no-progress", "--overwrite"],
                                data / "manifest.json")]),
        Stage("init", [Command(["tiny-checkpoint", str(runs / "init"), "--ar", "--seed", "0", "--logit-scale", "1",
                                "--hidden-size", str(args.hidden_size), "--layers", str(args.layers),
                                "--vision-depth", str(args.vision_depth),
                                "--vision-hidden-size", str(args.vision_hidden_size)], runs / "init")]),
        Stage("vision", [train("vision", runs / "init", runs / "vision", args.vision_steps,
                               runs / "vision" / "final")]),
        Stage("ar", [train("ar", runs / "vision" / "final", runs / "ar", args.ar_steps, runs / "ar" / "final"),
                     export(runs / "ar" / "final", MODELS["ar"])]),
        Stage("curriculum", [Command(["convert", str(runs / "ar" / "final"), str(runs / "init_diffusion"),
                                      "--block-size", "4"], runs / "init_diffusion", needs=(runs / "ar" / "final",)),
                             train("curriculum", runs / "init_diffusion", runs / "curriculum", args.block_steps,
                                   block32, runs_in_stage=4)]),
        Stage("distill", [train("distill", block32, runs / "distill", args.distill_steps, runs / "distill" / "final",
                                "--distill.teacher_path", str(block4), needs=(block4,)),
                          export(runs / "distill" / "final", MODELS["b32"])]),
        Stage("score", [Command(bench, scores / "bench.json",
                                needs=(models / MODELS["b32"], models / MODELS["ar"], data / SELECTION.samples))]),
    ]


class Runner:
    """Runs stages, each under its bound, writing status, logs and the packed results as it goes."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.runs, self.out = args.runs, args.out
        self.logs = self.runs / "logs"
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.problems: list[str] = []

    def status(self, line: str) -> None:
        print(line, flush=True)
        with open(self.runs / "status.txt", "a") as f:
            f.write(line + "\n")

    def run(self, stages: list[Stage]) -> int:
        self.runs.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.status(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(sys.argv)}")
        self.write_settings()
        for stage in stages:
            if stage.name not in self.args.stages:
                continue
            started = time.monotonic()
            try:
                ok = self.run_stage(stage)
            except (SystemExit, KeyboardInterrupt):     # SIGTERM / Ctrl-C: the stage's processes are gone
                self.fail(stage.name, started, "INTERRUPTED")
                self.pack()
                raise
            self.pack()
            if not ok:
                break
        print(self.summary(), end="")
        return 0 if not self.problems else 1

    def run_stage(self, stage: Stage) -> bool:
        bound = self.args.bound_s[stage.name]
        started = time.monotonic()
        print(f"== {stage.name} (at most {bound:g} s)", flush=True)
        ran = False
        for command in stage.commands:
            if command.output.exists():
                continue
            missing = [str(p) for p in command.needs if not p.exists()]
            if missing:
                return self.fail(stage.name, started, f"FAILED: needs {', '.join(missing)} (an earlier stage's output)")
            left = bound - (time.monotonic() - started)
            argv = list(command.argv)
            if command.train_runs:
                argv += ["--train.time_limit_s", f"{max(left - self.args.reserve_s, 1.0) / command.train_runs:.1f}"]
                if command.run_folder.exists():
                    argv.append("--resume")
            rc = self.call(stage.name, argv, left)
            ran = True
            if rc is None:
                return self.fail(stage.name, started, "STOPPED at its bound")
            if rc != 0:
                return self.fail(stage.name, started, f"FAILED (exit {rc}; log logs/{stage.name}.log)")
            if not command.output.exists():
                return self.fail(stage.name, started, f"FAILED: {command.output} was not written")
        if stage.name == "init":
            problem = self.check_model_size()
            if problem:
                return self.fail(stage.name, started, f"FAILED: {problem}")
        took = time.monotonic() - started
        self.status(f"{stage.name}: {'done' if ran else 'skipped (its outputs exist)'} after {took:.0f} s")
        return True

    def fail(self, stage: str, started: float, what: str) -> bool:
        self.problems.append(stage)
        self.status(f"{stage}: {what} after {time.monotonic() - started:.0f} s")
        return False

    def call(self, stage: str, argv: list[str], timeout_s: float) -> int | None:
        """Exit status of ``wam-diff2 ARGV`` run as its own process group (in this session, so whatever ends the
        call ends it too), its output appended to the stage's log; None when stopped at ``timeout_s`` (the group
        is terminated, then killed). Interrupted itself (SIGTERM, Ctrl-C), this kills the group first."""
        command = [sys.executable, "-m", "wam_diff2_core.cli", *argv]
        with open(self.logs / f"{stage}.log", "a") as log:
            log.write(f"$ wam-diff2 {shlex.join(argv)}\n")
            log.flush()
            proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    process_group=0)
            try:
                return proc.wait(timeout=max(timeout_s, 0.1))
            except subprocess.TimeoutExpired:
                _stop_group(proc, signal.SIGTERM)
                log.write(f"stopped at the stage's bound ({timeout_s:.0f} s left when it started)\n")
                return None
            except BaseException:
                _stop_group(proc, signal.SIGKILL)
                raise

    def check_model_size(self) -> str | None:
        """Two bf16 exports of the initial model must come back with the rest (64 MiB a call)."""
        float32 = sum(p.stat().st_size for p in (self.runs / "init").glob("*.safetensors"))
        exports = float32              # two models at half the bytes each
        if exports > RETURN_LIMIT_BYTES - (8 << 20):
            return (f"two bf16 exports of this model ({exports / 2**20:.0f} MiB; --hidden-size "
                    f"{self.args.hidden_size}, --layers {self.args.layers}) leave no room in the "
                    f"{RETURN_LIMIT_BYTES >> 20} MiB a device call brings back")
        return None

    def write_settings(self) -> None:
        import torch
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()}
        settings.update(torch=torch.__version__, python=sys.version.split()[0],
                        device_name=torch.cuda.get_device_name() if self.args.device == "cuda" else "cpu")
        (self.runs / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")

    def training_metrics(self) -> list[Path]:
        """metrics.jsonl of every training run (each curriculum block size its own), in stage order."""
        found = []
        for folder in TRAINING_RUNS:
            found += sorted((self.runs / folder).glob("**/metrics.jsonl"), key=_natural)
        return [p for p in found if "checkpoints" not in p.parts and not p.parent.name.startswith(".")]

    def packed_files(self) -> list[Path]:
        """What comes back: status, settings, logs, every run's metrics and config, the bf16 models, the scores."""
        files = [self.runs / "status.txt", self.runs / "settings.json", *sorted(self.logs.glob("*.log"))]
        for metrics in self.training_metrics():
            files += [metrics, metrics.with_name("config.yaml")]
        for folder in ("models", "scores"):
            files += sorted(p for p in (self.runs / folder).rglob("*") if p.is_file()
                            and not any(part.startswith(".") for part in p.relative_to(self.runs).parts))
        return [p for p in files if p.is_file()]

    def pack(self) -> None:
        """OUT/device_train.tar.gz (replaced whole, so a stop mid-pack leaves the previous one) and summary.txt."""
        partial = self.out / f".{TAR_NAME}.partial"
        with tarfile.open(partial, "w:gz") as tar:
            for path in self.packed_files():
                tar.add(path, arcname=str(path.relative_to(self.runs)))
        os.replace(partial, self.out / TAR_NAME)
        size = (self.out / TAR_NAME).stat().st_size
        if size > RETURN_LIMIT_BYTES - (1 << 20) and "pack" not in self.problems:
            self.problems.append("pack")
            self.status(f"pack: {TAR_NAME} is {size / 2**20:.1f} MiB, over what a device call brings back")
        (self.out / SUMMARY_NAME).write_text(self.summary())

    def summary(self) -> str:
        """The status lines of this run, a line per training run (steps, loss, samples/s), the scores' tables."""
        lines = (self.runs / "status.txt").read_text().splitlines()
        start = max(i for i, line in enumerate(lines) if line.startswith("== "))
        out = lines[start:] + ["", "training runs (metrics.jsonl):"]
        for metrics in self.training_metrics():
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if not records:
                continue
            first, last = records[:10], records[-10:]
            stopped = " (stopped at train.time_limit_s)" if "stopped_at_time_limit_s" in records[-1] else ""
            out.append(f"  {metrics.parent.relative_to(self.runs)}: {records[-1]['step']} steps{stopped}, loss "
                       f"{statistics.mean(r['loss'] for r in first):.4f} (first 10) -> "
                       f"{statistics.mean(r['loss'] for r in last):.4f} (last 10), "
                       f"{statistics.median(r['samples_per_s'] for r in records):.1f} samples/s (median)")
        score_log = self.logs / "score.log"
        if score_log.exists():
            out += ["", "scores (logs/score.log, its last command):"]
            text = score_log.read_text()
            out += text[text.rfind("$ wam-diff2 "):].splitlines()
        return "\n".join(out) + "\n"


def _stop_group(proc: subprocess.Popen, first: signal.Signals) -> None:
    """``first`` to the process group of ``proc``, SIGKILL after 5 s if it is still there."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5.0)
            return
        except subprocess.TimeoutExpired:
            continue


def _natural(path: Path) -> tuple:
    """Sort key: a run before its sub-runs, block4 before block16."""
    return len(path.parts), [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # a stopped call ends the stage's processes too
    return Runner(args).run(plan(args))


if __name__ == "__main__":
    sys.exit(main())
