"""The controller node's parameters (``wam-diff2-controller``): one table of specs, from which the node's
declarations, ``config/controller.yaml`` and the table in docs/carla.md come; ``control.*`` derive from
:class:`~wam_diff2_core.control.ControllerGains`, ``route.*`` from :class:`~wam_diff2_core.routes.RouteTrackerSettings`.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..control import ControllerGains
from ..outputs.prompts import WAYPOINT_DT_S
from ..routes import RouteTrackerSettings
from ..topics import CONTROLLER_NODE, DEFAULT_ROLE, PLANNER_NODE, carla_namespace, controller_topics
from .planner import DEFAULTS as PLANNER_DEFAULTS
from .spec import START, ParamError, ParamSpec, by_name, check_values, defaults, field_specs, settings_from

NODE = CONTROLLER_NODE
TICK_SOURCES = ("odometry", "clock")
CONTROL_CONSUMERS = ("carla", "vehicle_control")
PACINGS = ("hold", "newest")

GAINS_PREFIX, ROUTE_PREFIX = "control.", "route."

SPECS: tuple[ParamSpec, ...] = (
    ParamSpec("role_name", DEFAULT_ROLE, f"CARLA ego role name: topics {carla_namespace('<role_name>')}/...", START),
    ParamSpec("planner_name", PLANNER_NODE, "the planner node's name: topics /<planner_name>/...", START),
    ParamSpec("tick_source", "odometry", "odometry: one control per odometry message, stamped like it; clock: one "
              "per /clock message, with the newest odometry", START, choices=TICK_SOURCES),
    ParamSpec("control_consumer", "carla", "what applies the control: carla = carla_msgs/CarlaEgoVehicleControl on "
              f"{controller_topics('<role_name>')['carla_control']} (needs carla_msgs; without it no READY and an ERROR "
              "diagnostic); vehicle_control = this package's VehicleControl on ~/output/control (the demo world)",
              START, choices=CONTROL_CONSUMERS),
    ParamSpec("diagnostics_period_s", 1.0, "period of /diagnostics messages (wall seconds)", START,
              low=0.05, high=60.0),
    ParamSpec("ego_frame_id", "", "header.frame_id of the controls; empty = the odometry's child_frame_id"),
    ParamSpec("odometry_timeout_s", 0.25, "tick_source clock: brake when the newest odometry is older than this "
              "(sim seconds)", low=0.001, high=3600.0),
    ParamSpec("plan_deadline_s", WAYPOINT_DT_S, "a plan arriving more than this after its image stamp (sim time) "
              "counts as late (lockstep N x tick period; 10 x 50 ms = 0.5 s)", low=0.0, high=3600.0),
    # hold by default: a benchmark's score should measure the model, not the GPU it ran on, and reproduce
    # across machines; holding stays inside the leaderboard's own rule (a control within 1.0 s per tick)
    ParamSpec("pacing", "hold", "hold: on the tick after each planning frame (every pacing_every_n_ticks-th tick "
              "from the first, as the lockstep planner plans on every N-th image), hold that tick's control until "
              "the plan for that frame arrives, at most pacing_max_hold_wall_s, then brake and count "
              "(pacing_timeouts; only while the planner is READY): driving does not depend on how fast the planner "
              "decodes within the bound; newest: answer every tick at once with the newest plan (a slow planner's "
              "plans arrive late and go stale)", START, choices=PACINGS),
    ParamSpec("pacing_every_n_ticks", PLANNER_DEFAULTS["lockstep_every_n_images"], "pacing hold: the planning "
              "frames are every N-th tick from the first (the planner's lockstep_every_n_images; one image per tick)",
              START, low=1, high=100000),
    ParamSpec("pacing_max_hold_wall_s", 0.8, "pacing hold: the longest a control is held for its plan (wall "
              "seconds; below the leaderboard's 1.0 s wait, leaving room for the delivery)", START, low=0.0, high=0.95),
    ParamSpec("tick_deadline_wall_s", 1.0, "a tick whose control took longer than this (wall) counts as a missed "
              "deadline (the leaderboard waits 1.0 s)", low=0.0, high=3600.0),
) + field_specs(GAINS_PREFIX, ControllerGains) + (
    ParamSpec("route.publish_command", True, "track the route (Path or CarlaRoute) and publish its command to "
              "/<planner_name>/input/command every tick", START),
) + field_specs(ROUTE_PREFIX, RouteTrackerSettings)
SPECS_BY_NAME = by_name(SPECS)
DEFAULTS = defaults(SPECS)


def validate_values(values: Mapping[str, Any]) -> list[ParamError]:
    """Problems with a set of parameter values, each naming its parameter."""
    return check_values(SPECS, values)


def gains_from(values: Mapping[str, Any]) -> ControllerGains:
    return settings_from(ControllerGains, values, GAINS_PREFIX)


def route_settings_from(values: Mapping[str, Any]) -> RouteTrackerSettings:
    return settings_from(RouteTrackerSettings, values, ROUTE_PREFIX)
