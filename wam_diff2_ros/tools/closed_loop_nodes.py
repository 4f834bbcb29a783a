"""What ``wam-diff2-ros closed-loop`` runs and each node's arguments: its own parameters and remappings, or,
``bridge``, what ``launch/leaderboard.launch.py`` gives the nodes for the Leaderboard 2.0 agent's arguments.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml
from rclpy.parameter import Parameter

from wam_diff2_core.control import ControllerGains
from wam_diff2_core.params.controller import DEFAULTS as CONTROLLER_DEFAULTS, GAINS_PREFIX
from wam_diff2_core.params.leaderboard import AGENT_ARGUMENTS, ROLE_NAME, launch_values, resolve_nodes
from wam_diff2_core.params.parameter_file import nested
from wam_diff2_core.sim.episode_bags import topic_names
from wam_diff2_core.sim.protocol import LOCKSTEP_N
from wam_diff2_core.topics import CONTROLLER_NODE, PLANNER_NODE

from ..optional_msgs import carla_msgs
from .cli import ODOMETRY_SOURCES, TIMINGS

PLANNERS = ("inprocess", "subprocess", "oracle")


@dataclass
class RosLoopSettings:
    role: str = ROLE_NAME                    # the leaderboard's role name
    planner: str = "oracle"                  # inprocess | subprocess | oracle
    model_path: str = ""
    planner_parameters: dict[str, Any] = field(default_factory=dict)   # extra planner parameters (decoding.*, device)
    lockstep_n: int = LOCKSTEP_N
    timing: str = TIMINGS[0]
    command_source: str = "world"            # world: the simulator publishes the command; route: the controller
    gains: ControllerGains = field(default_factory=ControllerGains)
    control_timeout_s: float = 1.0           # the leaderboard's wall wait for each control
    plan_timeout_s: float = 300.0            # lockstep timing: wall wait for a planning tick's trajectory
    ready_timeout_s: float = 900.0           # wall wait for the handshake (model load + warm-up)
    domain_id: int | None = None             # None: ROS_DOMAIN_ID or 0
    odometry: str = ODOMETRY_SOURCES[0]      # true: the simulator's odometry; estimated: the localization node's
                                             # from the demo world's GNSS / IMU / speedometer
    pacing: str = CONTROLLER_DEFAULTS["pacing"]   # the controller's pacing (hold | newest)
    planner_slowdown: float = 1.0            # inprocess: each plan takes this many times as long (a test hook:
                                             # it sleeps (slowdown - 1) x its decode time), to measure pacing
    bridge: bool = False                     # the Leaderboard 2.0 bridge and agent: CarlaRoute, CarlaEgoVehicleControl,
                                             # the nodes as launch/leaderboard.launch.py starts them (needs
                                             # odometry estimated and command_source route, as the SENSORS track)

    def __post_init__(self):
        for name, choices in (("planner", PLANNERS), ("odometry", ODOMETRY_SOURCES), ("timing", TIMINGS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(choices)}")
        if self.planner != "oracle" and not self.model_path:
            raise ValueError("model_path: empty; the planner needs a checkpoint (or use planner='oracle')")
        if self.lockstep_n < 1:
            raise ValueError(f"lockstep_n: must be >= 1, got {self.lockstep_n}")
        if not math.isfinite(self.planner_slowdown) or self.planner_slowdown < 1.0 or (
                self.planner_slowdown != 1.0 and self.planner != "inprocess"):
            raise ValueError(f"planner_slowdown: {self.planner_slowdown!r} must be >= 1 (and != 1 only with the "
                             f"inprocess planner, got {self.planner!r})")
        if self.bridge and (self.odometry, self.command_source) != ("estimated", "route"):
            raise ValueError(f"bridge: the SENSORS track has no odometry and the agent tracks the route itself: needs "
                             f"odometry 'estimated' and command_source 'route', got {self.odometry!r} and "
                             f"{self.command_source!r}")
        if (self.bridge or self.odometry == "estimated") and carla_msgs is None:
            raise ValueError("bridge / odometry estimated: the bridge's carla_msgs is not importable "
                             "(scripts/build_ros_interfaces.sh, then . scripts/env.sh)")

    @property
    def gain_parameters(self) -> dict[str, float]:
        return {GAINS_PREFIX + k: v for k, v in vars(self.gains).items()}


def loop_arguments(name: str, st: RosLoopSettings) -> tuple[dict[str, Any], list[str]]:
    """(parameters, remap rules) this loop gives node ``name``: sim time; the planner in lockstep on the
    simulator's topics with reliable images and no debug outputs; the controller's control applied by the
    simulator."""
    if name == PLANNER_NODE:
        topics, planner = topic_names(st.role), f"/{PLANNER_NODE}"
        # images reliable: a lost image would shift which ticks the planner plans on (it counts images)
        return ({"model_path": st.model_path, "use_sim_time": True, "mode": "lockstep",
                 "lockstep_every_n_images": st.lockstep_n, "image_reliability": "reliable", "tasks": "plan",
                 "debug.publish_image": False, "debug.publish_markers": False, "publish_odom_frame_path": False,
                 **st.planner_parameters},
                [f"{planner}/input/{key}:={topics[key]}" for key in ("image", "camera_info", "odometry", "route")])
    if name == CONTROLLER_NODE:
        return ({"role_name": st.role, "use_sim_time": True, "control_consumer": "vehicle_control",
                 "route.publish_command": st.command_source == "route", "pacing_every_n_ticks": st.lockstep_n,
                 "pacing": st.pacing, **st.gain_parameters}, [])
    return {"role_name": st.role, "use_sim_time": True}, []


def launched_nodes(st: RosLoopSettings, folder: str) -> dict[str, Any]:
    """bridge: the nodes launch/leaderboard.launch.py starts for the agent's arguments, by name (ResolvedNode),
    with the demo car's gains in the controller's parameter file and the planner options in the planner's
    (both written into ``folder``); {} without the bridge."""
    if not st.bridge:
        return {}
    planner = dict(st.planner_parameters)
    device = planner.pop("device", None)
    files = {"planner_params_file": planner, "controller_params_file": {"pacing": st.pacing, **st.gain_parameters}}
    for argument, values in files.items():
        files[argument] = os.path.join(folder, f"{argument}.yaml")
        with open(files[argument], "w") as f:
            yaml.safe_dump({"/**": {"ros__parameters": nested(values)}}, f)
    values = launch_values({**AGENT_ARGUMENTS, "model_path": st.model_path, "role_name": st.role,
                            "lockstep_n": str(st.lockstep_n), **({"device": device} if device else {}), **files})
    return {n.spec.name: n for n in resolve_nodes(values)}


def node_arguments(name: str, st: RosLoopSettings, launched: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of node ``name``: this loop's parameters and remappings, or, bridge (``launched``),
    the launch file's parameters, parameter file and remappings."""
    parameters, remaps = loop_arguments(name, st)
    params_file = None
    if launched:
        node = launched[name]
        parameters, params_file = node.parameters, node.params_file
        remaps = [f"{source}:={target}" for source, target in node.remappings]
    return {"parameter_overrides": [Parameter(k, value=v) for k, v in parameters.items()],
            "cli_args": ["--ros-args", *(["--params-file", params_file] if params_file else []),
                         *[a for r in remaps for a in ("-r", r)]],
            "use_global_arguments": False}

