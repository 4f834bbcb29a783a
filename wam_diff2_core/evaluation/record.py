"""``eval-bag --record``: evaluated predictions written into a new rosbag2 bag, atomically (its topics:
"Output folder" in this folder's README.md), each frame stamped with its image stamp and logged when the
input bag recorded the image, so it plays back in step with the inputs.

    record_predictions("preds_bag", run.bags[0].frames, trajectory, storage="mcap")
"""
from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..frame_inputs import NS_PER_S
from ..geometry import ego_to_world, path_headings
from ..profiling import StageTimes
from ..speed_profile import waypoint_states
from . import bag_messages as msg
from .bag_plan import DECODE_STATS_KEYS
from .bag_types import default_typestore
from .bag_writer import write_bag
from .bags import BagError
from .ground_truth import WAYPOINT_OFFSETS_NS
from .metrics import FrameResult

DEFAULT_PREFIX = "/wam_diff2"
TRAJECTORY_TYPE = "wam_diff2_ros/msg/Trajectory"
PATH_TYPE = "nav_msgs/msg/Path"


def trajectory_message(types, frame: FrameResult, ego_frame: str):
    """A ``Trajectory`` message (rosbags class) for one evaluated frame."""
    points = []
    if frame.valid and frame.predicted is not None:
        headings, speeds = waypoint_states(frame.predicted)
        for dt_ns, (x, y), heading, speed in zip(WAYPOINT_OFFSETS_NS, frame.predicted, headings, speeds):
            duration = types["builtin_interfaces/msg/Duration"](sec=int(dt_ns // NS_PER_S), nanosec=int(dt_ns % NS_PER_S))
            points.append(types["wam_diff2_ros/msg/TrajectoryPoint"](time_from_start=duration, x=float(x), y=float(y),
                                                                     heading=float(heading), speed=float(speed)))
    stages = {k: (v if isinstance(v, str) else float(v))       # zeros when the frame has none
              for k, v in dataclasses.asdict(StageTimes.from_dict(frame.stages or {})).items()}
    stats = types["wam_diff2_ros/msg/DecodeStats"](
        **{k: (float if k.endswith("_ms") else int)(frame.stats.get(k, 0)) for k in DECODE_STATS_KEYS},
        latency_ms=float(frame.latency_ms),
        stages=types["wam_diff2_ros/msg/StageTimes"](header=msg.header(types, frame.stamp_ns, ""), **stages))
    return types[TRAJECTORY_TYPE](header=msg.header(types, frame.stamp_ns, ego_frame), points=points,
                                  command=frame.command, valid=bool(frame.valid),
                                  invalid_reason=frame.invalid_reason, raw_text=frame.raw_text, stats=stats,
                                  candidates=1, valid_candidates=int(bool(frame.valid)), selected_candidate=0,
                                  pdms=math.nan)     # eval-bag decodes one candidate: no selection


def path_message(types, t0_ns: int, points_xy: np.ndarray, frame_id: str, start_yaw: float = 0.0,
                 origin_xy=(0.0, 0.0)):
    """``nav_msgs/Path`` of the plan's 8 points, stamped t0 + 0.5 ... 4.0 s, oriented along the path."""
    pts = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
    headings = path_headings(pts - np.asarray(origin_xy), start_yaw)   # direction from the previous point
    return msg.path(types, msg.header(types, t0_ns, frame_id),
                    [(t0_ns + dt_ns, x, y, yaw) for dt_ns, (x, y), yaw in zip(WAYPOINT_OFFSETS_NS, pts, headings)])


def record_predictions(out_path: str | Path, frames: list[FrameResult], trajectory=None, *, odometry_frame: str = "",
                       storage: str = "mcap", ego_frame: str = "base_link", prefix: str = DEFAULT_PREFIX,
                       overwrite: bool = False) -> Path:
    """Write ``frames`` (one bag's evaluated frames) as a new bag at ``out_path``, atomically.

    ``trajectory``: the bag's :class:`EgoTrajectory`, for the odometry-frame path (skipped when None).
    """
    out = Path(out_path)
    if out.exists() and not overwrite:
        raise BagError(f"--record: {out} already exists")
    store = default_typestore()
    types = store.types
    topics = {f"{prefix}/trajectory": TRAJECTORY_TYPE, f"{prefix}/path": PATH_TYPE,
              f"{prefix}/ground_truth/path": PATH_TYPE}
    if trajectory is not None:
        topics[f"{prefix}/path_odom"] = PATH_TYPE

    def messages() -> Iterator[tuple[str, int, Any]]:
        for f in sorted(frames, key=lambda f: (f.bag_time_ns, f.stamp_ns)):
            yield f"{prefix}/trajectory", f.bag_time_ns, trajectory_message(types, f, ego_frame)
            if f.valid and f.predicted is not None:
                yield f"{prefix}/path", f.bag_time_ns, path_message(types, f.stamp_ns, f.predicted, ego_frame)
                if trajectory is not None:
                    xy, yaw = trajectory.pose_at(f.stamp_ns)
                    world = ego_to_world(f.predicted, xy, yaw)
                    yield (f"{prefix}/path_odom", f.bag_time_ns,
                           path_message(types, f.stamp_ns, world, odometry_frame or "odom", yaw, xy))
            yield (f"{prefix}/ground_truth/path", f.bag_time_ns,
                   path_message(types, f.stamp_ns, f.ground_truth, ego_frame))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        write_bag(tmp / out.name, topics, messages(), storage=storage, typestore=store)
        if out.exists():
            shutil.rmtree(out)
        (tmp / out.name).rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
