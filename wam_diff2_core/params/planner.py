"""The planner node's parameters: one table of specs, from which everything else is derived (descriptors,
validation on set, ``config/planner.yaml``, the README's table, the evaluator's node-parameter names). The
``decoding.*`` and other shared settings derive from the core's settings dataclasses, so their defaults, ranges
and help exist in one place; when each is applied (``live``, ``configure``, ``start``): :class:`.spec.ParamSpec`.
"""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Mapping

from ..candidate_selection import CandidateSettings
from ..config import (DECODING_FIELDS, DEFAULT_PARSE_RETRY, DTYPE_NAMES, PARSE_RETRIES, ConfigError, DecodingSettings,
                      EngineSettings)
from ..frame_inputs import InputSettings
from ..geometry import COMMANDS, RouteCommandSettings
from ..images import ImageLimits
from ..outputs.parsing import DEFAULT_MAX_WAYPOINT_ABS_M
from ..outputs.prompts import DEFAULT_DETECTION_CLASSES, DEFAULT_DETECTION_EVERY_N_FRAMES, check_detection_every
from ..speed_profile import ProfileLimits
from ..topics import PLANNER_NODE
from .spec import (CONFIGURE, START, ParamError, ParamSpec, by_name, check_values, defaults, field_specs,
                   settings_from)

NODE = PLANNER_NODE
DECODING_PREFIX = "decoding."
ENGINE_PREFIX = "engine."
TASKS = {"plan": ("plan",), "detect": ("detect",), "both": ("plan", "detect")}
MODES = ("realtime", "lockstep")
IMAGE_TRANSPORTS = ("raw", "compressed")
IMAGE_RELIABILITIES = ("best_effort", "reliable")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")

_INPUT_DEFAULTS = InputSettings()
IMAGE_LIMIT_PREFIX = "image."
ROUTE_PREFIX = "route."
PROFILE_PREFIX = "trajectory."
CANDIDATES_PREFIX = "candidates."


