"""The localization node's parameters (``wam-diff2-localization``): one table of specs (the node declares them,
docs/carla.md's table is generated from them); ``filter.*`` derive from ``LocalizationSettings``.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..localization.georeference import GeoReference
from ..localization.odometry_filter import LocalizationSettings
from ..topics import (DEFAULT_GNSS, DEFAULT_IMU, DEFAULT_ROLE, DEFAULT_SPEEDOMETER, LOCALIZATION_NODE, carla_namespace,
                      localization_topics)
from .spec import LIVE, START, ParamSpec, by_name, defaults, field_specs

NODE = LOCALIZATION_NODE
# What the speedometer topic carries: the Leaderboard 2.0 bridge's type (header + float64 speed), or
# a bare Float32 (m/s) as some older bridges and recordings have it.
SPEEDOMETER_TYPES = ("carla_msgs/CarlaSpeedometer", "std_msgs/Float32")
FILTER_PREFIX = "filter."
# the sensor topics with their parameters' names in place of the values, for the descriptions
_SENSOR_TOPICS = localization_topics("<role_name>", "<gnss_id>", "<imu_id>", "<speedometer_id>")
SPECS: tuple[ParamSpec, ...] = (
    ParamSpec("role_name", DEFAULT_ROLE, f"CARLA ego role name: topics {carla_namespace('<role_name>')}/...", START),
    ParamSpec("gnss_id", DEFAULT_GNSS, f"GNSS sensor id: sensor_msgs/NavSatFix on {_SENSOR_TOPICS['gnss']}", START),
    ParamSpec("imu_id", DEFAULT_IMU, f"IMU sensor id: sensor_msgs/Imu on {_SENSOR_TOPICS['imu']}", START),
    ParamSpec("speedometer_id", DEFAULT_SPEEDOMETER,
              f"speedometer id: the speed (m/s) on {_SENSOR_TOPICS['speedometer']}", START),
    ParamSpec("speedometer_type", SPEEDOMETER_TYPES[0], "message type on the speedometer topic: the Leaderboard 2.0 "
              "bridge's carla_msgs/CarlaSpeedometer (field speed), or std_msgs/Float32 (field data); a publisher "
              "of another type on the topic is an ERROR on /diagnostics", START, choices=SPEEDOMETER_TYPES),
    ParamSpec("map_frame_id", "map", "header.frame_id of the odometry (the map frame of the bridge and the route)",
              START),
    ParamSpec("child_frame_id", "", "child_frame_id of the odometry; empty = the role name (as the bridge)", START),
    ParamSpec("publish_tf", False, "also publish each odometry's pose as the transform map_frame_id -> "
              "child_frame_id (tf2_msgs/TFMessage on /tf, as tf2_ros's broadcaster does): where nothing else does, "
              "as on the Leaderboard 2.0 bridge; off where carla-ros-bridge publishes its own /tf", START),
    ParamSpec("geo.lat_ref_deg", GeoReference().lat_deg, "latitude of the map origin (the town's OpenDRIVE "
              "geoReference; CARLA's default where it names none; degrees); a change restarts the filter (the "
              "agent sets the route's own before the first tick)", LIVE, low=-85.0, high=85.0),
    ParamSpec("geo.lon_ref_deg", GeoReference().lon_deg, "longitude of the map origin (degrees)", LIVE,
              low=-180.0, high=180.0),
    ParamSpec("route_start_max_distance_m", 50.0, "a first GNSS fix farther than this from the route's first point "
              "(CarlaRoute on global_plan, or the Path route) is an ERROR on /diagnostics: a wrong georeference "
              "(metres)", START, low=1.0, high=1e7),
    ParamSpec("sensor_timeout_s", 0.5, "a sensor (GNSS, IMU, speedometer) whose newest message is this much older "
              "than the newest of any sensor is reported stale on /diagnostics (WARN; seconds of stamp time)", LIVE,
              low=0.01, high=3600.0),
    ParamSpec("diagnostics_period_s", 1.0, "period of /diagnostics messages (wall seconds)", START,
              low=0.05, high=60.0),
) + field_specs(FILTER_PREFIX, LocalizationSettings)
SPECS_BY_NAME = by_name(SPECS)
DEFAULTS = defaults(SPECS)


def filter_settings(values: dict[str, Any]) -> LocalizationSettings:
    return LocalizationSettings(**{f.name: float(values[FILTER_PREFIX + f.name]) for f in fields(LocalizationSettings)})
