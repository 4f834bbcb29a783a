"""The planner node's parameters: one table of specs, from which everything else is derived.

Descriptors (description, range, read-only), validation on set, the defaults in
``config/planner.yaml`` and the README's parameter table all come from :data:`SPECS`; the
decoding parameters (``decoding.*``) are derived from ``wam_diff2_core.config.DECODING_FIELDS``
so their defaults, ranges and help text exist in one place only.

    python -m wam_diff2_ros.parameters --markdown    # the README table
    python -m wam_diff2_ros.parameters --yaml        # config/planner.yaml's parameter block
    python -m wam_diff2_ros.parameters --write       # rewrite both in place (after a spec change)

Each parameter is applied at one of three moments:
  ``live``       at the next frame (decoding settings, timeouts, camera model, ...);
  ``configure``  when the model is loaded: changes are rejected while a model is loaded
                 (cleanup the node, set, configure again);
  ``start``      read once when the node starts (read-only).
"""
from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from wam_diff2_core.config import (DECODING_FIELDS, ENGINE_FIELDS, PARSE_RETRIES, ConfigError, DecodingSettings,
                                   EngineSettings, field_type)
from wam_diff2_core.geometry import COMMANDS, RouteCommandSettings
from wam_diff2_core.images import ImageLimits
from wam_diff2_core.frame_inputs import InputSettings
from wam_diff2_core.model.checkpoint import DTYPES
from wam_diff2_core.policy import DrivingPolicy

LIVE, CONFIGURE, START = "live", "configure", "start"
DECODING_PREFIX = "decoding."
ENGINE_PREFIX = "engine."
TASKS = {"plan": ("plan",), "detect": ("detect",), "both": ("plan", "detect")}
MODES = ("realtime", "lockstep")
IMAGE_TRANSPORTS = ("raw", "compressed")
IMAGE_RELIABILITIES = ("best_effort", "reliable")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")

_POLICY_DEFAULTS = {k: p.default for k, p in inspect.signature(DrivingPolicy.__init__).parameters.items()}
_INPUT_DEFAULTS = InputSettings()
_ROUTE_DEFAULTS = _INPUT_DEFAULTS.route
_IMAGE_LIMITS = {f.name: f for f in fields(ImageLimits)}
IMAGE_LIMIT_PREFIX = "image."


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any
    description: str
    apply: str = LIVE
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    type_: type | None = None     # needed when default is None (declared unset: "from the checkpoint")

    @property
    def kind(self) -> type:
        return self.type_ or type(self.default)


