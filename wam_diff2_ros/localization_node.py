"""WAM-Diff2 localization: GNSS + IMU + speedometer -> nav_msgs/Odometry, for the leaderboard's SENSORS track.

    wam-diff2-localization --ros-args -p role_name:=hero -p use_sim_time:=true
    ros2 run wam_diff2_ros wam-diff2-localization --ros-args -p role_name:=hero -p geo.lat_ref_deg:=42.0
    ros2 launch wam_diff2_ros leaderboard.launch.py model_path:=/path/to/checkpoint     # with planner + controller

The SENSORS track allows GNSS, IMU and a speedometer but not the bridge's ground-truth odometry, while the
planner and the controller read ``nav_msgs/Odometry``: this node fills the gap with
:class:`wam_diff2_core.localization.odometry_filter.OdometryFilter` (an EKF over x, y, heading, speed).
Topics: :func:`wam_diff2_core.topics.localization_topics` of ``role_name`` and the sensor ids, named here by
their keys there. docs/carla.md (2. The agent: odometry on the leaderboard) describes it in full.

- In (sensor-data QoS): ``gnss`` (``sensor_msgs/NavSatFix``, metres with CARLA's projection around
  ``geo.lat_ref_deg`` / ``geo.lon_ref_deg``; any status but ``STATUS_NO_FIX`` is used, as the bridge never
  sets it), ``imu`` (``sensor_msgs/Imu``) and ``speedometer`` (``carla_msgs/CarlaSpeedometer`` or
  ``std_msgs/Float32``, by ``speedometer_type``: a parameter, since the bridge's publisher may be discovered
  only after the first ticks; a publisher of another type is an ERROR on ``/diagnostics``). The route
  (``global_plan`` / ``waypoints``, latched) only for the start check: a first fix farther than
  ``route_start_max_distance_m`` from its first point is an ERROR (a wrong georeference).
- Out: ``odometry`` (frame ``map_frame_id``, child ``child_frame_id`` or the role name, twist in the child
  frame), one per IMU message once the filter has a position, a heading and a speed, stamped like it; with
  ``publish_tf`` the same pose on ``/tf``.
- Hostile inputs: every message is checked before it touches the filter, a refused one counted per sensor
  and reason with a throttled WARN; fixes beyond ``filter.gnss_gate_sigma`` are refused (until
  ``filter.gnss_reacquire_s`` of them); a state that stops being finite is never published (the filter
  restarts and ``/diagnostics`` says why).
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
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Imu, NavSatFix, NavSatStatus
from std_msgs.msg import Float32

from wam_diff2_core.frame_inputs import NS_PER_S, stamp_ns
from wam_diff2_core.localization.georeference import GeoReference
from wam_diff2_core.localization.measurements import MeasurementRefused, heading_from_quaternion
from wam_diff2_core.localization.odometry_filter import LocalizationSettings, OdometryFilter
from wam_diff2_core.params.localization import FILTER_PREFIX, SPECS, SPECS_BY_NAME, SPEEDOMETER_TYPES, filter_settings
from wam_diff2_core.routes import route_from_msg
from wam_diff2_core.topics import LOCALIZATION_NODE, localization_topics

from .conversions import gnss_covariance, ns_to_stamp, odometry_message, transform_message, well_formed_stamp
from .diagnostics import (GATE_WARN_IN_ROW, LocalizationState, localization_diagnostic_status,
                          publish_periodically)
from .optional_msgs import CARLA_MSGS_ERROR, TF2_MSGS_ERROR, TFMessage, carla_msgs
from .parameters import declare_all, read_all
from .qos import BRIDGE_QOS, DEEP_RELIABLE_QOS, LATCHED_QOS
from .spinning import run_node

WARN_PERIOD_S = 5.0                # one WARN per sensor and refusal reason this often, at most


def ros_type_name(short: str) -> str:
    """``pkg/Type`` (a ``speedometer_type`` value) -> ``pkg/msg/Type`` as the ROS graph names it."""
    package, name = short.split("/")
    return f"{package}/msg/{name}"


def check_stamp(stamp) -> None:
    """Raises MeasurementRefused (``stamp``) for a malformed header stamp (nanosec not below a second)."""
    if not well_formed_stamp(stamp):
        raise MeasurementRefused("stamp", f"header.stamp.nanosec {stamp.nanosec} is not below 1e9")


class LocalizationNode(Node):
    def __init__(self, node_name: str = LOCALIZATION_NODE, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        # an override rclpy refuses keeps the node up: it publishes nothing and reports
        self._config_errors = list(declare_all(self, SPECS).values())
        values = read_all(self, SPECS)
        try:
            self.reference = GeoReference(values["geo.lat_ref_deg"], values["geo.lon_ref_deg"])
            settings = filter_settings(values)
        except ValueError as exc:                  # out of range was refused by rclpy already; this is the rest
            self._config_errors.append(str(exc))
            self.reference, settings = GeoReference(), LocalizationSettings()
        self._values = values
        self.ekf = OdometryFilter(settings)
        self.state = LocalizationState()
        self.counts = self.state.counts
        self._last_imu_ns: int | None = None           # stamp of the newest IMU sample used
        self._warned_at: dict[str, float] = {}         # WARN key -> steady time of its last WARN
        self._seen = {"restarts_non_finite": 0, "gnss_reacquired": 0}   # filter counts already logged
        self._published_ns: int | None = None          # stamp of the newest odometry published
        self._route_start: tuple[float, float] | None = None   # first point of the newest route (map frame)
        self._route_start_checked = True               # the first fix after a route arrives is checked
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

        self.topics = t = localization_topics(values["role_name"], values["gnss_id"], values["imu_id"],
                                              values["speedometer_id"])
        self.child_frame_id = values["child_frame_id"] or values["role_name"]
        self._odometry_pub = self.create_publisher(Odometry, t["odometry"], BRIDGE_QOS)    # as the bridge's odometry
        self._tf_pub = None
        if values["publish_tf"]:
            if TFMessage is None:
                self._config_errors.append(f"publish_tf: tf2_msgs is not importable ({TF2_MSGS_ERROR}); source a ROS "
                                           "install that has it (scripts/build_ros_interfaces.sh here)")
            else:
                self._tf_pub = self.create_publisher(TFMessage, t["tf"], DEEP_RELIABLE_QOS)
        self.create_subscription(NavSatFix, t["gnss"], self._on_gnss, qos_profile_sensor_data)
        self.create_subscription(Imu, t["imu"], self._on_imu, qos_profile_sensor_data)
        self.speedometer_type = values["speedometer_type"]
        if self.speedometer_type == SPEEDOMETER_TYPES[0]:
            if carla_msgs is None:
                self._config_errors.append(
                    f"speedometer_type {self.speedometer_type}: carla_msgs is not importable ({CARLA_MSGS_ERROR}); "
                    "source the workspace that has carla_msgs (the Leaderboard 2.0 bridge's), or set "
                    f"speedometer_type:={SPEEDOMETER_TYPES[1]} if the topic carries that")
            else:
                self.create_subscription(carla_msgs.CarlaSpeedometer, t["speedometer"], self._on_carla_speed,
                                         qos_profile_sensor_data)
        else:
            self.create_subscription(Float32, t["speedometer"], self._on_float_speed, qos_profile_sensor_data)
        self.create_subscription(Path, t["route"], self._on_route, LATCHED_QOS)
        if carla_msgs is not None:
            self.create_subscription(carla_msgs.CarlaRoute, t["carla_route"], self._on_route, LATCHED_QOS)
        self.publish_diagnostics = publish_periodically(self, t["diagnostics"], values["diagnostics_period_s"],
                                                        self.diagnostic_status)
        if self._config_errors:
            self.get_logger().error("bad parameters, publishing no odometry: " + "; ".join(self._config_errors))
        self.get_logger().info(f"localizing from {t['gnss']} + {t['imu']} + {t['speedometer']} -> {t['odometry']}")

    def _on_set_parameters(self, changed: list) -> SetParametersResult:
        proposed = {**self._values, **{p.name: p.value for p in changed if p.name in SPECS_BY_NAME}}
        try:
            filter_settings(proposed)
            GeoReference(proposed["geo.lat_ref_deg"], proposed["geo.lon_ref_deg"])
        except (ValueError, TypeError) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, changed: list) -> None:
        self._values.update({p.name: p.value for p in changed if p.name in SPECS_BY_NAME})
        if any(p.name.startswith(FILTER_PREFIX) for p in changed):
            self.ekf.settings = filter_settings(self._values)      # from the next measurement on
        reference = GeoReference(self._values["geo.lat_ref_deg"], self._values["geo.lon_ref_deg"])
        if reference != self.reference:          # positions so far are in the old frame: start again
            self.reference = reference
            self.ekf.reset()
            self.counts["georeference_changes"] += 1
            self._route_start_checked = self._route_start is None
            self.state.route_start_error = ""
            self.get_logger().info(f"georeference {reference.lat_deg:.9f} / {reference.lon_deg:.9f}: filter restarted")

    def _on_gnss(self, msg: NavSatFix) -> None:
        try:
            check_stamp(msg.header.stamp)
            if msg.status.status == NavSatStatus.STATUS_NO_FIX:     # STATUS_UNKNOWN (-2, the bridge's) is used
                raise MeasurementRefused("no_fix", "status STATUS_NO_FIX: the receiver has no fix")
            x, y = self.reference.to_local(msg.latitude, msg.longitude)
        except MeasurementRefused as exc:
            self._refused("gnss", exc)
            return
        stamp = stamp_ns(msg.header.stamp)
        used = self.ekf.gnss(stamp / NS_PER_S, x, y, gnss_covariance(msg))
        self._count("gnss", used)
        if used and not self._route_start_checked:
            self._check_route_start(x, y)
        if used and stamp == self._last_imu_ns:       # this tick's IMU came first, before the filter was ready
            self._publish(msg.header.stamp)

    def _on_carla_speed(self, msg) -> None:
        try:
            check_stamp(msg.header.stamp)
        except MeasurementRefused as exc:
            self._refused("speed", exc)
            return
        stamp = stamp_ns(msg.header.stamp)
        self._speed(stamp / NS_PER_S if stamp else None, float(msg.speed))

    def _on_float_speed(self, msg: Float32) -> None:
        self._speed(None, float(msg.data))             # no header: it belongs to the newest tick

    def _speed(self, t: float | None, speed: float) -> None:
        """A speed at ``t`` (seconds; None: the filter's newest time, the bridge publishing it per tick)."""
        if t is None:
            t = self.ekf.t if self.ekf.t is not None else self.get_clock().now().nanoseconds / NS_PER_S
        used = self.ekf.speed(t, speed)
        self._count("speed", used)
        if used and self._last_imu_ns is not None:    # this tick's IMU came first, before the filter was ready
            self._publish(ns_to_stamp(self._last_imu_ns))

    def _on_route(self, msg) -> None:
        try:
            points, _ = route_from_msg(msg)
        except ValueError:                             # an unknown road option: the controller reports it
            points = np.zeros((0, 2))
        if len(points) == 0 or not np.isfinite(points[0]).all():
            self.counts["routes_refused"] += 1
            return
        self._route_start = (float(points[0, 0]), float(points[0, 1]))
        self._route_start_checked = False
        self.counts["routes_received"] += 1

    def _check_route_start(self, x: float, y: float) -> None:
        self._route_start_checked = True
        d = math.hypot(x - self._route_start[0], y - self._route_start[1])
        self.state.route_start_distance_m = d
        limit = self._values["route_start_max_distance_m"]
        if d > limit:
            self.state.route_start_error = (
                f"the first GNSS fix is {d:.0f} m from the route's start (more than route_start_max_distance_m "
                f"{limit:g}): is the georeference right? geo.lat_ref_deg / geo.lon_ref_deg = "
                f"{self.reference.lat_deg:g} / {self.reference.lon_deg:g}")
            self.get_logger().error(self.state.route_start_error)
        else:
            self.state.route_start_error = ""

    def _on_imu(self, msg: Imu) -> None:
        q, cov = msg.orientation, msg.orientation_covariance
        # no orientation: REP-145's -1 in the covariance, or a zero quaternion (a message left at its default)
        has_orientation = cov[0] != -1.0 and (q.x, q.y, q.z, q.w) != (0.0, 0.0, 0.0, 0.0)
        try:
            check_stamp(msg.header.stamp)
            yaw = heading_from_quaternion(q.x, q.y, q.z, q.w) if has_orientation else None
        except MeasurementRefused as exc:
            self._refused("imu", exc)
            return
        yaw_var = float(cov[8]) if has_orientation and cov[8] != 0.0 else None    # 0: not filled in
        stamp = stamp_ns(msg.header.stamp)
        ok = self.ekf.imu(stamp / NS_PER_S, yaw, float(msg.angular_velocity.z), float(msg.linear_acceleration.x),
                          yaw_var)
        self._count("imu", ok)
        if ok:
            self._last_imu_ns = stamp
            self._publish(msg.header.stamp)

    def _publish(self, stamp) -> None:
        """The estimate at an IMU stamp, once per stamp, once the filter has a position and a heading."""
        ns = stamp_ns(stamp)
        if not self.ekf.ready or self._config_errors or (self._published_ns is not None and ns == self._published_ns):
            return
        odometry = odometry_message(self.ekf, stamp, self._values["map_frame_id"], self.child_frame_id)
        self._odometry_pub.publish(odometry)
        if self._tf_pub is not None:
            self._tf_pub.publish(transform_message(odometry))
            self.counts["tf_published"] += 1
        self._published_ns = ns
        self.counts["odometry_published"] += 1

    def _count(self, kind: str, used: bool) -> None:
        if used:
            self.counts[f"{kind}_used"] += 1
            t = self.ekf.t
            if self.state.used_s and t < max(self.state.used_s.values()) - self.ekf.settings.max_gap_s:
                self.state.used_s.clear()                   # time went back (a new run): ages start over
            self.state.used_s[kind] = t
            if self.ekf.ready:
                self.state.restart_note = ""
        else:
            self._refused(kind, self.ekf.refusal)
        self._log_filter_events()

    def _refused(self, kind: str, why: MeasurementRefused) -> None:
        self.counts[f"{kind}_refused"] += 1
        self.counts[f"{kind}_refused_{why.code}"] += 1
        if why.code == "gate":
            if self.ekf.gate_refused_in_row >= GATE_WARN_IN_ROW:
                self._warn("gnss_gate", f"GNSS fixes keep being refused by the innovation gate: {why} (the position "
                                        f"follows the fix after filter.gnss_reacquire_s "
                                        f"{self.ekf.settings.gnss_reacquire_s:g} s of them)")
        else:
            self._warn(f"{kind}_{why.code}", f"{kind} refused ({why.code}): {why}")

    def _log_filter_events(self) -> None:
        """A WARN for each non-finite restart and each re-acquisition after the gate, once."""
        counts = self.ekf.counts
        if counts["restarts_non_finite"] > self._seen["restarts_non_finite"]:
            self.state.restart_note = f"filter restarted: {self.ekf.last_restart}"
            self.get_logger().warning(f"{self.state.restart_note}; no odometry until it has a position, a heading and "
                                      "a speed again")
        if counts["gnss_reacquired"] > self._seen["gnss_reacquired"]:
            self.get_logger().warning(f"GNSS fixes refused by the gate for filter.gnss_reacquire_s "
                                      f"{self.ekf.settings.gnss_reacquire_s:g} s: the position follows the fix again "
                                      f"(re-acquisition {counts['gnss_reacquired']})")
        self._seen = {k: counts[k] for k in self._seen}

    def _warn(self, key: str, text: str) -> None:
        now = time.monotonic()
        if now - self._warned_at.get(key, -math.inf) >= WARN_PERIOD_S:
            self._warned_at[key] = now
            self.get_logger().warning(text)

    def diagnostic_status(self) -> DiagnosticStatus:
        return localization_diagnostic_status(self.get_name(), self.state, self.ekf, self._values, self._config_errors,
                                              self._speedometer_type_error())

    def _speedometer_type_error(self) -> str:
        """Non-empty when a publisher on the speedometer topic has another type than the one subscribed
        (nothing would ever arrive: the failure that left the car standing on the leaderboard)."""
        topic, wanted = self.topics["speedometer"], ros_type_name(self.speedometer_type)
        others = sorted({info.topic_type for info in self.get_publishers_info_by_topic(topic)} - {wanted})
        if not others:
            return ""
        fitting = [t for t in SPEEDOMETER_TYPES if ros_type_name(t) in others]
        advice = f"set speedometer_type:={fitting[0]}" if fitting else f"speedometer_type takes {SPEEDOMETER_TYPES}"
        return f"{topic} is published as {', '.join(others)}, not {wanted}: no speed arrives; {advice}"


def main(args: list[str] | None = None) -> int:
    run_node(LocalizationNode, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
