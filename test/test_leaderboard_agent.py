"""The Leaderboard 2.0 / Bench2Drive agent file (agents/wam_diff2_agent.py) and the launch file it starts.

The CARLA leaderboard cannot be installed here (it needs the ``carla`` Python API of a CARLA
server, scenario_runner and the carla-ros-bridge's messages, none of them on PyPI). So the agent
is checked three ways, none of which needs it: its source is parsed (ast) against the method
names and signatures of the leaderboard's ``ROS2Agent`` / ``AutonomousAgent``; it is imported with
a minimal stand-in of the two leaderboard modules it imports, put into ``sys.modules`` for these
tests only (monkeypatch), so its ``sensors()`` / ``setup()`` / ``get_ros_entrypoint()`` run and their
answers are checked against the leaderboard's sensor rules and this package's launch file; and the
launch file it names is checked with the repo's launch-file helpers (ast, as test_ros_params.py does).
"""
from __future__ import annotations

import ast
import enum
import importlib.util
import math
import sys
import threading
import types
from pathlib import Path

import pytest

from wam_diff2_core.localization import GeoReference
from wam_diff2_core.sim.camera import CameraSettings
from wam_diff2_core.params import leaderboard as leaderboard_params
from wam_diff2_core.params import localization as localization_params

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "agents" / "wam_diff2_agent.py"
LAUNCH = ROOT / "launch" / "leaderboard.launch.py"
# the leaderboard's rules (leaderboard/autoagents/agent_wrapper.py): allowed types, the keys each
# type's spec is read with, and the 3 m limit on a sensor's distance from the vehicle's centre
SENSOR_KEYS = {
    "sensor.camera.rgb": {"x", "y", "z", "roll", "pitch", "yaw", "width", "height", "fov"},
    "sensor.other.gnss": {"x", "y", "z"},
    "sensor.other.imu": {"x", "y", "z", "roll", "pitch", "yaw"},
    "sensor.speedometer": set(),
}
MAX_SENSOR_RADIUS_M = 3.0


def _agent_class(tree: ast.Module) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef))


