"""Bench2Drive drives -> the authors' planning samples (``wam-diff2 convert-data bench2drive SRC OUT``).

Bench2Drive (Jia et al., NeurIPS 2024) publishes one folder per route clip (``SRC`` may be one), at 10 Hz:
``<clip>/camera/rgb_front/00000.jpg`` (1600 x 900) and ``<clip>/anno/00000.json.gz``. Read from an
annotation, in CARLA's **left-handed** world frame (y to the right, yaw clockwise from above):

| key | meaning here |
|---|---|
| ``x``, ``y`` | ego position (m) |
| ``theta`` | ego heading as the compass gives it (rad): 0 = north (-y), clockwise; CARLA yaw = theta - pi/2 (as TCP and Bench2Drive's agents read it) |
| ``speed`` | ego speed (m/s) |
| ``acceleration`` | ego acceleration [x, y, z] (m/s^2) in the world frame (``Actor.get_acceleration``) |
| ``command_near`` | the route's RoadOption at the nearby waypoint (1 LEFT, 2 RIGHT, 3 STRAIGHT, 4 LANEFOLLOW, 5/6 lane changes, -1 VOID) |
| ``bounding_boxes`` | actors: ``class``, ``id``, ``location``, ``rotation`` (degrees, yaw last), ``extent`` (half sizes), ... (counted in the report; not turned into samples yet) |

Per frame with 4 s of later frames, one planning sample (as the synth export writes them): the NAVSIM prompt
from the speed (velocity (speed, 0)), the acceleration in the ego frame and the command, answered with the 8
positions 0.5 ... 4.0 s later in the frame's ego frame (REP-103: CARLA's y negated); the image is copied byte
for byte. Output: ``OUT/samples.json`` (all, rewritten every run), ``OUT/parts/<clip>.jsonl`` (a clip's,
written when it is done: ``--resume`` skips it), ``OUT/report.json`` (per clip: frames, samples and every
missing or unreadable file with the reason; such a frame, and the samples whose future it is part of, are
left out, never stopping the run), ``OUT/images/<clip>/NNNNN.jpg``. Without ``--resume`` an existing OUT is
refused (``--overwrite`` replaces it).
"""
from __future__ import annotations

import gzip
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..geometry import command_from_road_option, world_to_ego
from ..outputs.prompts import NUM_WAYPOINTS, WAYPOINT_DT_S
from .samples import dump_json_list, planning_sample

FRAME_RATE_HZ = 10.0                     # Bench2Drive's recording rate
CAMERA = "rgb_front"
DATASOURCE = "Bench2Drive"


def pose_from_anno(anno: dict[str, Any]) -> tuple[float, float, float]:
    """(x, y, yaw) in a right-handed world frame (CARLA's y negated; yaw counter-clockwise)."""
    carla_yaw = float(anno["theta"]) - math.pi / 2
    return float(anno["x"]), -float(anno["y"]), -carla_yaw


def anno_pose(x: float, y: float, yaw: float) -> dict[str, float]:
    """The inverse of :func:`pose_from_anno`: ``x``, ``y``, ``theta`` of a right-handed pose."""
    return {"x": float(x), "y": -float(y), "theta": float(-yaw + math.pi / 2)}


def ego_acceleration(anno: dict[str, Any], yaw: float) -> tuple[float, float]:
    """The world-frame acceleration [x, y, z] (CARLA) -> (forward, left) in the ego frame."""
    ax, ay = float(anno["acceleration"][0]), -float(anno["acceleration"][1])
    c, s = math.cos(yaw), math.sin(yaw)
    return ax * c + ay * s, -ax * s + ay * c


def anno_acceleration(forward: float, left: float, yaw: float) -> list[float]:
    """The inverse of :func:`ego_acceleration` (z = 0)."""
    c, s = math.cos(yaw), math.sin(yaw)
    ax, ay = forward * c - left * s, forward * s + left * c
    return [float(ax), float(-ay), 0.0]


@dataclass
class ClipReport:
    clip: str
    frames: int = 0
    samples: int = 0
    actors: int = 0                                                  # boxes other than the ego, over all frames
    problems: list[dict[str, str]] = field(default_factory=list)    # {frame, file, reason}

    def problem(self, frame: int, path: Path, reason: str) -> None:
        self.problems.append({"frame": f"{frame:05d}", "file": str(path), "reason": reason})


def find_clips(src: Path) -> list[Path]:
    """Clip folders under ``src`` (folders with ``anno/``), or ``src`` itself when it is one."""
    if (src / "anno").is_dir():
        return [src]
    return sorted(p.parent for p in src.glob("**/anno") if p.is_dir())


def _frame_ids(clip: Path) -> list[int]:
    paths = list((clip / "anno").glob("*.json.gz")) + list((clip / "camera" / CAMERA).glob("*.jpg"))
    return sorted({int(stem) for stem in (p.name.split(".")[0] for p in paths) if stem.isdigit()})


