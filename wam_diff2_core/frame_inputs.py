"""Frame inputs: what the policy is given for one camera frame, derived from ROS messages.

The one derivation for the live planner node (``wam_diff2_ros/planner/node.py``) and the offline bag
evaluator (:mod:`wam_diff2_core.evaluation.runner`), so offline numbers are the node's numbers. ROS-free:
messages are read by attribute, which live ROS 2 messages and rosbags messages share.

- **Ego state**: the odometry history at the image stamp (:meth:`~wam_diff2_core.geometry.EgoHistory.at`);
  velocity is the twist (ego frame), acceleration is differentiated from successive twists
  (:class:`~wam_diff2_core.geometry.AccelerationEstimator`) as they arrive.
- **Command**: the newest command message (``left|straight|right`` or a CARLA RoadOption; ``""``, ``auto``
  or ``route`` hand control back to the route), else the newest route ahead of the ego
  (:func:`~wam_diff2_core.geometry.command_from_route`), else ``default_command`` (None: the frame is skipped).
- **Image**: any ``sensor_msgs/Image`` encoding of :mod:`wam_diff2_core.images` or a ``CompressedImage``.

    tracker = FrameInputTracker(InputSettings())
    tracker.on_odometry(odom_msg); tracker.on_route(path_msg)
    inputs = tracker.inputs_at(stamp_ns(image_msg.header.stamp))   # or raises InputSkip(code, why)
    policy.step(image_msg_to_rgb(image_msg), inputs.ego, inputs.command)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .geometry import (TIME_RESET_S, AccelerationEstimator, EgoHistory, EgoMotion, EgoSample, RouteCommandSettings,
                       command_from_road_option, command_from_route, yaw_from_quaternion)
from .images import DEFAULT_LIMITS, ImageError, ImageLimits, check_raw_image, compressed_to_rgb, image_to_rgb
from .outputs.prompts import COMMANDS
from .routes import route_from_path_msg

NS_PER_S = 1_000_000_000

# Skip reasons (InputSkip.code); the evaluator and the node count skipped frames and messages by these.
# Frames (inputs_at): the frame is not planned.
NO_ODOMETRY = "no_odometry"                  # no odometry received yet
STALE_ODOMETRY = "stale_odometry"            # no odometry within odometry_timeout_s of the image stamp
# ... these three only without a default command; with one they are FrameInputs.default_because
NO_COMMAND = "no_command"                    # no command and no route
OFF_ROUTE = "off_route"                      # the ego is farther than route.max_distance_m from the route
ROUTE_FRAME_MISMATCH = "route_frame_mismatch"  # route and odometry frames differ (no tf here)
# Messages (on_odometry / on_route / on_command): the message is ignored, the previous input kept.
BAD_ODOMETRY = "bad_odometry"                # NaN/inf pose or twist, zero quaternion
ODOMETRY_OUT_OF_ORDER = "odometry_out_of_order"  # stamp not after the newest sample (by up to TIME_RESET_S)
BAD_COMMAND = "bad_command"                  # a command string that names no command
BAD_ROUTE = "bad_route"                      # NaN/inf route points


class InputSkip(Exception):
    """An input that cannot be used (or a frame that cannot be planned); ``code`` says why."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def stamp_ns(stamp) -> int:
    """``builtin_interfaces/Time`` -> integer nanoseconds."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def is_compressed(msg) -> bool:
    return hasattr(msg, "format") and not hasattr(msg, "encoding")


def check_image_msg(msg, limits: ImageLimits = DEFAULT_LIMITS) -> None:
    """Cheap header checks of a raw ``sensor_msgs/Image`` (ImageError), its size against ``limits``
    included; compressed: non-empty (its size is checked from its header when it is decoded)."""
    if is_compressed(msg):
        if len(msg.data) == 0:
            raise ImageError("empty", "no compressed bytes")
        return
    check_raw_image(len(msg.data), int(msg.height), int(msg.width), str(msg.encoding), int(msg.step), limits)


def image_msg_to_rgb(msg, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """``sensor_msgs/Image`` or ``CompressedImage`` -> [H, W, 3] uint8 RGB (ImageError when it cannot,
    ``too_large`` for a frame over ``limits``, refused before it is decoded)."""
    if is_compressed(msg):
        return compressed_to_rgb(msg.data, limits)
    return image_to_rgb(msg.data, int(msg.height), int(msg.width), str(msg.encoding), int(msg.step), limits)


@dataclass(frozen=True)
class InputSettings:
    """The planner node's input parameters (same names, same defaults as ``config/planner.yaml``)."""

    odometry_timeout_s: float = 0.5             # no odometry within this of the image stamp: skip
    acceleration_time_constant_s: float = 0.5   # low-pass on differentiated velocity (0 = unfiltered)
    default_command: str | None = "straight"    # no command and no usable route; None = skip the frame
    route: RouteCommandSettings = field(default_factory=RouteCommandSettings)

    def __post_init__(self):
        if self.default_command is not None and self.default_command not in COMMANDS:
            raise ValueError(f"default_command: {self.default_command!r} is not one of {', '.join(COMMANDS)}")
        if not self.odometry_timeout_s > 0:
            raise ValueError(f"odometry_timeout_s: must be > 0, got {self.odometry_timeout_s!r}")
        if not self.acceleration_time_constant_s >= 0:
            raise ValueError(f"acceleration_time_constant_s: must be >= 0, got {self.acceleration_time_constant_s!r}")