SPECS: tuple[ParamSpec, ...] = (
    # ---- model (applied on configure)
    ParamSpec("model_path", "", "checkpoint directory (Qwen3-VL or WAM-Diff2, safetensors)", CONFIGURE),
    ParamSpec("device", "auto", "auto, cpu, cuda[:N] or npu[:N]; auto picks cuda, then npu, then cpu", CONFIGURE),
    ParamSpec("dtype", "auto", "model dtype; auto = float32 on cpu, bfloat16 otherwise", CONFIGURE,
              choices=("auto", *DTYPE_NAMES)),
    ParamSpec("tasks", "plan", "what to decode per frame: plan (waypoints), detect (2-D boxes) or both "
              "(one batched decode)", CONFIGURE, choices=tuple(TASKS)),
    ParamSpec("detection_classes", list(DEFAULT_DETECTION_CLASSES),
              "object classes named in the detection prompt", CONFIGURE),
    ParamSpec("detection_every_n_frames", DEFAULT_DETECTION_EVERY_N_FRAMES, "with tasks both: decode the boxes "
              "on frames 1, N+1, 2N+1, ... (batched with that frame's plan; the plan comes every frame); "
              "1 = every frame", CONFIGURE, low=1, high=100000),
    ParamSpec("image.min_pixels", 0, "lower pixel budget of the image the model sees; 0 = the processor's",
              CONFIGURE, low=0, high=2**31 - 1),
    ParamSpec("image.max_pixels", 0, "upper pixel budget of the image the model sees; 0 = the processor's",
              CONFIGURE, low=0, high=2**31 - 1),
    # (live, beside image.* so the YAML nests them under one image: key)
    *field_specs(IMAGE_LIMIT_PREFIX, ImageLimits, note="; larger frames are skipped (skipped_image_too_large)"),
    ParamSpec("max_waypoint_abs_m", DEFAULT_MAX_WAYPOINT_ABS_M,
              "answers with a waypoint coordinate beyond this are invalid (metres)", CONFIGURE, low=1.0, high=1e6),
    ParamSpec("parse_retry", DEFAULT_PARSE_RETRY, "an answer that does not parse is decoded once more "
              "with this remasking strategy before it counts as invalid (sequential: left to right, one token per "
              "step at denoising_steps = block_size); none = never; no retry at block size 1",
              CONFIGURE, choices=PARSE_RETRIES),
    *field_specs(CANDIDATES_PREFIX, CandidateSettings, CONFIGURE),
    ParamSpec("warmup", True, "on configure: check the fast decoder against the plain one on a grey frame (plain "
              "if they disagree) and decode that frame once, so the first real frame is not slow", CONFIGURE),
    # ---- start-up (read-only)
    ParamSpec("image_transport", "raw", "raw: sensor_msgs/Image on ~/input/image; compressed: "
              "sensor_msgs/CompressedImage (jpeg/png) on ~/input/image/compressed", START,
              choices=IMAGE_TRANSPORTS),
    ParamSpec("image_reliability", "best_effort", "best_effort: sensor-data QoS (keep last 5); reliable, keep all: no "
              "image is lost (lockstep simulators; the publisher must be reliable, as carla-ros-bridge's is)", START,
              choices=IMAGE_RELIABILITIES),
    ParamSpec("autostart", True, "configure and activate on start; false: wait for lifecycle transitions", START),
    ParamSpec("diagnostics_period_s", 1.0, "period of /diagnostics messages (seconds)", START, low=0.05, high=60.0),
    # ---- run mode and inputs (live)
    ParamSpec("mode", "realtime", "realtime: plan on the newest frame whenever the worker is free; "
              "lockstep: plan only on every N-th received image (simulators)", choices=MODES),
    ParamSpec("lockstep_every_n_images", 10, "lockstep mode: plan on images 1, N+1, 2N+1, ... since activation",
              low=1, high=100000),
    ParamSpec("image_timeout_s", 1.0, "skip a frame whose stamp differs from now by more than this (seconds)",
              low=0.001, high=3600.0),
    ParamSpec("odometry_timeout_s", _INPUT_DEFAULTS.odometry_timeout_s, "skip a frame when no odometry lies "
              "within this of its stamp (seconds)", low=0.001, high=3600.0),
    ParamSpec("odometry_wait_s", 0.2, "an image may arrive before the odometry of its stamp (another topic): wait "
              "up to this (wall seconds) for odometry at or after the stamp, then use the newest within "
              "odometry_timeout_s", low=0.0, high=60.0),
    ParamSpec("acceleration_time_constant_s", _INPUT_DEFAULTS.acceleration_time_constant_s, "low-pass time "
              "constant of the acceleration differentiated from odometry velocity (seconds; 0 = unfiltered)",
              low=0.0, high=60.0),
    ParamSpec("default_command", _INPUT_DEFAULTS.default_command, "command when neither ~/input/command nor "
              "a usable route is there", choices=COMMANDS),
    *field_specs(ROUTE_PREFIX, RouteCommandSettings),
    # ---- frames and outputs (live)
    ParamSpec("ego_frame_id", "", "frame of the ego-frame outputs; empty = the odometry's child_frame_id "
              "(base_link if that is empty)"),
    ParamSpec("publish_odom_frame_path", True, "also publish ~/output/path_odom: the plan in the odometry "
              "frame, placed with the ego pose at the image stamp"),
    *field_specs(PROFILE_PREFIX, ProfileLimits, note="; ~/output/autoware_trajectory and the speeds of "
                 "~/output/trajectory"),
    ParamSpec("debug.publish_image", True, "publish ~/debug/image (trajectory projected, boxes drawn)"),
    ParamSpec("debug.publish_markers", True, "publish ~/debug/markers (visualization_msgs/MarkerArray)"),
    ParamSpec("warn_throttle_s", 5.0, "at most one warning per cause in this period (seconds)",
              low=0.0, high=3600.0),
    # ---- camera model for the debug image (live)
    ParamSpec("camera.use_camera_info", True, "take intrinsics from ~/input/camera_info once received; "
              "otherwise from camera.horizontal_fov_deg"),
    ParamSpec("camera.horizontal_fov_deg", 90.0, "horizontal field of view when no camera_info is used "
              "(degrees; CARLA's default camera)", low=1.0, high=179.0),
    ParamSpec("camera.x_m", 2.0, "camera position in the ego frame, forward (metres)", low=-100.0, high=100.0),
    ParamSpec("camera.y_m", 0.0, "camera position in the ego frame, left (metres)", low=-100.0, high=100.0),
    ParamSpec("camera.z_m", 2.0, "camera height above the ego-frame origin (metres)", low=-100.0, high=100.0),
    ParamSpec("camera.roll_deg", 0.0, "camera roll in the ego frame (degrees)", low=-180.0, high=180.0),
    ParamSpec("camera.pitch_deg", 0.0, "camera pitch in the ego frame (degrees, positive looks down)",
              low=-90.0, high=90.0),
    ParamSpec("camera.yaw_deg", 0.0, "camera yaw in the ego frame (degrees, positive looks left)",
              low=-180.0, high=180.0),
) + (
    # unset by default: the checkpoint's own setting applies (the one precedence rule, config.py)
    *field_specs(DECODING_PREFIX, DecodingSettings, unset=True),
) + field_specs(ENGINE_PREFIX, EngineSettings, CONFIGURE)

SPECS_BY_NAME: dict[str, ParamSpec] = by_name(SPECS)
DEFAULTS: dict[str, Any] = defaults(SPECS)
# The planner parameters that are also flags of the wam-diff2 commands (cli_dest: the flag's argparse
# name): `eval-bag` takes them from a --params-file too, `wam-diff2-ros closed-loop` passes them to the
# node. The inputs ...
INPUT_PARAMETERS = ("odometry_timeout_s", "acceleration_time_constant_s", "default_command",
                    *(s.name for s in SPECS if s.name.startswith(ROUTE_PREFIX)))
