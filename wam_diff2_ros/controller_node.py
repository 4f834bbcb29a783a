"""WAM-Diff2 controller: the newest plan + odometry -> vehicle control on every simulator tick.

    wam-diff2-controller --ros-args -p role_name:=hero -p use_sim_time:=true
    ros2 run wam_diff2_ros wam-diff2-controller --ros-args --params-file config/controller.yaml   # ROS install
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=/path/to/checkpoint              # with the planner

The fast half of the planner / controller split: CARLA's leaderboard wants a control for every tick within
1.0 s of wall time, stamped with that tick's sim time, while the planner is slow and, in lockstep mode, plans
on every N-th camera tick. Topics: :func:`wam_diff2_core.topics.controller_topics` of ``role_name`` and
``planner_name``, named here by their keys there. docs/carla.md (4. The controller) describes it in full,
with its ``/diagnostics`` and measurements.

- **Control every tick** (``tick_source``: each odometry message, or each ``/clock`` with the newest
  odometry; a repeated stamp is not answered again): :class:`wam_diff2_core.control.WaypointController` on
  the newest trajectory. A missing, invalid or stale plan, or unusable odometry, gives a full brake with the
  reason in the message: it never accelerates on an invalid plan.
- **Outputs**: ``VehicleControl`` on ``~/output/control`` and, for ``control_consumer`` carla (the default),
  ``carla_msgs/CarlaEgoVehicleControl`` on ``carla_control``; both stamped with the tick's sim time.
- **Leaderboard handshake**: once the planner's latched status says READY *and* the controller can publish
  what its consumer applies, a latched ``std_msgs/Bool`` True on ``leaderboard_status``, once (never False:
  the leaderboard's agent starts on any message). Without carla_msgs for carla: no READY, an ERROR.
- **Route -> command**: a ``nav_msgs/Path`` on ``route`` or a ``carla_msgs/CarlaRoute`` on ``carla_route``,
  tracked by :class:`wam_diff2_core.routes.RouteTracker`; the command to the planner each tick.
- **Pacing** (``hold``, the default): the tick after a planning frame is answered once that frame's plan has
  arrived (at most ``pacing_max_hold_wall_s``, then a brake), so scores measure the model whatever the GPU;
  ``newest`` answers at once with the newest plan.

Callbacks run on one thread (a SingleThreadedExecutor): the control math is a few hundred
microseconds, and one thread keeps "newest plan" and "this tick" consistent.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rosgraph_msgs.msg import Clock as ClockMsg
from std_msgs.msg import Bool, Header, String

from wam_diff2_core.control import Plan, WaypointController
from wam_diff2_core.frame_inputs import NS_PER_S, stamp_ns
from wam_diff2_core.geometry import TIME_RESET_S
from wam_diff2_core.params.controller import (GAINS_PREFIX, ROUTE_PREFIX, SPECS, SPECS_BY_NAME, gains_from,
                                              route_settings_from, validate_values)
from wam_diff2_core.routes import RouteTracker, route_from_msg
from wam_diff2_core.topics import CONTROLLER_NODE, controller_topics

from .conversions import MAX_COORDINATE_M, EgoOdometry, ego_from_odometry, msg_from, ns_to_stamp, \
    plan_from_trajectory, well_formed_stamp
from .diagnostics import ControllerState, controller_diagnostic_status, publish_periodically
from .msg import PlannerStatus, Trajectory, VehicleControl
from .optional_msgs import CARLA_MSGS_ERROR, carla_msgs
from .parameters import declare_all, read_all
from .qos import CLOCK_SUBSCRIPTION_QOS, LATCHED_QOS, LATEST_RELIABLE_QOS
from .spinning import run_node


def fallback_key(reason: str) -> str:
    """"stale plan (1.20 s old)" -> "stale_plan" (diagnostic counter names)."""
    return reason.split(" (")[0].strip().replace(" ", "_") or "none"


class ControllerNode(Node):
    def __init__(self, node_name: str = CONTROLLER_NODE, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        # an override rclpy refuses (wrong type, out of range) keeps the node up: it brakes and reports
        self._config_errors = list(declare_all(self, SPECS).values())
        self._values = values = read_all(self, SPECS)
        self._config_errors += [str(e) for e in validate_values(values)]
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

        self.topics = t = controller_topics(values["role_name"], values["planner_name"])
        self.controller = WaypointController(gains_from(self._usable(values)))
        self.route = RouteTracker(route_settings_from(self._usable(values)))
        self.state = ControllerState()
        self.counts = self.state.counts
        self._plan: Plan | None = None
        self.plan_stamp_ns: int | None = None       # stamp of the newest plan received (None: none yet)
        self._odometry: EgoOdometry | None = None
        self._tick_index = 0                      # ticks since the start (or a time reset): pacing's frame count
        self._held: tuple[int, int, float] | None = None   # pacing hold: (tick, planning frame, wall start)
        self._hold_timer = None

        # controls depth 1, reliable: the leaderboard's control subscriber's QoS
        self._control_pub = self.create_publisher(VehicleControl, t["control"], LATEST_RELIABLE_QOS)
        self._carla_pub = None
        self._consumer_error = ""       # why the consumer's control message cannot be published
        if values["control_consumer"] != "vehicle_control":      # carla (or a refused value: the strict case)
            if carla_msgs is not None:
                self._carla_pub = self.create_publisher(carla_msgs.CarlaEgoVehicleControl, t["carla_control"],
                                                        LATEST_RELIABLE_QOS)
            else:
                self._consumer_error = (f"cannot publish carla_msgs/CarlaEgoVehicleControl on {t['carla_control']}: "
                                        f"carla_msgs is not importable ({CARLA_MSGS_ERROR}); no READY on "
                                        f"{t['leaderboard_status']} (source the workspace that has carla_msgs, "
                                        "or control_consumer:=vehicle_control when ~/output/control is applied)")
        self._ready_pub = self.create_publisher(Bool, t["leaderboard_status"], LATCHED_QOS)
        self._command_pub = (self.create_publisher(String, t["command"], LATEST_RELIABLE_QOS)
                             if values["route.publish_command"] else None)

        self.create_subscription(Odometry, t["odometry"], self._on_odometry, qos_profile_sensor_data)
        self.create_subscription(Trajectory, t["trajectory"], self._on_trajectory, LATEST_RELIABLE_QOS)
        self.create_subscription(PlannerStatus, t["planner_status"], self._on_planner_status, LATCHED_QOS)
        if values["tick_source"] == "clock":
            self.create_subscription(ClockMsg, t["clock"], self._on_clock, CLOCK_SUBSCRIPTION_QOS)
        if values["route.publish_command"]:
            self.create_subscription(Path, t["route"], self._on_route, LATCHED_QOS)
            if carla_msgs is not None and hasattr(carla_msgs, "CarlaRoute"):
                self.create_subscription(carla_msgs.CarlaRoute, t["carla_route"], self._on_route, LATCHED_QOS)
        self.publish_diagnostics = publish_periodically(self, t["diagnostics"], values["diagnostics_period_s"],
                                                        self.diagnostic_status)
        if self._config_errors:
            self.get_logger().error("bad parameters, braking on every tick: " + "; ".join(self._config_errors))
        if self._consumer_error:
            self.get_logger().error(self._consumer_error)
        self.get_logger().info(f"controlling on {values['tick_source']} ticks: {t['odometry']} + {t['trajectory']} "
                               f"-> {self._control_pub.topic_name}"
                               + (f" and {t['carla_control']}" if self._carla_pub else ""))

    def _usable(self, values: dict) -> dict:
        """``values`` with the refused ones at their defaults."""
        bad = {e.split(":")[0] for e in self._config_errors}
        return {k: SPECS_BY_NAME[k].default if k in bad else v for k, v in values.items()}

    def _on_set_parameters(self, changed: list) -> SetParametersResult:
        proposed = {p.name: p.value for p in changed if p.name in SPECS_BY_NAME}
        errors = [str(e) for e in validate_values(proposed)]
        return SetParametersResult(successful=not errors, reason="; ".join(errors))

    def _after_set_parameters(self, changed: list) -> None:
        self._values = values = {**self._values, **{p.name: p.value for p in changed if p.name in SPECS_BY_NAME}}
        names = {p.name for p in changed}
        self._config_errors = [e for e in self._config_errors if e.split(":")[0] not in names]
        if any(n.startswith(GAINS_PREFIX) for n in names):
            self.controller = WaypointController(gains_from(self._usable(values)))   # PID state starts over
        if any(n.startswith(ROUTE_PREFIX) for n in names):
            self.route.settings = route_settings_from(self._usable(values))

    def _on_trajectory(self, msg: Trajectory) -> None:
        self.counts["plans_received"] += 1
        if not well_formed_stamp(msg.header.stamp):
            self.counts["plans_bad_stamp"] += 1
            return
        plan = plan_from_trajectory(msg)
        stamp = stamp_ns(msg.header.stamp)
        self.counts["plans_valid" if plan.valid else "plans_invalid"] += 1
        if self.plan_stamp_ns is not None and stamp <= self.plan_stamp_ns \
                and self.plan_stamp_ns - stamp <= TIME_RESET_S * NS_PER_S:
            self.counts["plans_out_of_order"] += 1
            return
        self._plan, self.plan_stamp_ns = plan, stamp
        if self.state.last_tick_ns is not None:
            age = (self.state.last_tick_ns - stamp) / NS_PER_S
            self.state.plan_ages_s.append(age)
            if age > self._values["plan_deadline_s"]:
                self.counts["plans_late"] += 1
        if self._held is not None and stamp >= self._held[1]:
            self._release()                        # the held tick's plan is here: answer it with that plan

    def _on_planner_status(self, msg: PlannerStatus) -> None:
        self.state.planner_state = int(msg.state)
        if msg.state == PlannerStatus.READY and not self.state.ready_sent and not self._consumer_error:
            self._ready_pub.publish(Bool(data=True))
            self.state.ready_sent = True
            self.get_logger().info(f"planner READY: published True on {self.topics['leaderboard_status']}")

    def _on_route(self, msg) -> None:
        try:
            points, options = route_from_msg(msg)
            if len(points) and np.abs(points).max() > MAX_COORDINATE_M:      # NaN: set_route names it
                raise ValueError(f"route has points beyond +-{MAX_COORDINATE_M:g} m")
            self.route.set_route(points, options)
        except ValueError as exc:
            self.counts["routes_refused"] += 1
            self.get_logger().warning(f"route refused, keeping the previous one: {exc}")
            return
        self.counts["routes_received"] += 1
        self.get_logger().info(f"route ({type(msg).__name__}): {len(self.route.points)} points, "
                               f"{self.route.length_m:.0f} m")

    def _on_odometry(self, msg: Odometry) -> None:
        if not well_formed_stamp(msg.header.stamp):          # no tick to answer: its stamp names none
            self.counts["odometry_bad_stamp"] += 1
            return
        self._odometry = odometry = ego_from_odometry(msg)
        if self._values["tick_source"] == "odometry":
            self._tick(odometry.stamp_ns)

    def _on_clock(self, msg: ClockMsg) -> None:
        if not well_formed_stamp(msg.clock):
            self.counts["clock_bad_stamp"] += 1
            return
        self._tick(stamp_ns(msg.clock))

    def _tick(self, tick_ns: int) -> None:
        last = self.state.last_tick_ns
        if last is not None and tick_ns <= last:
            if last - tick_ns <= TIME_RESET_S * NS_PER_S:
                self.counts["ticks_repeated"] += 1      # answered already: the leaderboard ignores repeats
                return
            self._restart()                            # time went back: a new run
            last = None
        if self._held is not None:                     # a new tick before the held one's plan: answer that first
            self.counts["pacing_overtaken"] += 1
            self._release()
        self.state.last_tick_ns = tick_ns
        index, self._tick_index = self._tick_index, self._tick_index + 1
        values = self._values
        if (values["pacing"] == "hold" and last is not None and (index - 1) % values["pacing_every_n_ticks"] == 0
                and self.state.planner_state == PlannerStatus.READY and not self._config_errors
                and (self.plan_stamp_ns is None or self.plan_stamp_ns < last)):
            # the tick after a planning frame (the previous tick) whose plan has not arrived: hold it
            self._held = (tick_ns, last, time.perf_counter())
            self.counts["pacing_holds"] += 1
            self._hold_timer = self.create_timer(values["pacing_max_hold_wall_s"], self._on_hold_timeout,
                                                 clock=Clock(clock_type=ClockType.STEADY_TIME))
            return
        self._answer(tick_ns)

    def _release(self, reason: str = "") -> None:
        """Answer the held tick: with the plan that arrived, or braking for ``reason``."""
        tick_ns, _, started = self._held
        self._held = None
        self.destroy_timer(self._hold_timer)
        self._hold_timer = None
        self.state.hold_wall_ms.append((time.perf_counter() - started) * 1e3)
        self._answer(tick_ns, reason)

    def _on_hold_timeout(self) -> None:
        if self._held is None:
            return
        self.counts["pacing_timeouts"] += 1
        frame_s = self._held[1] / NS_PER_S
        self._release(f"plan late (frame {frame_s:.2f} s: none within {self._values['pacing_max_hold_wall_s']} s)")

    def _answer(self, tick_ns: int, brake_reason: str = "") -> None:
        t_wall = time.perf_counter()
        values, odometry, now_s = self._values, self._odometry, tick_ns / NS_PER_S
        speed = math.nan
        if self._config_errors:
            control = self.controller.brake("bad parameters")
        elif odometry is None:
            control = self.controller.brake("no odometry")
        elif not odometry.finite:
            control = self.controller.brake("invalid odometry")
        elif (tick_ns - odometry.stamp_ns) / NS_PER_S > values["odometry_timeout_s"]:
            control = self.controller.brake(f"stale odometry ({(tick_ns - odometry.stamp_ns) / NS_PER_S:.2f} s old)")
        else:
            speed = odometry.speed_mps
            control = (self.controller.brake(brake_reason) if brake_reason
                       else self.controller.step(self._plan, odometry.pose, speed, now_s))
            if self._command_pub is not None:
                command = self.route.update((odometry.pose.x, odometry.pose.y), odometry.pose.yaw, now_s)
                if command is not None:
                    self._command_pub.publish(String(data=command))
                    if command != self.state.last_command:
                        self.counts["command_changes"] += 1
                    self.state.last_command = command
        self._publish(tick_ns, control, speed, odometry)
        self.counts["ticks"] += 1
        self.counts["controls_plan" if not control.reason else "controls_fallback"] += 1
        if control.reason:
            self.counts["fallback_" + fallback_key(control.reason)] += 1
        self.state.last_reason = control.reason or "following plan"
        wall_ms = (time.perf_counter() - t_wall) * 1e3
        self.state.tick_wall_ms.append(wall_ms)
        if wall_ms > values["tick_deadline_wall_s"] * 1e3:
            self.counts["ticks_wall_deadline_missed"] += 1

    def _restart(self) -> None:
        self.controller = WaypointController(self.controller.gains)
        self._plan = self.plan_stamp_ns = None
        self._tick_index = 0
        if self._held is not None:
            self.destroy_timer(self._hold_timer)
            self._held = self._hold_timer = None
        self.route.clear_progress()
        self.counts["time_resets"] += 1
        self.get_logger().warning(f"time went back by more than {TIME_RESET_S} s (a simulator restart): "
                                  "controller, plan and route progress start over")

    def _publish(self, tick_ns: int, control, speed: float, odometry: EgoOdometry | None) -> None:
        frame = self._values["ego_frame_id"] or (odometry.child_frame if odometry else "")
        header = Header(stamp=ns_to_stamp(tick_ns), frame_id=frame)
        plan_age = math.nan if self.plan_stamp_ns is None else (tick_ns - self.plan_stamp_ns) / NS_PER_S
        msg = msg_from(VehicleControl, control, header=header, plan_stamp=ns_to_stamp(self.plan_stamp_ns or 0),
                       source=VehicleControl.SOURCE_FALLBACK if control.reason else VehicleControl.SOURCE_PLAN,
                       plan_age_s=float(plan_age), speed_mps=float(speed))
        self._control_pub.publish(msg)
        if self._carla_pub is not None:
            self._carla_pub.publish(msg_from(carla_msgs.CarlaEgoVehicleControl, msg, header=header))

    def diagnostic_status(self) -> DiagnosticStatus:
        return controller_diagnostic_status(self.get_name(), self.state, self._values, self._config_errors,
                                            self._consumer_error, self.route.progress_m)


def main(args: list[str] | None = None) -> int:
    run_node(ControllerNode, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