@dataclass(frozen=True)
class FrameInputs:
    stamp_ns: int                 # the image stamp
    ego: EgoMotion                # what the prompt gets (ego frame)
    command: str                  # left | straight | right
    command_source: str           # "command" | "route" | "default"
    odometry: EgoSample           # the ego state at the stamp (pose in the odometry frame)
    default_because: tuple[str, str] | None = None   # (code, message): why the route gave no command


# command strings that clear an earlier command, so the route decides again (the node's convention)
ROUTE_COMMANDS = ("", "auto", "route")


class FrameInputTracker:
    """Stores the newest inputs and answers "what does the policy get for an image at stamp t"; odometry is
    kept in stamp order (:meth:`on_odometry`), at most ``max_samples``. Not thread-safe: hold one lock around it."""

    def __init__(self, settings: InputSettings | None = None, max_samples: int = 400):
        self.settings = settings or InputSettings()
        self.max_samples = max_samples
        self.time_resets = 0          # odometry that jumped back over TIME_RESET_S (replay / simulator restarts)
        self.reset()

    def reset(self) -> None:
        self.history = EgoHistory(self.max_samples)
        self._estimator = AccelerationEstimator(self.settings.acceleration_time_constant_s)
        self.newest_odometry_ns: int | None = None
        self.odometry_frame = ""      # header.frame_id of the newest odometry: the pose's frame
        self.child_frame = ""         # its child_frame_id: the ego frame
        self.route_xy: np.ndarray | None = None
        self.route_frame = ""
        self.command: str | None = None
        self.command_text = ""        # the command message as received ("" = none yet)

    def update_settings(self, settings: InputSettings) -> None:
        """Use ``settings`` from the next message / frame on; the history, route and command stay."""
        self.settings = settings
        self._estimator.time_constant_s = settings.acceleration_time_constant_s

    def on_odometry(self, msg) -> EgoSample:
        """Add one odometry sample (InputSkip when it is unusable or out of order).

        A stamp at or before the newest is refused (ODOMETRY_OUT_OF_ORDER) unless more than ``TIME_RESET_S`` back,
        when history and estimate start over: a late sample adds nothing and would differentiate across the wrong
        pair (the ego state would jump); a large jump back is a new run (a replay or simulator restarted), and
        refusing it would leave the node without plans for as long as the first run lasted."""
        t_ns = stamp_ns(msg.header.stamp)
        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        lin, ang = msg.twist.twist.linear, msg.twist.twist.angular
        values = [float(v) for v in (p.x, p.y, q.x, q.y, q.z, q.w, lin.x, lin.y, ang.z)]
        if not all(math.isfinite(v) for v in values):
            raise InputSkip(BAD_ODOMETRY, f"non-finite pose or twist at stamp {t_ns} ns")
        x, y, qx, qy, qz, qw, vx, vy, yaw_rate = values
        if qx == qy == qz == qw == 0.0:
            raise InputSkip(BAD_ODOMETRY, f"zero quaternion at stamp {t_ns} ns")
        yaw = yaw_from_quaternion(qx, qy, qz, qw)
        newest = self.newest_odometry_ns
        if newest is not None and t_ns <= newest:
            if newest - t_ns <= TIME_RESET_S * NS_PER_S:
                kind = "repeats" if t_ns == newest else "is older than"
                raise InputSkip(ODOMETRY_OUT_OF_ORDER, f"stamp {t_ns} ns {kind} the newest odometry ({newest} ns)")
            self.history.clear()
            self._estimator.reset()
            self.time_resets += 1
        t_s = t_ns / NS_PER_S          # one conversion for samples and image stamps: interpolation weights agree
        ax, ay = self._estimator.update(t_s, vx, vy, yaw_rate)
        sample = EgoSample(t_s, x, y, yaw, vx, vy, ax, ay)
        self.history.add(sample)
        self.newest_odometry_ns = t_ns
        self.odometry_frame = str(msg.header.frame_id)
        self.child_frame = str(getattr(msg, "child_frame_id", ""))
        return sample

    def on_route(self, msg) -> np.ndarray:
        points = route_from_path_msg(msg)
        if not np.isfinite(points).all():
            raise InputSkip(BAD_ROUTE, f"route with non-finite points ({int((~np.isfinite(points)).any(1).sum())} "
                                       f"of {len(points)}); keeping the previous route")
        self.route_xy, self.route_frame = points, str(msg.header.frame_id)
        return points

    def on_command(self, msg_or_text) -> str | None:
        """Store a command (None: back to the route); InputSkip when the text names none."""
        text = str(getattr(msg_or_text, "data", msg_or_text)).strip()
        if text.lower() in ROUTE_COMMANDS:
            self.command, self.command_text = None, text
            return None
        try:
            command = command_from_road_option(text)
        except ValueError as exc:
            raise InputSkip(BAD_COMMAND, f"{exc}; keeping the previous command") from None
        self.command, self.command_text = command, text
        return command

    def odometry_at(self, t_ns: int) -> EgoSample:
        """The ego state at ``t_ns`` (InputSkip when no odometry is within ``odometry_timeout_s``)."""
        if len(self.history) == 0:
            raise InputSkip(NO_ODOMETRY, "no odometry received yet")
        sample = self.history.at(t_ns / NS_PER_S, self.settings.odometry_timeout_s)
        if sample is None:
            raise InputSkip(STALE_ODOMETRY, f"no odometry within odometry_timeout_s "
                                            f"{self.settings.odometry_timeout_s} of the image stamp {t_ns} ns")
        return sample

    def command_for(self, sample: EgoSample) -> tuple[str, str, tuple[str, str] | None]:
        """(command, source, why the default): the command topic, else the route, else the default, else InputSkip."""
        if self.command is not None:
            return self.command, "command", None
        reason = (NO_COMMAND, "no command received and no route")
        if self.route_xy is not None:
            if self.route_frame and self.odometry_frame and self.route_frame != self.odometry_frame:
                reason = (ROUTE_FRAME_MISMATCH, f"route frame {self.route_frame!r} is not the odometry frame "
                                                f"{self.odometry_frame!r}")
            else:
                command = command_from_route(self.route_xy, (sample.x, sample.y), sample.yaw, self.settings.route)
                if command is not None:
                    return command, "route", None
                reason = (OFF_ROUTE, f"the ego is more than {self.settings.route.max_distance_m} m from the route")
        if self.settings.default_command is not None:
            return self.settings.default_command, "default", reason
        raise InputSkip(*reason)

    def inputs_at(self, t_ns: int) -> FrameInputs:
        sample = self.odometry_at(t_ns)
        command, source, default_because = self.command_for(sample)
        return FrameInputs(stamp_ns=t_ns, ego=sample.motion(), command=command, command_source=source, odometry=sample,
                           default_because=default_because)
