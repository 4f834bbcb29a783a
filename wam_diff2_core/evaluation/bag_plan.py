"""A bag evaluation's pass 1 and its records: index a bag, pick the frames, and hold what is scored.

Pass 1 (cheap, no pixels decoded) reads the odometry, route, command and image headers and
decides for every camera frame whether it is evaluated, and if not why (every-N-th thinning,
bad stamps, missing inputs, no 4 s of recorded future): a :class:`BagPlan` of
:class:`PlannedFrame`. Pass 2 runs the policy on them (runner.py) or reads what a planner node
published for them (predictions.py); :func:`with_scores` scores either against the recording.

    plan = plan_bag(bag, EvalSettings(topics=BagTopics.carla("ego_vehicle")))
"""
from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..geometry import TIME_RESET_S
from ..images import ImageError, ImageLimits
from ..frame_inputs import FrameInputs, FrameInputTracker, InputSettings, InputSkip, check_image_msg, stamp_ns
from ..profiling import StageTimes
from ..speed_profile import ProfileLimits, measured_speed
from .bag_pdm import DEFAULT_LANE_WIDTH_M, BagPdmInputs, bag_pdm_inputs, check_lane_width
from .bags import Bag, BagError, BagTopics, Undecodable
from .collision import EgoFootprint, collision_flags, counted, obstacles_along
from .derived_objects import ObjectTrack, objects_from_msg
from .ground_truth import MAX_GAP_S, EgoTrajectory, NoFuture, constant_velocity_waypoints
from .metrics import FrameResult, pdm_entry, profile_speed_errors

log = logging.getLogger(__name__)

# frame skip codes of the runner (besides InputSkip / NoFuture / ImageError codes)
UNDECODABLE = "undecodable_message"
ZERO_STAMP = "zero_stamp"
DUPLICATE_STAMP = "duplicate_stamp"
TIME_BACKWARDS = "time_backwards"

TOPIC_TYPES = {"image": ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"),
               "odometry": ("nav_msgs/msg/Odometry",), "route": ("nav_msgs/msg/Path",),
               "command": ("std_msgs/msg/String",), "camera info": ("sensor_msgs/msg/CameraInfo",),
               "objects": ("derived_object_msgs/msg/ObjectArray",)}     # topic role -> the types it may have
PREDICTION_COUNTS = ("messages", "matched", "unscored_frame", "unmatched_stamp", "duplicate", "undecodable",
                     "command_differs")   # --predictions: the recorded outputs' counts
STAGE_FIELDS = tuple(f.name for f in dataclasses.fields(StageTimes))
DECODE_STATS_KEYS = ("block_size", "forwards", "denoise_steps", "blocks", "tokens", "prefill_ms", "denoise_ms",
                     "commit_ms", "retries")


@dataclass(frozen=True)
class EvalSettings:
    # in the order metrics.json's "settings" lists them (as_dict)
    topics: BagTopics = field(default_factory=BagTopics.carla)
    every: int = 1                      # evaluate every N-th camera frame (after dropping bad stamps)
    max_frames: int | None = None       # per bag, after thinning; None = all
    max_gap_s: float = MAX_GAP_S        # longest odometry gap interpolated over for the ground truth
    max_backward_jump_s: float = TIME_RESET_S   # a stamp further back is a second run in one bag: an error
    image_limits: ImageLimits = field(default_factory=ImageLimits)   # larger frames: skipped as image_too_large
    footprint: EgoFootprint = field(default_factory=EgoFootprint)   # the ego box (collision check, PDM score)
    lane_width_m: float = DEFAULT_LANE_WIDTH_M   # the PDM score's drivable corridor around the route / drive
    profile_limits: ProfileLimits = field(default_factory=ProfileLimits)   # the speed profile's (node: trajectory.*)
    inputs: InputSettings = field(default_factory=InputSettings)
    required: frozenset[str] = frozenset()   # optional topic roles the user named, so they must be present

    def __post_init__(self):
        check_lane_width(self.lane_width_m)
        if self.every < 1:
            raise ValueError(f"every: must be >= 1, got {self.every}")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"max_frames: must be >= 1, got {self.max_frames}")

    def as_dict(self) -> dict[str, Any]:
        return {"ego_footprint" if k == "footprint" else k: v for k, v in dataclasses.asdict(self).items()
                if k != "required"}