# ... and the model's (meaningless when eval-bag scores what a node published: --predictions)
MODEL_PARAMETERS = ("model_path", "device", "dtype", "image.min_pixels", "image.max_pixels", "max_waypoint_abs_m",
                    "parse_retry", ENGINE_PREFIX + "quantization")
FLAG_PARAMETERS = (*MODEL_PARAMETERS, *(IMAGE_LIMIT_PREFIX + f.name for f in fields(ImageLimits)),
                   *INPUT_PARAMETERS, *(DECODING_PREFIX + name for name in DECODING_FIELDS))
# config/planner.yaml: the comment above the decoding.* block
UNSET_NOTE = ("decoding.* are unset: the checkpoint's diffusion_config.json applies, else its",
              "format's default. Uncomment to override (the package defaults are shown).")


def validate_values(values: Mapping[str, Any]) -> list[ParamError]:
    """Every problem with a set of parameter values (unknown names are ignored), each naming its parameters."""
    errors = check_values(SPECS, values)
    if errors:
        return errors

    values = {**DEFAULTS, **values}
    if not DEVICE_PATTERN.match(values["device"]):
        errors.append(ParamError(("device",), f"device: {values['device']!r} is not auto, cpu, cuda[:N] or npu[:N]"))
    low, high = values["image.min_pixels"], values["image.max_pixels"]
    if low and high and low > high:
        errors.append(ParamError(("image.min_pixels", "image.max_pixels"),
                                 f"image.min_pixels: {low} is above image.max_pixels {high}"))
    classes, tasks = values["detection_classes"], TASKS[values["tasks"]]
    if "detect" in tasks and (not classes or not all(c.strip() for c in classes)):
        errors.append(ParamError(("detection_classes", "tasks"),
                                 f"detection_classes: {list(classes)!r} must be non-empty names when detecting"))
    try:
        check_detection_every(values["detection_every_n_frames"], tasks)
    except ValueError as exc:
        errors.append(ParamError(("detection_every_n_frames", "tasks"), str(exc)))
    try:
        DecodingSettings().replace(**decoding_overrides(values))
    except ConfigError as exc:
        errors.append(ParamError(tuple(s.name for s in SPECS if s.name.startswith(DECODING_PREFIX)),
                                 f"{DECODING_PREFIX}{exc}"))
    try:
        engine_settings(values)
    except ConfigError as exc:
        errors.append(ParamError(tuple(s.name for s in SPECS if s.name.startswith(ENGINE_PREFIX)),
                                 f"{ENGINE_PREFIX}{exc}"))
    return errors


def engine_settings(values: Mapping[str, Any]) -> EngineSettings:
    """The ``engine.*`` values as validated core settings (raises ConfigError)."""
    return EngineSettings().replace(**{name[len(ENGINE_PREFIX):]: value for name, value in values.items()
                                       if name.startswith(ENGINE_PREFIX)})


def candidate_settings(values: Mapping[str, Any]) -> CandidateSettings:
    return settings_from(CandidateSettings, values, CANDIDATES_PREFIX)


def input_settings(values: Mapping[str, Any]) -> InputSettings:
    """The input parameters as the core's settings (the offline evaluator's ``--params-file`` reads the same)."""
    return InputSettings(**{f.name: values[f.name] for f in fields(InputSettings) if f.name != "route"},
                         route=settings_from(RouteCommandSettings, values, ROUTE_PREFIX))


def image_limits(values: Mapping[str, Any]) -> ImageLimits:
    return settings_from(ImageLimits, values, IMAGE_LIMIT_PREFIX)


def profile_limits(values: Mapping[str, Any]) -> ProfileLimits:
    return settings_from(ProfileLimits, values, PROFILE_PREFIX)


def given_profile_limits(values: Mapping[str, Any], source: str) -> ProfileLimits:
    """The speed profile's limits: the ``trajectory.*`` values in ``values`` (a parameter file's, an integer
    read as a float) over their defaults; ValueError naming the parameter and ``source`` for a bad one."""
    given = {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
             for k, v in values.items() if k.startswith(PROFILE_PREFIX)}
    errors = check_values(SPECS, given)
    if errors:
        raise ValueError(f"{source}: " + "; ".join(e.message for e in errors))
    return profile_limits({**DEFAULTS, **given})


def cli_dest(name: str) -> str:
    """The command-line name of a planner parameter (``route.lookahead_m`` -> ``route_lookahead_m``;
    ``decoding.block_size`` -> ``block_size``, ``image.max_pixels`` -> ``max_pixels``, ``engine.quantization`` ->
    ``quantization``, ``model_path`` -> ``model``)."""
    if name == "model_path":
        return "model"
    for prefix in (DECODING_PREFIX, IMAGE_LIMIT_PREFIX, ENGINE_PREFIX):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name.replace(".", "_")


def decoding_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``decoding.*`` values the user set (unset ones are absent: the checkpoint's apply)."""
    return {name[len(DECODING_PREFIX):]: value for name, value in values.items()
            if name.startswith(DECODING_PREFIX) and name[len(DECODING_PREFIX):] in DECODING_FIELDS
            and value is not None}