def test_agent_source_has_the_ros2_agent_interface():
    tree = ast.parse(AGENT.read_text(), filename=str(AGENT))
    imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("leaderboard.autoagents.ros2_agent", "ROS2Agent") in imports
    assert ("leaderboard.autoagents.autonomous_agent", "Track") in imports
    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_entry_point")
    assert not entry.args.args                                   # the leaderboard calls it without arguments
    cls = _agent_class(tree)
    assert [ast.unparse(b) for b in cls.bases] == ["ROS2Agent"]
    assert ast.literal_eval(entry.body[0].value) == cls.name
    methods = {n.name: [a.arg for a in n.args.args] for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert methods == {"get_ros_entrypoint": ["self"], "setup": ["self", "path_to_conf_file"], "sensors": ["self"],
                       "set_global_plan": ["self", "global_plan_gps", "global_plan_world_coord"]}
    assert "--ros-version" not in AGENT.read_text()            # the evaluator has no such option


@pytest.fixture
def agent_module(monkeypatch):
    """The agent imported with stand-ins for the two leaderboard modules it imports (this test only)."""
    class Track(enum.Enum):                                      # leaderboard.autoagents.autonomous_agent.Track
        SENSORS = "SENSORS"
        MAP = "MAP"

    class ROS2Agent:                                             # its constructor asks for the entry point first
        def __init__(self, carla_host, carla_port, debug=False):
            self.track = Track.SENSORS
            self.entrypoint = self.get_ros_entrypoint()

        def get_ros_entrypoint(self):
            raise NotImplementedError

        def set_global_plan(self, global_plan_gps, global_plan_world_coord):   # AutonomousAgent's keeps them
            self._global_plan, self._global_plan_world_coord = global_plan_gps, global_plan_world_coord

    modules = {"leaderboard": types.ModuleType("leaderboard"),
               "leaderboard.autoagents": types.ModuleType("leaderboard.autoagents"),
               "leaderboard.autoagents.autonomous_agent": types.ModuleType("leaderboard.autoagents.autonomous_agent"),
               "leaderboard.autoagents.ros2_agent": types.ModuleType("leaderboard.autoagents.ros2_agent")}
    modules["leaderboard.autoagents.autonomous_agent"].Track = Track
    modules["leaderboard.autoagents.ros2_agent"].ROS2Agent = ROS2Agent
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("WAM_DIFF2_MODEL_PATH", str(ROOT / "models" / "wam-diff2-demo-b32"))
    spec = importlib.util.spec_from_file_location("wam_diff2_agent", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_declares_the_sensors_track_and_valid_sensors(agent_module):
    agent = getattr(agent_module, agent_module.get_entry_point())("localhost", 2000)
    assert isinstance(agent, agent_module.ROS2Agent)
    agent.setup("unused.yaml")
    assert agent.track is agent_module.Track.SENSORS
    sensors = agent.sensors()
    ids = [s["id"] for s in sensors]
    assert len(ids) == len(set(ids)), "duplicate sensor ids"
    by_type = {s["type"]: s for s in sensors}
    assert set(by_type) == set(SENSOR_KEYS), "front camera, GNSS, IMU, speedometer (SENSORS track: no map)"
    for s in sensors:
        assert SENSOR_KEYS[s["type"]] <= set(s), f"{s['id']}: missing {SENSOR_KEYS[s['type']] - set(s)}"
        if "x" in s:
            assert math.sqrt(s["x"] ** 2 + s["y"] ** 2 + s["z"] ** 2) <= MAX_SENSOR_RADIUS_M, s["id"]
    camera, trained = by_type["sensor.camera.rgb"], CameraSettings()
    assert (camera["width"], camera["height"], camera["fov"]) == (trained.width, trained.height,
                                                                 trained.horizontal_fov_deg) == (320, 180, 90.0)
    # the camera 1.7 m ahead of the rear axle, i.e. 0.3 m ahead of the demo car's centre; GNSS / IMU on the axle
    assert camera["x"] == pytest.approx(0.3) and camera["z"] == pytest.approx(1.6)
    assert by_type["sensor.other.gnss"]["x"] == by_type["sensor.other.imu"]["x"] == pytest.approx(-1.4)


def test_agent_starts_this_packages_leaderboard_launch_with_its_sensor_ids(agent_module, monkeypatch):
    agent = getattr(agent_module, agent_module.get_entry_point())("localhost", 2000)
    entry = agent.entrypoint
    assert entry["package"] == "wam_diff2_ros" and (ROOT / "launch" / entry["launch_file"]).is_file()
    params = entry["parameters"]
    assert set(params) <= set(leaderboard_params.ARGUMENTS_BY_NAME)
    assert params["role_name"] == "hero" and params["localization"] == "true"
    assert params["model_path"] == str(ROOT / "models" / "wam-diff2-demo-b32")
    sensor_ids = {s["type"]: s["id"] for s in agent.sensors()}
    assert (params["camera_id"], params["gnss_id"], params["imu_id"], params["speedometer_id"]) == (
        sensor_ids["sensor.camera.rgb"], sensor_ids["sensor.other.gnss"], sensor_ids["sensor.other.imu"],
        sensor_ids["sensor.speedometer"])
    # the leaderboard passes parameters as `key:=value` words: nothing may need quoting
    assert all(" " not in str(v) for v in params.values())
    monkeypatch.setenv("WAM_DIFF2_MODEL_PATH", str(ROOT / "no-such-model"))
    with pytest.raises(FileNotFoundError, match="WAM_DIFF2_MODEL_PATH"):
        agent.get_ros_entrypoint()


def test_the_launch_file_builds_every_node_from_the_stacks_one_table():
    """launch/leaderboard.launch.py declares ARGUMENTS and starts NODES (wam_diff2_core.params.leaderboard, which
    the demo world's --bridge loop starts too) and writes none of their parameters itself."""
    tree = ast.parse(LAUNCH.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "wam_diff2_core.params.leaderboard" for a in n.names}
    assert {"ARGUMENTS", "NODES", "Arg", "Product", "default_value"} <= imported
    keys = {k.value for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if isinstance(k, ast.Constant)}
    parameters = {name for node in leaderboard_params.NODES for name in node.parameters}
    assert not keys & parameters, "parameters written in the launch file"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and str(n.value).startswith("wam-diff2-")]


def test_leaderboard_launch_starts_the_localization_node_on_the_role_and_sensor_ids():
    values = leaderboard_params.launch_values({"model_path": "m", **leaderboard_params.AGENT_ARGUMENTS,
                                               "role_name": "ego", "gnss_id": "g", "imu_id": "i",
                                               "speedometer_id": "s"}, share="/share")
    nodes = {n.spec.executable: n for n in leaderboard_params.resolve_nodes(values)}
    params = nodes["wam-diff2-localization"].parameters
    assert set(params) - {"use_sim_time"} <= set(localization_params.SPECS_BY_NAME)
    assert params == {"role_name": "ego", "use_sim_time": True, "gnss_id": "g", "imu_id": "i", "speedometer_id": "s",
                      "geo.lat_ref_deg": 42.0, "geo.lon_ref_deg": 2.0}
    off = leaderboard_params.resolve_nodes({**values, "localization": "false"})
    assert {n.spec.executable for n in off} == {"wam-diff2-planner", "wam-diff2-controller"}
    assert '"wam-diff2-localization=wam_diff2_ros.entry_point:localization"' in (ROOT / "setup.py").read_text()
    script = ROOT / "scripts" / "ros2_run" / "wam-diff2-localization"
    assert script.stat().st_mode & 0o111 and "from wam_diff2_ros.entry_point import localization" in script.read_text()


# ----------------------------------------------------------------------------- the georeference
def leaderboard_plan(reference, carla_points):
    """The two plans the leaderboard hands ``set_global_plan``: GNSS dicts and carla.Transform-likes (CARLA's
    frame, y south), as CARLA's GNSS reads them under ``reference``. Only ``location`` of a Transform is read."""
    gps, world = [], []
    for x, y in carla_points:
        lat, lon = reference.to_geo(x, -y)                   # the map frame is CARLA's with y flipped
        gps.append(({"lat": lat, "lon": lon, "z": 0.0}, "LANEFOLLOW"))
        world.append((types.SimpleNamespace(location=types.SimpleNamespace(x=x, y=y, z=0.0)), "LANEFOLLOW"))
    return gps, world


@pytest.mark.parametrize("truth", [GeoReference(), GeoReference(49.0, 8.0)], ids=["carla-default", "own"])
def test_the_georeference_is_solved_from_the_plans_first_point(agent_module, truth):
    gps, world = leaderboard_plan(truth, [(152.3, -87.5), (160.0, -87.5)])
    solved = agent_module.georeference_from_plan(gps, world)
    assert (solved.lat_deg, solved.lon_deg) == pytest.approx((truth.lat_deg, truth.lon_deg), abs=1e-9)
    # the route's first point lands where the world plan has it (map frame: x, -y)
    assert solved.to_local(gps[0][0]["lat"], gps[0][0]["lon"]) == pytest.approx((152.3, 87.5), abs=1e-4)
    assert agent_module.georeference_from_plan([], world) is None


@pytest.fixture
def ros_context():
    rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")
    from ros_helpers import unique_domain_id

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=unique_domain_id(8))
    yield context
    rclpy.shutdown(context=context)


