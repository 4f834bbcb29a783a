"""The leaderboard stack in one place: launch/leaderboard.launch.py's arguments, its nodes and the
parameters it passes them, and the arguments the Leaderboard 2.0 agent hands it.

launch/leaderboard.launch.py builds its actions from :data:`NODES` (each :class:`Arg` becomes a
``LaunchConfiguration``); ``wam-diff2-ros closed-loop --bridge`` starts the same nodes in one process with
:func:`resolve_nodes` on the same arguments, as ``ros2 launch`` would (there is no ``ros2 launch`` in
the test environment); agents/wam_diff2_agent.py passes :data:`AGENT_ARGUMENTS`. ROS-free: names and values.

    nodes = resolve_nodes(launch_values({"model_path": "ckpt/", **AGENT_ARGUMENTS}, share="/opt/.../wam_diff2_ros"))
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..topics import CONTROLLER_NODE, LOCALIZATION_NODE, PLANNER_NODE
from .localization import DEFAULTS as LOCALIZATION_DEFAULTS

PACKAGE = "wam_diff2_ros"
ROLE_NAME = "hero"                                     # the leaderboard's ego role
CAMERA_ID, GNSS_ID, IMU_ID, SPEEDOMETER_ID = "rgb_front", "gnss", "imu", "speedometer"


@dataclass(frozen=True)
class Arg:
    """The value of launch argument ``name``, as ``type`` (launch arguments are strings)."""
    name: str
    type: type = str


@dataclass(frozen=True)
class Product:
    """The product of two numeric launch arguments (a float)."""
    factors: tuple[Arg, Arg]


@dataclass(frozen=True)
class LaunchArgument:
    name: str
    default: str | tuple[str, ...] | None      # a tuple: a path under the package's share directory; None: required
    description: str


@dataclass(frozen=True)
class NodeSpec:
    executable: str
    name: str
    parameters: Mapping[str, Any]              # values: constants, Arg or Product
    params_file: Arg | None = None             # a YAML file loaded before ``parameters`` (which win)
    remappings: tuple[tuple[str, tuple[Any, ...]], ...] = ()   # (from, parts of the target: str or Arg)
    lifecycle: bool = False
    condition: Arg | None = None               # started only when this boolean argument is true


ARGUMENTS: tuple[LaunchArgument, ...] = (
    LaunchArgument("model_path", None, "checkpoint directory (Qwen3-VL or WAM-Diff2)"),
    LaunchArgument("role_name", ROLE_NAME, "CARLA ego role name (leaderboard: hero)"),
    LaunchArgument("camera_id", CAMERA_ID, "front camera sensor id"),
    LaunchArgument("lockstep_n", "10", "plan on every N-th camera tick (10 at 20 Hz: 2 Hz, one plan per 0.5 s)"),
    LaunchArgument("fixed_delta_seconds", "0.05", "simulator tick (seconds)"),
    LaunchArgument("tick_source", "odometry",
                   "controller tick: odometry (each odometry message) | clock (each /clock)"),
    LaunchArgument("device", "auto", "planner device: auto, cpu, cuda[:N]"),
    LaunchArgument("planner_params_file", ("config", "planner.yaml"), "the planner's parameter file"),
    LaunchArgument("controller_params_file", ("config", "controller.yaml"), "the controller's parameter file"),
    LaunchArgument("localization", "true", "true: odometry from GNSS + IMU + speedometer (SENSORS track); "
                                           "false: the bridge's odometry pseudo-sensor"),
    LaunchArgument("gnss_id", GNSS_ID, "GNSS sensor id"),
    LaunchArgument("imu_id", IMU_ID, "IMU sensor id"),
    LaunchArgument("speedometer_id", SPEEDOMETER_ID, "speedometer sensor id"),
    LaunchArgument("lat_ref_deg", str(LOCALIZATION_DEFAULTS["geo.lat_ref_deg"]),
                   "the town's georeference latitude (OpenDRIVE header; degrees)"),
    LaunchArgument("lon_ref_deg", str(LOCALIZATION_DEFAULTS["geo.lon_ref_deg"]),
                   "the town's georeference longitude (degrees)"),
)
ARGUMENTS_BY_NAME = {a.name: a for a in ARGUMENTS}

# what the agent passes (besides model_path): the SENSORS track's sensor ids on the leaderboard's role
AGENT_ARGUMENTS: dict[str, str] = {"role_name": ROLE_NAME, "camera_id": CAMERA_ID, "localization": "true",
                                   "gnss_id": GNSS_ID, "imu_id": IMU_ID, "speedometer_id": SPEEDOMETER_ID}

_ROLE, _CAMERA, _LOCKSTEP_N = Arg("role_name"), Arg("camera_id"), Arg("lockstep_n", int)
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("wam-diff2-localization", LOCALIZATION_NODE, condition=Arg("localization", bool), parameters={
        "role_name": _ROLE,
        "use_sim_time": True,
        "gnss_id": Arg("gnss_id"),
        "imu_id": Arg("imu_id"),
        "speedometer_id": Arg("speedometer_id"),
        "geo.lat_ref_deg": Arg("lat_ref_deg", float),
        "geo.lon_ref_deg": Arg("lon_ref_deg", float),
    }),
    NodeSpec("wam-diff2-planner", PLANNER_NODE, lifecycle=True, params_file=Arg("planner_params_file"), parameters={
        "model_path": Arg("model_path"),
        "device": Arg("device"),
        "use_sim_time": True,
        "mode": "lockstep",
        "lockstep_every_n_images": _LOCKSTEP_N,
        "image_transport": "raw",
        # the bridge publishes its camera reliable; on best effort most raw frames of more than
        # ~0.5 MB never arrive over Fast DDS (wam_diff2_ros/README.md, image QoS)
        "image_reliability": "reliable",
    }, remappings=(
        ("~/input/image", ("/carla/", _ROLE, "/", _CAMERA, "/image")),
        ("~/input/camera_info", ("/carla/", _ROLE, "/", _CAMERA, "/camera_info")),
        ("~/input/odometry", ("/carla/", _ROLE, "/odometry")),
        # no route remap: the controller sends the route's command to ~/input/command
    )),
    NodeSpec("wam-diff2-controller", CONTROLLER_NODE, params_file=Arg("controller_params_file"), parameters={
        "role_name": _ROLE,
        "planner_name": PLANNER_NODE,
        "use_sim_time": True,
        "tick_source": Arg("tick_source"),
        "plan_deadline_s": Product((_LOCKSTEP_N, Arg("fixed_delta_seconds", float))),
        "pacing_every_n_ticks": _LOCKSTEP_N,          # the planner's planning frames
        "route.publish_command": True,
    }),
)


def default_value(argument: LaunchArgument, share: str) -> str | None:
    """The argument's default (a share path joined to the package's share directory ``share``); None: required."""
    default = argument.default
    return os.path.join(share, *default) if isinstance(default, tuple) else default


def launch_values(given: Mapping[str, str], share: str | None = None) -> dict[str, str]:
    """Every launch argument's value: ``given`` over the defaults (``share``: the package's share directory,
    needed for a parameter file not given). Raises ValueError naming an unknown argument or a required one
    not given."""
    unknown = sorted(set(given) - set(ARGUMENTS_BY_NAME))
    if unknown:
        raise ValueError(f"unknown launch argument(s) {unknown}; leaderboard.launch.py has {sorted(ARGUMENTS_BY_NAME)}")
    values = {}
    for a in ARGUMENTS:
        if a.name in given:
            values[a.name] = str(given[a.name])
        elif a.default is None or (isinstance(a.default, tuple) and share is None):
            raise ValueError(f"{a.name}: a required launch argument, not given ({a.description})")
        else:
            values[a.name] = default_value(a, share)
    return values


def resolve(value: Any, values: Mapping[str, str]) -> Any:
    """A parameter value of :data:`NODES` with the launch arguments ``values`` put in, typed as the
    launch file types it. Raises ValueError naming the argument whose text is not of its type."""
    if isinstance(value, Product):
        a, b = (resolve(f, values) for f in value.factors)
        return float(a) * float(b)
    if not isinstance(value, Arg):
        return value
    text = values[value.name]
    try:
        if value.type is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        return value.type(text)
    except ValueError:
        raise ValueError(f"{value.name}: {text!r} is not a {value.type.__name__}") from None


@dataclass(frozen=True)
class ResolvedNode:
    spec: NodeSpec
    parameters: dict[str, Any]
    params_file: str | None
    remappings: list[tuple[str, str]] = field(default_factory=list)


def resolve_nodes(values: Mapping[str, str]) -> list[ResolvedNode]:
    """The nodes the launch file starts for these argument values (a node whose condition is false left out)."""
    return [ResolvedNode(spec, {k: resolve(v, values) for k, v in spec.parameters.items()},
                         resolve(spec.params_file, values) if spec.params_file else None,
                         [(source, "".join(str(resolve(p, values)) for p in target))
                          for source, target in spec.remappings])
            for spec in NODES if spec.condition is None or resolve(spec.condition, values)]
