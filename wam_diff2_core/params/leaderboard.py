"""The leaderboard stack in one place: launch/leaderboard.launch.py's arguments, its nodes and the
parameters it passes them, and the arguments the Leaderboard 2.0 agent hands it.

launch/leaderboard.launch.py builds its actions from :data:`NODES` (each :class:`Arg` becomes a
``LaunchConfiguration``); ``wam-diff2-ros closed-loop --bridge`` starts the same nodes in one process with
:func:`resolve_nodes` on the same arguments, as ``ros2 launch`` would (there is no ``ros2 launch`` in
the test environment); agents/wam_diff2_agent.py passes :data:`AGENT_ARGUMENTS`. ROS-free: names and values.

    nodes = resolve_nodes(launch_values({"model_path": "ckpt/", **AGENT_ARGUMENTS}, share="/opt/.../wam_diff2_ros"))
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..topics import (DEFAULT_CAMERA, DEFAULT_GNSS, DEFAULT_IMU, DEFAULT_SPEEDOMETER, CONTROLLER_NODE,
                      LOCALIZATION_NODE, PLANNER_NODE, carla_topic_parts)
from ..topics import PACKAGE as PACKAGE    # the launch file and the agent read it here
from ..utils.atomic import atomic_write_text
from .controller import DEFAULTS as CONTROLLER_DEFAULTS
from .localization import DEFAULTS as LOCALIZATION_DEFAULTS
from .planner import DEFAULTS as PLANNER_DEFAULTS

ROLE_NAME = "hero"                                     # the leaderboard's ego role
CAMERA_ID, GNSS_ID, IMU_ID, SPEEDOMETER_ID = DEFAULT_CAMERA, DEFAULT_GNSS, DEFAULT_IMU, DEFAULT_SPEEDOMETER


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


# the front camera in the planner's ego frame (the rear axle: the odometry's origin), for its debug image; the
# agent sets them from the checkpoint's camera rig (wam_diff2_core/camera_rig.py): (launch argument, parameter)
CAMERA_ARGUMENTS = (("camera_fov_deg", "camera.horizontal_fov_deg"), ("camera_x_m", "camera.x_m"),
                    ("camera_y_m", "camera.y_m"), ("camera_z_m", "camera.z_m"),
                    ("camera_pitch_deg", "camera.pitch_deg"))
ARGUMENTS: tuple[LaunchArgument, ...] = (
    LaunchArgument("model_path", None, "checkpoint directory (Qwen3-VL or WAM-Diff2)"),
    LaunchArgument("role_name", ROLE_NAME, "CARLA ego role name (leaderboard: hero)"),
    LaunchArgument("camera_id", CAMERA_ID, "front camera sensor id"),
    LaunchArgument("lockstep_n", str(PLANNER_DEFAULTS["lockstep_every_n_images"]),
                   "plan on every N-th camera tick (10 at 20 Hz: 2 Hz, one plan per 0.5 s)"),
    LaunchArgument("fixed_delta_seconds", "0.05", "simulator tick (seconds)"),
    LaunchArgument("tick_source", CONTROLLER_DEFAULTS["tick_source"],
                   "controller tick: odometry (each odometry message) | clock (each /clock)"),
    LaunchArgument("device", PLANNER_DEFAULTS["device"], "planner device: auto, cpu, cuda[:N]"),
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
    *(LaunchArgument(arg, str(PLANNER_DEFAULTS[param]), f"the planner's {param}") for arg, param in CAMERA_ARGUMENTS),
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
        **{name: Arg(name) for name in ("gnss_id", "imu_id", "speedometer_id")},
        "geo.lat_ref_deg": Arg("lat_ref_deg", float),
        "geo.lon_ref_deg": Arg("lon_ref_deg", float),
        "publish_tf": True,                 # the leaderboard publishes no TF: map -> <role> from the estimate
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
        **{param: Arg(arg, float) for arg, param in CAMERA_ARGUMENTS},
    }, remappings=(
        *((f"~/input/{name}", carla_topic_parts(name, _ROLE, _CAMERA)) for name in ("image", "camera_info", "odometry")),
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
    """Every launch argument's value: ``given`` over the defaults (a parameter file's needs ``share``, the package's
    share directory); ValueError naming an unknown argument or a required one not given."""
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


# ----------------------------------------------------------------------------- Bench2Drive harness
MODEL_PATH_ENV, TEAM_CONFIG_ENV, SAVE_PATH_ENV = "WAM_DIFF2_MODEL_PATH", "TEAM_CONFIG", "SAVE_PATH"
DEMO_MODEL_NAME = "demo"                   # WAM_DIFF2_MODEL_PATH=demo: the demo model, asked for explicitly
EVALUATOR_PORT_STRIDE = 150                # Bench2Drive's parallel evaluators: CARLA ports 150 apart
MAX_DOMAIN_ID = 101                        # ROS 2's domain ids safe on Linux: 0 .. 101
METRIC_INFO_FILE = "metric_info.json"


def evaluator_domain_id(carla_port: int) -> int:
    """The ROS domain of the evaluator on ``carla_port``: one per 150-port block (Bench2Drive's stride; the port a
    busy one moves to stays in its block), 1 .. 101 (0, the default, left to everything else)."""
    if isinstance(carla_port, bool) or not isinstance(carla_port, int) or not 0 < carla_port < 65536:
        raise ValueError(f"carla_port: {carla_port!r} is not a TCP port")
    return 1 + (carla_port // EVALUATOR_PORT_STRIDE) % MAX_DOMAIN_ID


def evaluator_environment(carla_port: int) -> dict[str, str]:
    """What the agent sets before anything of ROS starts (the bridge, the launch, the ROS client): its evaluator's
    domain and discovery on this machine only, so evaluators on one host never see each other's topics."""
    return {"ROS_DOMAIN_ID": str(evaluator_domain_id(carla_port)), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}