def spinning(context, *nodes):
    from rclpy.executors import MultiThreadedExecutor

    executor = MultiThreadedExecutor(context=context)
    for node in nodes:
        executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return executor, thread


@pytest.mark.ros
def test_the_agent_sets_the_routes_georeference_on_the_localization_node(agent_module, ros_context):
    """Over DDS: the agent's ros_node (spun by the leaderboard's base class in its own thread) sets the solved
    georeference on a running localization node through its set_parameters service."""
    from rclpy.node import Node

    from wam_diff2_ros.localization_node import LocalizationNode

    node = LocalizationNode(context=ros_context)
    assert (node.reference.lat_deg, node.reference.lon_deg) == (42.0, 2.0)
    agent = getattr(agent_module, agent_module.get_entry_point())("localhost", 2000)
    agent.ros_node = Node("leaderboard_node", context=ros_context)
    executor, thread = spinning(ros_context, node, agent.ros_node)
    try:
        truth = GeoReference(45.5, -73.6)                      # a town whose OpenDRIVE header names its own
        agent.set_global_plan(*leaderboard_plan(truth, [(10.0, 20.0), (30.0, 20.0)]))
        assert (node.reference.lat_deg, node.reference.lon_deg) == pytest.approx((45.5, -73.6), abs=1e-9)
        assert node.counts["georeference_changes"] == 1 and not node.ekf.has_position
        # a value the node refuses comes back as an error naming it
        from wam_diff2_ros.parameters import set_remote_parameters
        with pytest.raises(RuntimeError, match="refused .'geo.lat_ref_deg': 95.0"):
            set_remote_parameters(agent.ros_node, "wam_diff2_localization", {"geo.lat_ref_deg": 95.0})
        with pytest.raises(RuntimeError, match="/no_such_node/set_parameters_atomically did not appear"):
            set_remote_parameters(agent.ros_node, "no_such_node", {"geo.lat_ref_deg": 1.0}, timeout_s=0.5)
    finally:
        executor.shutdown()
        thread.join(5.0)
        node.destroy_node()
        agent.ros_node.destroy_node()