@dataclass
class PlannedFrame:
    index: int
    stamp_ns: int
    bag_time_ns: int
    inputs: FrameInputs
    ground_truth: np.ndarray        # [8, 2]
    baseline: np.ndarray            # [8, 2]
    recorded_speeds: np.ndarray     # [8] recorded forward speed at +0.5 ... +4.0 s, m/s
    obstacles: list[np.ndarray | None] | None = None   # per waypoint: other agents' boxes [N, 4, 2], ego frame
    recorded_collisions: list[bool | None] | None = None
    pdm: BagPdmInputs | None = None                    # the PDM score's scene (objects near the stamp)

    def result(self, bag_name: str, **answer: Any) -> FrameResult:
        """This frame's :class:`FrameResult` with ``answer``'s fields (validity, waypoints, statistics, ...): the
        inputs and the recorded future are the evaluator's."""
        ins = self.inputs
        return FrameResult(**{"command": ins.command, "command_source": ins.command_source, **answer}, bag=bag_name,
                           index=self.index, stamp_ns=self.stamp_ns, bag_time_ns=self.bag_time_ns,
                           velocity=tuple(float(v) for v in ins.ego.velocity),
                           acceleration=tuple(float(v) for v in ins.ego.acceleration),
                           ground_truth=self.ground_truth, baseline=self.baseline)


@dataclass
class BagPlan:
    bag: dict[str, Any]                                          # Bag.info()
    images: int = 0                                              # camera messages in the bag
    not_selected: int = 0                                        # thinned out by --every / --max-frames
    skipped: Counter = field(default_factory=Counter)           # frame not evaluable: reason -> count
    excluded: Counter = field(default_factory=Counter)          # no 4 s recorded future: reason -> count
    input_messages_skipped: Counter = field(default_factory=Counter)   # "topic: reason" -> count
    command_sources: Counter = field(default_factory=Counter)
    camera: dict[str, Any] | None = None
    odometry_frame: str = ""
    trajectory: EgoTrajectory | None = None
    planned: list[PlannedFrame] = field(default_factory=list)
    image_stamps: set[int] = field(default_factory=set)         # every non-zero camera stamp (--predictions)
    objects_topic: str | None = None                            # other agents' boxes (collision rate)
    objects: ObjectTrack | None = None                          # ... as read from it

    def counts(self) -> dict[str, Any]:
        return {"images": self.images, "not_selected": self.not_selected,
                "skipped": dict(self.skipped.most_common()), "excluded_no_future": dict(self.excluded.most_common()),
                "planned": len(self.planned),
                "input_messages_skipped": dict(self.input_messages_skipped.most_common()),
                "command_sources": dict(self.command_sources.most_common()),
                "objects_topic": self.objects_topic}


@dataclass
class BagRun:
    plan: BagPlan
    frames: list[FrameResult] = field(default_factory=list)
    skipped_at_run: Counter = field(default_factory=Counter)    # planned frames that failed in pass 2
    predictions: dict[str, Any] | None = None                   # --predictions: the node bag, topic, counts

    def counts(self) -> dict[str, Any]:
        counts = self.plan.counts()
        skipped = Counter(self.plan.skipped) + self.skipped_at_run
        counts.update(skipped=dict(skipped.most_common()), evaluated=len(self.frames),
                      valid=sum(f.valid for f in self.frames))
        if self.predictions is not None:
            counts["predictions"] = dict(self.predictions["counts"])
        return counts


@dataclass
class EvalRun:
    settings: EvalSettings
    bags: list[BagRun]
    detection: dict[str, Any] | None = None      # --predictions: the recorded boxes' COCO AP (bag_detection)

    @property
    def frames(self) -> list[FrameResult]:
        return [f for b in self.bags for f in b.frames]

    def counts(self) -> dict[str, Any]:
        counts = [b.counts() for b in self.bags]

        def pooled(key: str) -> Counter:
            return sum((Counter(c.get(key, {})) for c in counts), Counter())
        total: dict[str, Any] = {k: sum(c[k] for c in counts)
                                 for k in ("images", "not_selected", "planned", "evaluated", "valid")}
        total.update({k: dict(pooled(k).most_common()) for k in ("skipped", "excluded_no_future")})
        if any("predictions" in c for c in counts):
            predictions = pooled("predictions")
            total["predictions"] = {k: predictions[k] for k in PREDICTION_COUNTS}
        return total


def _check_topics(bag: Bag, settings: EvalSettings) -> dict[str, str]:
    """role -> topic of the topics this bag provides; BagError for what is missing or mistyped."""
    t, used = settings.topics, {}
    for role, topic in ((k.replace("_", " "), v) for k, v in dataclasses.asdict(settings.topics).items()):
        if role in ("image", "odometry") or topic and (topic in bag.topic_types or role in settings.required):
            bag.require_topic(topic, TOPIC_TYPES[role], role)
            used[role] = topic
    for role in ("image", "odometry"):
        if bag.topic_counts.get(used[role], 0) == 0:
            raise BagError(f"{bag.path}: the {role} topic {used[role]!r} has no messages")
    if ("route" not in used and "command" not in used) and settings.inputs.default_command is None:
        raise BagError(f"{bag.path}: neither the route topic {t.route!r} nor the command topic {t.command!r} is in "
                       "the bag, so no frame has a command; name one (--route-topic / --command-topic) or give "
                       "--default-command")
    return used