SPECS: tuple[ParamSpec, ...] = (
    # ---- model (applied on configure)
    ParamSpec("model_path", "", "checkpoint directory (Qwen3-VL or WAM-Diff2, safetensors)", CONFIGURE),
    ParamSpec("device", "auto", "auto, cpu, cuda[:N] or npu[:N]; auto picks cuda, then npu, then cpu", CONFIGURE),
    ParamSpec("dtype", "auto", "model dtype; auto = float32 on cpu, bfloat16 otherwise", CONFIGURE,
              choices=("auto", *DTYPES)),
    ParamSpec("tasks", "plan", "what to decode per frame: plan (waypoints), detect (2-D boxes) or both "
              "(one batched decode)", CONFIGURE, choices=tuple(TASKS)),
    ParamSpec("detection_classes", list(_POLICY_DEFAULTS["detection_classes"]),
              "object classes named in the detection prompt", CONFIGURE),
    ParamSpec("image.min_pixels", 0, "lower pixel budget of the image the model sees; 0 = the processor's",
              CONFIGURE, low=0, high=2**31 - 1),
    ParamSpec("image.max_pixels", 0, "upper pixel budget of the image the model sees; 0 = the processor's",
              CONFIGURE, low=0, high=2**31 - 1),
    # (live, beside image.* so the YAML nests them under one image: key)
    *(ParamSpec(IMAGE_LIMIT_PREFIX + f.name, f.default, f"{f.metadata['help']}; larger frames are skipped "
                "(skipped_image_too_large)", low=1, high=2**40) for f in _IMAGE_LIMITS.values()),
    ParamSpec("max_waypoint_abs_m", float(_POLICY_DEFAULTS["max_waypoint_abs_m"]),
              "answers with a waypoint coordinate beyond this are invalid (metres)", CONFIGURE, low=1.0, high=1e6),
    ParamSpec("parse_retry", _POLICY_DEFAULTS["parse_retry"], "an answer that does not parse is decoded once more "
              "with this remasking strategy before it counts as invalid (sequential: left to right, one token per "
              "step at denoising_steps = block_size); none = never; no retry at block size 1",
              CONFIGURE, choices=PARSE_RETRIES),
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
    ParamSpec("route.lookahead_m", _ROUTE_DEFAULTS.lookahead_m, "route length ahead of the ego used to "
              "derive the command (metres)", low=1.0, high=1000.0),
    ParamSpec("route.turn_angle_deg", _ROUTE_DEFAULTS.turn_angle_deg, "heading change over the look-ahead "
              "that makes a left/right command (degrees)", low=1.0, high=180.0),
    ParamSpec("route.lateral_offset_m", _ROUTE_DEFAULTS.lateral_offset_m, "sideways route offset at the "
              "look-ahead end that makes a left/right command (metres; lane changes)", low=0.1, high=100.0),
    ParamSpec("route.max_distance_m", _ROUTE_DEFAULTS.max_distance_m, "ignore the route when the ego is "
              "farther from it than this (metres)", low=0.1, high=1000.0),
    # ---- frames and outputs (live)
    ParamSpec("ego_frame_id", "", "frame of the ego-frame outputs; empty = the odometry's child_frame_id "
              "(base_link if that is empty)"),
    ParamSpec("publish_odom_frame_path", True, "also publish ~/output/path_odom: the plan in the odometry "
              "frame, placed with the ego pose at the image stamp"),
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
) + tuple(
    # unset by default: the checkpoint's own setting applies (the one precedence rule, config.py)
    ParamSpec(DECODING_PREFIX + name, None, str(f.metadata["help"]), LIVE, choices=f.metadata["choices"],
              low=f.metadata["low"], high=f.metadata["high"], type_=field_type(f))
    for name, f in DECODING_FIELDS.items()
) + tuple(
    ParamSpec(ENGINE_PREFIX + name, f.default, str(f.metadata["help"]), CONFIGURE, choices=f.metadata["choices"],
              low=f.metadata["low"], high=f.metadata["high"])
    for name, f in ENGINE_FIELDS.items()
)

SPECS_BY_NAME: dict[str, ParamSpec] = {s.name: s for s in SPECS}
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SPECS}


# ----------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class ParamError:
    names: tuple[str, ...]     # the parameters the problem involves
    message: str               # names the offending field and value

    def __str__(self) -> str:
        return self.message


def _type_ok(spec: ParamSpec, value: Any) -> bool:
    if spec.kind is list:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if spec.kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if spec.kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, spec.kind)


def validate_values(values: Mapping[str, Any]) -> list[ParamError]:
    """Every problem with a full set of parameter values (unknown names are ignored)."""
    errors: list[ParamError] = []
    for spec in SPECS:
        if spec.name not in values or (values[spec.name] is None and spec.default is None):
            continue
        value = values[spec.name]
        if not _type_ok(spec, value):
            errors.append(ParamError((spec.name,), f"{spec.name}: expected {spec.kind.__name__}, got {value!r}"))
            continue
        if spec.choices is not None and value not in spec.choices:
            errors.append(ParamError((spec.name,), f"{spec.name}: {value!r} is not one of {', '.join(spec.choices)}"))
        if spec.low is not None and value < spec.low:
            errors.append(ParamError((spec.name,), f"{spec.name}: {value!r} is below {spec.low}"))
        if spec.high is not None and value > spec.high:
            errors.append(ParamError((spec.name,), f"{spec.name}: {value!r} is above {spec.high}"))
        if isinstance(value, float) and value != value:
            errors.append(ParamError((spec.name,), f"{spec.name}: must be a number, got NaN"))
    if errors:
        return errors

    if not DEVICE_PATTERN.match(values.get("device", "auto")):
        errors.append(ParamError(("device",), f"device: {values['device']!r} is not auto, cpu, cuda[:N] or npu[:N]"))
    low, high = values.get("image.min_pixels", 0), values.get("image.max_pixels", 0)
    if low and high and low > high:
        errors.append(ParamError(("image.min_pixels", "image.max_pixels"),
                                 f"image.min_pixels: {low} is above image.max_pixels {high}"))
    classes = values.get("detection_classes", DEFAULTS["detection_classes"])
    if "detect" in TASKS[values.get("tasks", "plan")] and (not classes or not all(c.strip() for c in classes)):
        errors.append(ParamError(("detection_classes", "tasks"),
                                 f"detection_classes: {list(classes)!r} must be non-empty names when detecting"))
    try:
        decoding_settings(values)
    except ConfigError as exc:
        errors.append(ParamError(tuple(s.name for s in SPECS if s.name.startswith(DECODING_PREFIX)),
                                 f"{DECODING_PREFIX}{exc}"))
    try:
        engine_settings({k: v for k, v in {**DEFAULTS, **values}.items() if k.startswith(ENGINE_PREFIX)})
    except ConfigError as exc:
        errors.append(ParamError(tuple(s.name for s in SPECS if s.name.startswith(ENGINE_PREFIX)),
                                 f"{ENGINE_PREFIX}{exc}"))
    return errors


