"""Export demo-world episodes: a training/evaluation set in the seed's JSON format, rosbag2 bags and
Bench2Drive clips, written atomically (the folder's layout: sim/README.md, "Exports"). Episodes are split by
episode, never by frame: the last ``round(episodes * val_fraction)`` (at least one of two or more) validate.

    from wam_diff2_core.sim.dataset_export import ExportSettings, export
    manifest = export("data/synth", ExportSettings(episodes=8, seed=0))
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import re
import sys
import time
import typing
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np

from ..data.bench2drive import FRAME_RATE_HZ as B2D_FRAME_RATE_HZ
from ..data.samples import dump_json_list, make_sample, planning_sample
from ..evaluation.bag_writer import STORAGES
from ..outputs.prompts import COMMANDS, NUM_WAYPOINTS, WAYPOINT_DT_S, format_detection_prompt
from ..topics import DEFAULT_COMMAND_TOPIC, DEFAULT_ROLE
from ..utils.atomic import atomic_directory
from .bench2drive_clips import B2DClipWriter
from .episode_bags import TOPIC_TYPES, EpisodeBagWriter, topic_names
from .episode import EpisodeSettings, simulate_episode
from .road import PUBLISHED_ROUTE_SPACING_M
from .truth import QUESTIONS, vqa_prompt

DEFAULT_FORMATS = ("json",) + STORAGES
FORMATS = DEFAULT_FORMATS + ("b2d",)       # b2d: each episode as a Bench2Drive clip (bench2drive_clips.py)
DATASOURCE = "WamDiff2Synth"
MANIFEST_FORMAT = "wam-diff2-synth/1"
CAMERA_KEYS = ("width", "height", "fx", "fy", "cx", "cy")     # a frame's and the manifest's camera, in this order


@dataclass(frozen=True)
class ExportSettings:
    episodes: int = 8
    seed: int = 0
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    formats: tuple[str, ...] = DEFAULT_FORMATS
    val_fraction: float = 0.25
    role: str = DEFAULT_ROLE
    command_topic: str = DEFAULT_COMMAND_TOPIC
    image_format: str = "jpg"               # jpg | png
    jpeg_quality: int = 95
    vqa_per_frame: int = 1                  # question samples per frame (0..4)
    prompt_acceleration: str = "estimated"  # estimated (as the node computes it from odometry) | true
    detection: bool = True                  # a detection sample per frame
    commands: tuple[str, ...] = COMMANDS    # JSON samples only of frames under these commands (bags: all)
    workers: int = 1

    def __post_init__(self):
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {list(self.formats)}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if "b2d" in self.formats:
            if abs(self.episode.frame_stride * self.episode.dt_s - 1.0 / B2D_FRAME_RATE_HZ) > 1e-9:
                raise ValueError(f"formats b2d: Bench2Drive clips are {B2D_FRAME_RATE_HZ:g} Hz; give frame_stride "
                                 f"{round(1.0 / (B2D_FRAME_RATE_HZ * self.episode.dt_s))} (--frame-stride), got "
                                 f"{self.episode.frame_stride}")
            if self.image_format != "jpg":
                raise ValueError("formats b2d: Bench2Drive's camera frames are JPEG; image_format must be jpg")
        if self.image_format not in ("jpg", "png"):
            raise ValueError(f"image_format must be jpg or png, got {self.image_format!r}")
        if not 0 <= self.vqa_per_frame <= len(QUESTIONS):
            raise ValueError(f"vqa_per_frame must be in [0, {len(QUESTIONS)}], got {self.vqa_per_frame}")
        if self.prompt_acceleration not in ("estimated", "true"):
            raise ValueError(f"prompt_acceleration must be 'estimated' or 'true', got {self.prompt_acceleration!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.commands or any(c not in COMMANDS for c in self.commands):
            raise ValueError(f"commands must be a non-empty subset of {COMMANDS}, got {list(self.commands)}")
        if not self.role or "/" in self.role:
            raise ValueError(f"role must be a non-empty name without '/', got {self.role!r}")
        if not self.command_topic.startswith("/"):
            raise ValueError(f"command_topic must be an absolute topic name, got {self.command_topic!r}")

    def prompt_acceleration_of(self, truth) -> tuple[float, float]:
        """The (forward, left) acceleration a frame's prompt gives (``prompt_acceleration``)."""
        return truth.acceleration_estimated if self.prompt_acceleration == "estimated" else truth.acceleration