def _backwards_error(bag: Bag, topic: str, t_ns: int, last_ns: int, n: int) -> BagError:
    return BagError(f"{bag.path}: time goes backwards on {topic!r} by {(last_ns - t_ns) / 1e9:.3f} s at message "
                    f"{n} (stamp {t_ns} ns after {last_ns} ns): the bag holds more than one run or the "
                    "simulator restarted; split it (e.g. `ros2 bag convert` with start/end times)")


def plan_bags(paths: Sequence[str | Path], settings: EvalSettings) -> list[BagPlan]:
    """Pass 1 of every bag, all before any decoding: a bag that cannot be used fails first."""
    plans = []
    for path in paths:
        with Bag(path) as bag:
            plans.append(plan_bag(bag, settings))
            log.info("%s: %d camera frames, %d to evaluate", path, plans[-1].images, len(plans[-1].planned))
    return plans


def plan_bag(bag: Bag, settings: EvalSettings) -> BagPlan:
    """Pass 1: which camera frames are evaluated, with their inputs and recorded future."""
    used = _check_topics(bag, settings)
    plan = BagPlan(bag=bag.info())
    jump_ns = int(settings.max_backward_jump_s * 1e9)

    # Odometry first, all of it: the ego state at a frame's stamp is interpolated from the samples
    # around it (as the node does once they have arrived), whatever order the topics were
    # interleaved in when recorded. The same samples are the recorded future.
    tracker = FrameInputTracker(settings.inputs, max_samples=2**62)
    odom_topic = used["odometry"]
    stamps, xy, yaw, speed = [], [], [], []
    last_ns = None
    for n, (_, _, msg) in enumerate(bag.messages([odom_topic]), start=1):
        if isinstance(msg, Undecodable):
            plan.input_messages_skipped[f"{odom_topic}: {UNDECODABLE}"] += 1
            continue
        t_ns = stamp_ns(msg.header.stamp)
        if last_ns is not None and last_ns - t_ns > jump_ns:
            raise _backwards_error(bag, odom_topic, t_ns, last_ns, n)
        try:
            sample = tracker.on_odometry(msg)
        except InputSkip as skip:
            plan.input_messages_skipped[f"{odom_topic}: {skip.code}"] += 1
            continue
        last_ns = t_ns
        plan.odometry_frame = str(msg.header.frame_id)
        stamps.append(t_ns)
        xy.append((sample.x, sample.y))
        yaw.append(sample.yaw)
        speed.append(sample.vx)
    if not stamps:
        raise BagError(f"{bag.path}: no usable odometry on {odom_topic!r} "
                       f"({dict(plan.input_messages_skipped) or 'no messages'})")
    plan.trajectory = trajectory = EgoTrajectory(stamps, np.array(xy), yaw, max_gap_s=settings.max_gap_s, speed=speed)
    objects = _read_objects(bag, used.get("objects"), plan) if "objects" in used else None
    if objects is not None:
        plan.objects_topic, plan.objects = used["objects"], objects

    # Then camera, route and command in recorded order: a frame gets the newest route/command
    # received before it, as a live node does.
    role_of = {topic: role for role, topic in used.items() if role not in ("odometry", "objects")}
    last_image_ns, accepted = None, 0
    for topic, bag_time_ns, msg in bag.messages(list(role_of)):
        role = role_of[topic]
        if role != "image":
            if isinstance(msg, Undecodable):
                plan.input_messages_skipped[f"{topic}: {UNDECODABLE}"] += 1
            elif role == "camera info":
                if plan.camera is None:
                    plan.camera = {"width": int(msg.width), "height": int(msg.height),
                                   "k": [float(v) for v in msg.k], "frame_id": str(msg.header.frame_id)}
            else:
                try:
                    tracker.on_route(msg) if role == "route" else tracker.on_command(msg)
                except InputSkip as skip:
                    plan.input_messages_skipped[f"{topic}: {skip.code}"] += 1
            continue

        index = plan.images
        plan.images += 1
        if isinstance(msg, Undecodable):
            plan.skipped[UNDECODABLE] += 1
            continue
        t_ns = stamp_ns(msg.header.stamp)
        if t_ns == 0:
            plan.skipped[ZERO_STAMP] += 1
            continue
        plan.image_stamps.add(t_ns)
        if last_image_ns is not None and t_ns <= last_image_ns:
            if last_image_ns - t_ns > jump_ns:
                raise _backwards_error(bag, topic, t_ns, last_image_ns, plan.images)
            plan.skipped[DUPLICATE_STAMP if t_ns == last_image_ns else TIME_BACKWARDS] += 1
            continue
        last_image_ns = t_ns
        accepted += 1
        if (accepted - 1) % settings.every or (settings.max_frames is not None
                                               and len(plan.planned) >= settings.max_frames):
            plan.not_selected += 1
            continue
        try:
            check_image_msg(msg, settings.image_limits)
            inputs = tracker.inputs_at(t_ns)
            ground_truth = trajectory.future_waypoints(t_ns)
            recorded_speeds = trajectory.future_speeds(t_ns)
        except (ImageError, InputSkip, NoFuture) as exc:     # skipped; no 4 s of recorded future: excluded
            (plan.excluded if isinstance(exc, NoFuture) else plan.skipped)[
                f"image_{exc.code}" if isinstance(exc, ImageError) else exc.code] += 1
            continue
        plan.command_sources[inputs.command_source] += 1
        planned = PlannedFrame(index, t_ns, bag_time_ns, inputs, ground_truth,
                               constant_velocity_waypoints(inputs.ego.velocity), recorded_speeds)
        if objects is not None:
            planned.obstacles = obstacles_along(objects, trajectory, t_ns)
            planned.recorded_collisions = collision_flags(ground_truth, planned.obstacles, settings.footprint)
            route = tracker.route_xy if tracker.route_frame in ("", plan.odometry_frame) else None
            planned.pdm = bag_pdm_inputs(objects, trajectory, route, t_ns, inputs.ego.velocity,
                                         inputs.ego.acceleration, ground_truth, settings.footprint,
                                         settings.lane_width_m)
        plan.planned.append(planned)
    return plan