def decoding_settings(values: Mapping[str, Any]) -> DecodingSettings:
    """The ``decoding.*`` values as validated core settings (raises ConfigError)."""
    return DecodingSettings().replace(**decoding_overrides(values))


def engine_settings(values: Mapping[str, Any]) -> EngineSettings:
    """The ``engine.*`` values as validated core settings (raises ConfigError)."""
    return EngineSettings().replace(**{name[len(ENGINE_PREFIX):]: value for name, value in values.items()
                                       if name.startswith(ENGINE_PREFIX)})


def input_settings(values: Mapping[str, Any]) -> InputSettings:
    """The input parameters as the core's settings (the offline evaluator's ``--params-file`` reads the same)."""
    route = RouteCommandSettings(**{f.name: values["route." + f.name] for f in fields(RouteCommandSettings)})
    return InputSettings(odometry_timeout_s=values["odometry_timeout_s"],
                         acceleration_time_constant_s=values["acceleration_time_constant_s"],
                         default_command=values["default_command"], route=route)


def image_limits(values: Mapping[str, Any]) -> ImageLimits:
    """The ``image.max_decoded_*`` values as the core's image-size guard."""
    return ImageLimits(**{name: values[IMAGE_LIMIT_PREFIX + name] for name in _IMAGE_LIMITS})