def _read_anno(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        anno = json.load(f)
    if not isinstance(anno, dict):
        raise ValueError("not a JSON object")
    for key in ("x", "y", "theta", "speed", "acceleration", "command_near"):
        if key not in anno:
            raise ValueError(f"no {key!r}")
    values = [anno["x"], anno["y"], anno["theta"], anno["speed"], *anno["acceleration"][:2]]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise ValueError(f"non-finite or non-numeric ego state {values}")
    command_from_road_option(str(anno["command_near"]))
    return anno


def convert_clip(clip: Path, name: str, out: Path, frame_rate_hz: float = FRAME_RATE_HZ,
                 on_frame: Callable[[], None] = lambda: None) -> tuple[list[dict], ClipReport]:
    """One clip's planning samples (images copied under ``out``) and its report."""
    report = ClipReport(name)
    step = int(round(WAYPOINT_DT_S * frame_rate_hz))
    if step < 1 or abs(step - WAYPOINT_DT_S * frame_rate_hz) > 1e-6:
        raise ValueError(f"frame_rate_hz {frame_rate_hz}: 0.5 s must be a whole number of frames")
    ids = _frame_ids(clip)
    annos: dict[int, dict[str, Any]] = {}
    images: dict[int, Path] = {}
    for i in ids:
        report.frames += 1
        anno_path = clip / "anno" / f"{i:05d}.json.gz"
        image_path = clip / "camera" / CAMERA / f"{i:05d}.jpg"
        try:
            annos[i] = _read_anno(anno_path)
            report.actors += sum(1 for b in annos[i].get("bounding_boxes", []) if b.get("class") != "ego_vehicle")
        except FileNotFoundError:
            report.problem(i, anno_path, "missing")
        except (OSError, EOFError, ValueError, TypeError, KeyError, IndexError) as exc:
            report.problem(i, anno_path, f"unreadable: {exc}")
        if not image_path.is_file():
            report.problem(i, image_path, "missing")
        elif image_path.read_bytes()[:2] != b"\xff\xd8":
            report.problem(i, image_path, "not a JPEG")
        else:
            images[i] = image_path
    samples = []
    for i in ids:
        on_frame()
        future = [i + step * (k + 1) for k in range(NUM_WAYPOINTS)]
        if i not in annos or i not in images or not all(f in annos for f in future):
            continue
        x, y, yaw = pose_from_anno(annos[i])
        points = np.array([pose_from_anno(annos[f])[:2] for f in future])           # [8, 2] world
        waypoints = world_to_ego(points, (x, y), yaw)                                # [8, 2] ego frame
        command = command_from_road_option(str(annos[i]["command_near"]))
        acceleration = ego_acceleration(annos[i], yaw)
        rel = f"images/{name}/{i:05d}.jpg"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(images[i], out / rel)
        samples.append(planning_sample(f"b2d-{name}-f{i:05d}-plan", DATASOURCE, rel, command,
                                       (float(annos[i]["speed"]), 0.0), acceleration, waypoints))
    report.samples = len(samples)
    return samples, report


def convert(src: str | Path, out: str | Path, *, frame_rate_hz: float = FRAME_RATE_HZ, resume: bool = False,
            overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Convert every clip under ``src`` into ``out``; returns the report (also ``out/report.json``)."""
    from tqdm import tqdm

    from ..utils.atomic import atomic_write_json, atomic_write_text

    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise ValueError(f"{src}: no such folder")
    clips = find_clips(src)
    if not clips:
        raise ValueError(f"{src}: no Bench2Drive clip (a folder with anno/*.json.gz) in it")
    if out.exists() and not resume:
        if not overwrite:
            raise ValueError(f"{out} already exists (--resume continues it, --overwrite replaces it)")
        shutil.rmtree(out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    report_path = out / "report.json"
    previous = json.loads(report_path.read_text()) if resume and report_path.exists() else {"clips": {}}
    reports: dict[str, Any] = dict(previous.get("clips", {}))
    names = {clip: "-".join(clip.relative_to(src).parts) if clip != src else clip.name for clip in clips}
    todo = [c for c in clips if not (out / "parts" / f"{names[c]}.jsonl").exists()]
    total = sum(len(_frame_ids(c)) for c in todo)
    with tqdm(total=total, desc="convert-data bench2drive", unit="frame", disable=not progress,
              dynamic_ncols=True) as bar:
        for clip in todo:
            samples, report = convert_clip(clip, names[clip], out, frame_rate_hz, on_frame=lambda: bar.update(1))
            # the part file last: its presence marks the clip as done for --resume
            atomic_write_text(out / "parts" / f"{names[clip]}.jsonl",
                              "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
            reports[names[clip]] = asdict(report)
            atomic_write_json(report_path, {"src": str(src), "clips": reports})
    all_samples = [json.loads(line) for clip in clips
                   for line in (out / "parts" / f"{names[clip]}.jsonl").read_text().splitlines() if line.strip()]
    dump_json_list(out / "samples.json", all_samples)
    summary = {"src": str(src), "clips": reports, "samples": len(all_samples),
               "frames": sum(r["frames"] for r in reports.values()),
               "problems": sum(len(r["problems"]) for r in reports.values()),
               "skipped_clips_done_before": len(clips) - len(todo)}
    atomic_write_json(report_path, summary)
    return summary