def _read_objects(bag: Bag, topic: str, plan: BagPlan) -> ObjectTrack | None:
    """The objects topic as an :class:`ObjectTrack`; messages in another frame than the odometry's,
    undecodable ones and repeated stamps are counted in ``input_messages_skipped`` and left out."""
    snapshots, seen = [], set()
    for _, _, msg in bag.messages([topic]):
        if isinstance(msg, Undecodable):
            plan.input_messages_skipped[f"{topic}: {UNDECODABLE}"] += 1
            continue
        snapshot = objects_from_msg(msg)
        if plan.odometry_frame and snapshot.frame_id != plan.odometry_frame:
            plan.input_messages_skipped[f"{topic}: frame_not_{plan.odometry_frame}"] += 1
            continue
        if snapshot.stamp_ns in seen:
            plan.input_messages_skipped[f"{topic}: {DUPLICATE_STAMP}"] += 1
            continue
        if snapshot.unsupported:
            plan.input_messages_skipped[f"{topic}: objects_without_box_shape"] += snapshot.unsupported
        seen.add(snapshot.stamp_ns)
        snapshots.append(snapshot)
    return ObjectTrack(snapshots) if snapshots else None


def with_scores(result: FrameResult, planned: PlannedFrame, settings: EvalSettings) -> FrameResult:
    """``result`` with the speed errors of its plan's speed profile and of the constant-speed baseline,
    and the collision flags and PDM scores of its plan, of the baseline and (PDM) of the recorded drive
    (when the bag has objects; the PDM score where objects lie near the frame's stamp)."""
    # the speed the planner node starts its profile from, of the same odometry sample
    speed = measured_speed(planned.inputs.odometry.vx)
    result.recorded_speeds = planned.recorded_speeds
    result.baseline_speed_errors = np.abs(speed - planned.recorded_speeds)
    if result.predicted is not None:
        result.speed_errors = profile_speed_errors(result.predicted, speed, planned.recorded_speeds,
                                                   settings.profile_limits)
    if planned.obstacles is None:
        return result
    recorded, footprint = planned.recorded_collisions, settings.footprint
    result.recorded_collisions = recorded
    result.baseline_collisions = counted(collision_flags(planned.baseline, planned.obstacles, footprint), recorded)
    if result.predicted is not None:
        result.collisions = counted(collision_flags(result.predicted, planned.obstacles, footprint), recorded)
    if planned.pdm is not None:
        result.pdm_area = planned.pdm.area
        result.recorded_pdm = pdm_entry(planned.pdm.score(planned.ground_truth))
        result.baseline_pdm = pdm_entry(planned.pdm.score(planned.baseline))
        result.pdm = pdm_entry(None if result.predicted is None else planned.pdm.score(result.predicted))
    return result