def decoding_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``decoding.*`` values the user set (unset ones are absent: the checkpoint's apply)."""
    return {name[len(DECODING_PREFIX):]: value for name, value in values.items()
            if name.startswith(DECODING_PREFIX) and name[len(DECODING_PREFIX):] in DECODING_FIELDS
            and value is not None}


# ----------------------------------------------------------------------------- ROS descriptors
def _constraints(spec: ParamSpec) -> str:
    parts = []
    if spec.choices is not None:
        parts.append("one of: " + ", ".join(spec.choices))
    if spec.apply == CONFIGURE:
        parts.append("applied on configure; rejected while a model is loaded (cleanup first)")
    if spec.apply == START:
        parts.append("read once at start")
    return "; ".join(parts)


def descriptor(spec: ParamSpec):
    """An rcl_interfaces ParameterDescriptor (ranges are enforced by rclpy as well as here)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    d = ParameterDescriptor(name=spec.name, description=spec.description,
                            additional_constraints=_constraints(spec), read_only=spec.apply == START)
    if spec.kind is int and (spec.low is not None or spec.high is not None):
        d.integer_range = [IntegerRange(from_value=int(spec.low if spec.low is not None else -2**63),
                                        to_value=int(spec.high if spec.high is not None else 2**63 - 1), step=0)]
    elif spec.kind is float and (spec.low is not None or spec.high is not None):
        d.floating_point_range = [FloatingPointRange(
            from_value=float(spec.low if spec.low is not None else -sys.float_info.max),
            to_value=float(spec.high if spec.high is not None else sys.float_info.max), step=0.0)]
    return d


def declare_all(node) -> dict[str, str]:
    """Declare every spec on ``node`` with its descriptor; values come from overrides (YAML, -p).

    An override rclpy refuses (wrong type, out of range) does not stop the node: the parameter is
    declared with its default and the refusal is returned ({name: reason}), so configure can
    fail with that reason while the node stays up to report it.
    """
    rejected: dict[str, str] = {}
    for spec in SPECS:
        initial = spec.default if spec.default is not None else _ros_type(spec.kind)
        try:
            node.declare_parameter(spec.name, initial, descriptor(spec))
        except Exception as exc:  # rclpy raises several exception types for a refused override
            node.declare_parameter(spec.name, initial, descriptor(spec), ignore_override=True)
            rejected[spec.name] = f"{spec.name}: the given value was refused ({exc})"
    return rejected


def _ros_type(kind: type):
    """The rclpy type of a parameter declared without a value (statically typed, unset)."""
    from rclpy.parameter import Parameter

    return {bool: Parameter.Type.BOOL, int: Parameter.Type.INTEGER, float: Parameter.Type.DOUBLE,
            str: Parameter.Type.STRING}[kind]


def read_all(node) -> dict[str, Any]:
    """Every spec's current value on ``node``; None for a parameter declared unset."""
    from rclpy.exceptions import ParameterUninitializedException

    values = {}
    for spec in SPECS:
        try:
            values[spec.name] = node.get_parameter(spec.name).value
        except ParameterUninitializedException:
            values[spec.name] = None
    return values


# ----------------------------------------------------------------------------- generated docs
UNSET_DEFAULT = "unset: the checkpoint's"


def _format_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return repr(value)


def _format_range(spec: ParamSpec) -> str:
    if spec.choices is not None:
        return " / ".join(spec.choices)
    if spec.low is not None or spec.high is not None:
        return f"{_format_default(spec.low) if spec.low is not None else ''} .. " \
               f"{_format_default(spec.high) if spec.high is not None else ''}"
    return ""


def markdown_table(specs: Iterable[ParamSpec] = SPECS) -> str:
    rows = ["| name | type | default | range | applied | description |", "|---|---|---|---|---|---|"]
    type_names = {str: "string", int: "int", float: "double", bool: "bool", list: "string[]"}
    for s in specs:
        description = s.description.replace("|", "\\|")
        default = UNSET_DEFAULT if s.default is None else f"`{_format_default(s.default)}`"
        rows.append(f"| `{s.name}` | {type_names[s.kind]} | {default} | {_format_range(s)} "
                    f"| {s.apply} | {description} |")
    return "\n".join(rows)


def yaml_block(specs: Iterable[ParamSpec] = SPECS, indent: int = 4) -> str:
    """The ros__parameters block with every default, nested on the dots; the parameters that are
    unset by default (``decoding.*``: the checkpoint's) follow as comments with the package default."""
    specs = list(specs)
    unset = [s for s in specs if s.default is None]
    lines = _yaml_lines([s for s in specs if s.default is not None], indent)
    if unset:
        lines += [" " * indent + "# decoding.* are unset: the checkpoint's diffusion_config.json applies, else its",
                  " " * indent + "# format's default. Uncomment to override (the package defaults are shown)."]
        fields_by_name = {DECODING_PREFIX + n: f for n, f in DECODING_FIELDS.items()}
        filled = [ParamSpec(s.name, fields_by_name[s.name].default, s.description) for s in unset]
        lines += ["#" + line[1:] if line.startswith(" ") else "# " + line for line in _yaml_lines(filled, indent)]
    return "\n".join(lines)


def _yaml_lines(specs: list[ParamSpec], indent: int) -> list[str]:
    lines, opened = [], []
    for s in specs:
        *groups, leaf = s.name.split(".")
        common = 0
        while common < min(len(groups), len(opened)) and groups[common] == opened[common]:
            common += 1
        opened = opened[:common]
        for g in groups[common:]:
            lines.append(" " * (indent + 2 * len(opened)) + f"{g}:")
            opened.append(g)
        lines.append(" " * (indent + 2 * len(opened)) + f"{leaf}: {_format_default(s.default)}")
    return lines


YAML_MARKER = "  ros__parameters:\n"
README_TABLE_START, README_TABLE_END = "| name | type | default |", "\n\n## Running with CARLA"


def write_generated(root: Path) -> list[Path]:
    """Rewrite the generated parts of ``config/planner.yaml`` (after its header comments) and of
    ``wam_diff2_ros/README.md`` (the parameter table) from :data:`SPECS`."""
    yaml_path, readme_path = root / "config" / "planner.yaml", root / "wam_diff2_ros" / "README.md"
    text = yaml_path.read_text()
    yaml_path.write_text(text[: text.index(YAML_MARKER) + len(YAML_MARKER)] + yaml_block() + "\n")
    text = readme_path.read_text()
    start, end = text.index(README_TABLE_START), text.index(README_TABLE_END)
    readme_path.write_text(text[:start] + markdown_table() + text[end:])
    return [yaml_path, readme_path]


if __name__ == "__main__":
    if "--markdown" in sys.argv:
        print(markdown_table())
    elif "--yaml" in sys.argv:
        print(yaml_block())
    elif "--write" in sys.argv:
        for written in write_generated(Path(__file__).resolve().parents[1]):
            print(f"wrote {written}")
    else:
        print(__doc__)
