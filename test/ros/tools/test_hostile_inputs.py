"""Fuzz over real DDS: hostile sensor messages into the localization node, hostile odometry / plans /
planner states / routes into the controller node (wam_diff2_ros/tools/hostile_inputs.py: every field of
every input message random or adversarial, stamps going backwards, bursts, silence), a few hundred
messages each in CI; scripts/hostile_inputs.py runs 10,000 and prints the figures.

Each asserts no callback raised, no output non-finite or out of range, /diagnostics never OK with a
non-finite standard deviation, and that good inputs bring right outputs back.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from test.support import REPO_ROOT as REPO

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from wam_diff2_ros import conversions as conv  # noqa: E402
from wam_diff2_ros.optional_msgs import carla_msgs  # noqa: E402
from wam_diff2_ros.tools import hostile_messages as hm  # noqa: E402
from test.support.ros_helpers import unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
MESSAGES = 400


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """scripts/hostile_inputs.py at CI size, in its own process (message field checks on, as Humble's)."""
    out = tmp_path_factory.mktemp("hostile") / "reports.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ROS_PYTHON_CHECK_FIELDS", None)                  # the script turns them on
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "hostile_inputs.py"), "--messages", str(MESSAGES),
                           "--seed", "0", "--domain-id", str(unique_domain_id(4)), "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return {r["node"]: {**r, "exit": done.returncode, "stdout": done.stdout} for r in json.loads(out.read_text())}


def _no_problems(report: dict) -> None:
    assert report["exit"] == 0, report["stdout"]
    assert not report["crash"] and report["bad_outputs"] == 0 and report["bad_diagnostics"] == 0, report["stdout"]
    assert report["recovered"] and report["recovery_ticks"] is not None, report["recovery_detail"]
    assert report["messages"] >= MESSAGES and report["outputs"] > 0 and report["diagnostics"] > 0
    assert f"{report['node']}: {report['messages']} hostile messages (seed 0" in report["stdout"]


@pytest.mark.skipif(carla_msgs is None, reason="the bridge's speedometer type needs carla_msgs")
def test_localization_node_survives_hostile_sensors_and_recovers(reports):
    report = reports["localization"]
    _no_problems(report)
    # the hostile values reached the checks: refused for several reasons, none of them a non-finite state
    refused = report["refused"]
    assert {"gnss_refused_position", "gnss_refused_covariance", "gnss_refused_gate", "imu_refused_orientation",
            "imu_refused_rate", "speed_refused_speed"} <= set(refused), refused
    assert refused.get("filter_restarts_non_finite", 0) == 0


@pytest.mark.skipif(carla_msgs is None, reason="the fuzz publishes the leaderboard's types")
def test_controller_node_survives_hostile_inputs_and_recovers(reports):
    report = reports["controller"]
    _no_problems(report)
    refused = report["refused"]
    assert refused["fallback_invalid_odometry"] > 0 and refused["plans_invalid"] > 0, refused


def test_what_the_fuzz_found_in_the_controller_is_refused_as_invalid():
    """A finite but absurd position (1e308 m) reached the route tracker, whose geometry overflowed into
    a NaN progress and then an empty search window (ValueError in the tick); a plan whose last point
    was 2^31 s away was resampled onto a 0.5 s grid (28.6 GiB); a speed beyond float32 or a stamp with
    nanosec past a second at the end of int32 could not be put in the control message again (a
    ValueError where fields are checked, as on Humble). Each is now invalid input."""
    from builtin_interfaces.msg import Time

    from test.support.ros_helpers import odometry_msg
    from wam_diff2_ros.msg import Trajectory, TrajectoryPoint

    for fields in ({"x": 1e308}, {"y": -2e7}, {"vx": 1e300}, {"vx": 3e38, "vy": 3e38}):
        ego = conv.ego_from_odometry(odometry_msg(0, **fields))
        assert not ego.finite and math.isnan(ego.speed_mps), fields
    assert conv.ego_from_odometry(odometry_msg(0, x=9e6, y=-9e6, vx=999.0)).finite

    def plan(points, seconds):
        msg = Trajectory(valid=True)
        for (x, y), t in zip(points, seconds):
            point = TrajectoryPoint(x=x, y=y)
            point.time_from_start.sec = t
            msg.points.append(point)
        return conv.plan_from_trajectory(msg)

    assert plan([(1.0, 0.0), (2.0, 0.0)], [1, 2]).valid                      # resampled on the 0.5 s grid
    assert not plan([(1.0, 0.0), (2.0, 0.0)], [1, 2 ** 31 - 1]).valid        # 68 years ahead
    assert not plan([(1e308, 0.0), (2.0, 0.0)], [1, 2]).valid
    assert conv.well_formed_stamp(Time(sec=2 ** 31 - 1, nanosec=999_999_999))
    assert not conv.well_formed_stamp(Time(sec=2 ** 31 - 1, nanosec=2 ** 32 - 1))


def test_the_spoiler_reaches_every_kind_of_value():
    """The fuzz is only as good as its values: each special value, huge and tiny magnitudes, and
    the good value itself all come out of the float64 spoiler."""
    spoiler = hm.Spoiler(np.random.default_rng(0), field_p=1.0)
    values = [spoiler.f64(1.0) for _ in range(4000)]
    for special in hm.SPECIAL_F64:
        assert any(v == special and math.copysign(1, v) == math.copysign(1, special) or
                   (math.isnan(v) and math.isnan(special)) for v in values), special
    assert max(abs(v) for v in values if math.isfinite(v) and v not in hm.SPECIAL_F64) > 1e250
    assert min(abs(v) for v in values if v != 0.0 and v not in hm.SPECIAL_F64) < 1e-20
    assert hm.Spoiler(np.random.default_rng(0), field_p=0.0).f64(1.5) == 1.5