def model_path_from(environ: Mapping[str, str], demo_path: str) -> tuple[str, str]:
    """(checkpoint directory, where it came from): ``$WAM_DIFF2_MODEL_PATH`` (``demo``: ``demo_path``), else
    ``$TEAM_CONFIG``'s first ``+`` field (Bench2Drive's form); ValueError when neither is set."""
    path = environ.get(MODEL_PATH_ENV, "").strip()
    if path:
        return (demo_path, f"{MODEL_PATH_ENV}=demo") if path == DEMO_MODEL_NAME else (path, MODEL_PATH_ENV)
    team_config = environ.get(TEAM_CONFIG_ENV, "").strip()
    if team_config.split("+")[0]:
        return team_config.split("+")[0], TEAM_CONFIG_ENV
    raise ValueError(f"no model: set {MODEL_PATH_ENV} (or {TEAM_CONFIG_ENV}, Bench2Drive's agent config) to a "
                     f"checkpoint directory, or {MODEL_PATH_ENV}={DEMO_MODEL_NAME} for the demo model")


def save_directory(environ: Mapping[str, str], path_to_conf_file: str) -> str | None:
    """Where Bench2Drive wants this route's files: ``$SAVE_PATH/<save_name>``, the last ``+`` field its evaluator
    appends to the agent config; None outside Bench2Drive."""
    root, fields = environ.get(SAVE_PATH_ENV, ""), str(path_to_conf_file).split("+")
    return os.path.join(root, fields[-1]) if root and len(fields) > 1 and fields[-1] else None


class MetricLog:
    """Bench2Drive's ``metric_info.json``: its evaluator's ``get_metric_info()`` per step, keyed by the step, as its
    efficiency and smoothness tool reads it; written atomically every ``every`` steps and on :meth:`write`."""

    def __init__(self, directory: str, every: int = 100):
        self.path = os.path.join(directory, METRIC_INFO_FILE)
        self.every, self.steps = every, {}
        os.makedirs(directory, exist_ok=True)

    def add(self, step: int, info: Mapping[str, Any]) -> None:
        self.steps[str(step)] = dict(info)
        if len(self.steps) % self.every == 0:
            self.write()

    def write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.steps))