def validation_episodes(episodes: int, fraction: float) -> list[int]:
    if episodes < 2 or fraction <= 0:
        return []
    count = min(episodes - 1, max(1, int(round(episodes * fraction))))
    return list(range(episodes - count, episodes))


@dataclass
class EpisodeResult:
    index: int
    split: str
    samples: list[dict]
    frames: list[dict]
    seconds: float
    bag_counts: dict[str, dict[str, int]]     # per bag (its path under the root): messages per topic


def sample_stem(seed: int, episode: int, frame: int) -> str:
    """The id prefix of a frame's samples (``-plan``, ``-detect``, ``-vqa-*`` follow)."""
    return f"synth{seed}-e{episode:04d}-f{frame:05d}"


PLANNING_SAMPLE_ID = re.compile(r"^synth(\d+)-e(\d{4,})-f(\d{5,})-plan$")   # seen from the ego (not -recovery)


def planning_sample_frame(sample_id: str) -> tuple[int, int, int] | None:
    """(seed, episode, frame) of a planning sample's id as :func:`frame_samples` writes it; None for any
    other id (another data set, a recovery copy seen from a displaced ego)."""
    match = PLANNING_SAMPLE_ID.match(sample_id)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def _from_dict(cls, data: dict, where: str):
    """``cls`` (a dataclass) from ``asdict``'s output: nested dataclasses and tuples restored, defaults
    for missing fields; ValueError naming a field the dataclass does not have."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} for {cls.__name__}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _from_dict(hint, value, f"{where}.{name}")
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return cls(**values)


def settings_from_manifest(manifest: dict) -> ExportSettings:
    """The :class:`ExportSettings` a data set was made with (its manifest's ``settings``), so its
    episodes can be simulated again exactly; ValueError when the manifest has none or an unknown field."""
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("settings"), dict):
        raise ValueError(f"not a {MANIFEST_FORMAT} manifest with settings")
    return _from_dict(ExportSettings, manifest["settings"], "manifest settings")


def encode_image(rgb: np.ndarray, settings: ExportSettings) -> bytes:
    """[H, W, 3] RGB as PNG or JPEG bytes (``settings.image_format``, ``jpeg_quality``)."""
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    if settings.image_format == "jpg":
        ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, settings.jpeg_quality])
    else:
        ok, data = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise RuntimeError("image encoding failed")
    return data.tobytes()


def frame_samples(truth, image_path: str, width: int, height: int, settings: ExportSettings) -> list[dict]:
    """The samples of one frame in the authors' format."""
    stem = sample_stem(settings.seed, truth.episode, truth.frame)

    def sample(task: str, prompt: str, answer: str) -> dict:
        return make_sample(f"{stem}-{task}", DATASOURCE, task, image_path, prompt, answer)

    out = [planning_sample(f"{stem}-plan", DATASOURCE, image_path, truth.command, truth.velocity,
                           settings.prompt_acceleration_of(truth), truth.waypoints)]
    if settings.detection:
        out.append(sample("detect", format_detection_prompt(), json.dumps(truth.qwen_boxes(width, height))))
    if settings.vqa_per_frame:
        rng = np.random.default_rng([settings.seed, truth.episode, truth.frame, 1])
        keys = list(QUESTIONS)
        for key in (keys[i] for i in sorted(rng.choice(len(keys), settings.vqa_per_frame, replace=False))):
            out.append(sample(f"vqa-{key}", vqa_prompt(key, truth.command), truth.qa[key]))
    return out


def _recovery_sample(root: Path, episode, truth, settings: ExportSettings) -> dict:
    """The frame's planning sample seen from the displaced ego (training split only)."""
    recovery = episode.recoveries[truth.frame]
    image_path = f"images/e{truth.episode:04d}/{truth.frame:05d}r.{settings.image_format}"
    (root / image_path).write_bytes(encode_image(episode.render_recovery(truth.frame).rgb, settings))
    motion = {}
    if recovery.speed_changed:
        motion = dict(velocity=(recovery.speed, 0.0), acceleration=(0.0, 0.0), acceleration_estimated=(0.0, 0.0))
    sample = frame_samples(replace(truth, waypoints=recovery.waypoints, **motion), image_path, 0, 0,
                           replace(settings, detection=False, vqa_per_frame=0))[0]
    sample["id"] += "-recovery"
    sample["recovery"] = {"offset_m": round(recovery.offset_m, 3), "yaw_deg": round(recovery.yaw_deg, 2),
                          "speed_mps": round(recovery.speed, 3), "speed_changed": recovery.speed_changed}
    return sample


def export_episode(root: Path, index: int, split: str, settings: ExportSettings,
                   on_frame: Callable[[], None] | None = None) -> EpisodeResult:
    """Simulate one episode and write its images, bags and records under ``root``."""
    start = time.perf_counter()
    cv2.setNumThreads(1)   # parallelism comes from episodes, not from OpenCV's pool
    es = settings.episode
    episode = simulate_episode(settings.seed, index, es)
    camera, track = episode.renderer.camera, episode.track
    ep_dir = f"e{index:04d}"
    if "json" in settings.formats:
        (root / "images" / ep_dir).mkdir(parents=True, exist_ok=True)
    clip = B2DClipWriter(root / "b2d" / f"WamDiff2Synth_seed{settings.seed}_e{index:04d}", episode, settings) \
        if "b2d" in settings.formats else None
    samples, records = [], []
    tick_ns, start_ns = int(round(es.dt_s * 1e9)), int(round(es.start_time_s * 1e9))
    frame_ticks, frames = {es.frame_tick(i) for i in range(es.frames)}, episode.frames()
    with ExitStack() as stack:
        writers = [stack.enter_context(EpisodeBagWriter(root / "bags" / storage / ep_dir, storage, role=settings.role,
                                                        camera=camera, mount=es.camera.mount,
                                                        command_topic=settings.command_topic))
                   for storage in STORAGES if storage in settings.formats]
        for w in writers:
            w.write_route(start_ns, episode.road.lane.resampled(PUBLISHED_ROUTE_SPACING_M))
        for tick in range(es.total_ticks):
            stamp_ns = start_ns + tick * tick_ns
            for w in writers:
                w.write_tick(stamp_ns, track.pose(tick), float(track.speed[tick]), float(track.yaw_rate[tick]))
                w.write_objects(stamp_ns, episode.traffic[tick])
            if tick not in frame_ticks:
                continue
            frame = next(frames)
            truth = frame.truth
            for w in writers:
                w.write_frame(stamp_ns, frame.rgb, truth.command)
            image_path = f"images/{ep_dir}/{truth.frame:05d}.{settings.image_format}"
            sampled = "json" in settings.formats and truth.command in settings.commands
            record = truth.record(camera.width, camera.height)
            record.update(split=split, stamp_ns=stamp_ns, image=image_path if sampled else None,
                          camera={k: getattr(camera, k) for k in CAMERA_KEYS})
            records.append(record)
            encoded = encode_image(frame.rgb, settings) if sampled or clip is not None else None
            if clip is not None:
                clip.write_frame(truth, encoded)
            if sampled:
                (root / image_path).write_bytes(encoded)
                samples.extend(frame_samples(truth, image_path, camera.width, camera.height, settings))
                if split == "train" and truth.frame in episode.recoveries:
                    samples.append(_recovery_sample(root, episode, truth, settings))
            if on_frame is not None:
                on_frame()
    return EpisodeResult(index, split, samples, records, time.perf_counter() - start,
                         {str(w.path.relative_to(root)): dict(w.counts) for w in writers})


def export(out_dir: str | Path, settings: ExportSettings, *, overwrite: bool = False, progress: bool = True,
           command_line: list[str] | None = None) -> dict:
    """Generate ``settings.episodes`` episodes into ``out_dir``; returns the manifest."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    started = time.perf_counter()
    val = set(validation_episodes(settings.episodes, settings.val_fraction))
    splits = {i: ("val" if i in val else "train") for i in range(settings.episodes)}
    es = settings.episode
    total_frames = settings.episodes * es.frames
    results: list[EpisodeResult] = []
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        with tqdm(total=total_frames, unit="frame", desc="synth", disable=not progress, dynamic_ncols=True) as bar:
            if settings.workers == 1:
                for i in range(settings.episodes):
                    results.append(export_episode(tmp, i, splits[i], settings, on_frame=lambda: bar.update(1)))
            else:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                job = functools.partial(export_episode, tmp, settings=settings)      # (index, split) -> result
                context = multiprocessing.get_context("spawn")   # no fork of a process that may hold torch threads
                with ProcessPoolExecutor(settings.workers, mp_context=context) as pool:
                    try:
                        for result in pool.map(job, splits, splits.values()):
                            results.append(result)
                            bar.update(es.frames)
                    except BaseException:
                        pool.shutdown(wait=True, cancel_futures=True)
                        raise
        results.sort(key=lambda r: r.index)
        counts = {"frames": total_frames, "episodes": settings.episodes}
        if "json" in settings.formats:
            for split in ("train", "val"):
                samples = [s for r in results if r.split == split for s in r.samples]
                dump_json_list(tmp / f"{split}.json", samples)
                counts[f"{split}_samples"] = len(samples)
                counts[f"{split}_frames"] = sum(len(r.frames) for r in results if r.split == split)
            counts["samples_by_task"] = dict(Counter(s["task"] for r in results for s in r.samples))
        (tmp / "frames.jsonl").write_text("".join(json.dumps(record) + "\n" for r in results for record in r.frames))
        camera = es.camera.camera()
        manifest = {
            "format": MANIFEST_FORMAT,
            "complete": True,
            "command": command_line,
            "seed": settings.seed,
            "episodes": settings.episodes,
            "frames_per_episode": es.frames,
            "splits": {"train": [i for i in splits if splits[i] == "train"], "val": sorted(val)},
            "formats": list(settings.formats),
            "counts": counts,
            "camera": {**{k: getattr(camera, k) for k in CAMERA_KEYS},
                       "horizontal_fov_deg": es.camera.horizontal_fov_deg, "mount": asdict(es.camera.mount),
                       "ego_frame": "rear axle, x forward, y left, z up"},
            "timing": {"dt_s": es.dt_s, "frame_stride": es.frame_stride, "warmup_ticks": es.warmup_ticks,
                       "start_time_s": es.start_time_s, "waypoint_interval_s": WAYPOINT_DT_S, "num_waypoints": NUM_WAYPOINTS},
            "prompt_acceleration": settings.prompt_acceleration,
            "bags": {r.index: r.bag_counts for r in results} if any(r.bag_counts for r in results) else {},
            "topics": {key: {"name": name, "type": TOPIC_TYPES[key]} for key, name in topic_names(settings.role, settings.command_topic).items()},
            "settings": asdict(settings),
            "wall_time_s": round(time.perf_counter() - started, 3),
            "episode_seconds": [round(r.seconds, 3) for r in results],
            "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest
