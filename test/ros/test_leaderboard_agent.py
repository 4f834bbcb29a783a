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

import pytest

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.config import ConfigError
from wam_diff2_core.localization.georeference import GeoReference
from wam_diff2_core.sim.camera import CameraSettings
from wam_diff2_core.params import leaderboard as leaderboard_params
from wam_diff2_core.params import localization as localization_params

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
    """The class get_entry_point() names."""
    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_entry_point")
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ast.literal_eval(entry.body[0].value))


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
    assert methods == {"__init__": ["self", "carla_host", "carla_port", "debug"], "get_ros_entrypoint": ["self"],
                       "setup": ["self", "path_to_conf_file"], "sensors": ["self"],
                       "run_step": ["self", "input_data", "timestamp"], "destroy": ["self"],
                       "set_global_plan": ["self", "global_plan_gps", "global_plan_world_coord"]}
    assert "--ros-version" not in AGENT.read_text()            # the evaluator has no such option


@pytest.fixture
def agent_module(monkeypatch):
    """The agent imported with stand-ins for the two leaderboard modules it imports (this test only)."""
    class Track(enum.Enum):                                      # leaderboard.autoagents.autonomous_agent.Track
        SENSORS = "SENSORS"
        MAP = "MAP"

    class ROS2Agent:                                             # its constructor asks for the entry point first
        on_init = None                                           # a test's stand-in of what follows (the wait)

        def __init__(self, carla_host, carla_port, debug=False):
            self.track = Track.SENSORS
            self.entrypoint = self.get_ros_entrypoint()
            self.destroyed = False
            if ROS2Agent.on_init is not None:
                ROS2Agent.on_init(self)

        def run_step(self, _, timestamp):                       # ROSBaseAgent's: the tick's control
            return f"control at {timestamp}"

        def destroy(self):
            self.destroyed = True

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
    for name in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "TEAM_CONFIG", "SAVE_PATH"):
        monkeypatch.delenv(name, raising=False)                  # the agent sets the first two: restored after
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
    # the planner's debug-image camera is the sensor's, in its ego frame (the rear axle, 1.4 m behind the centre)
    camera = sensor_by_type(agent)["sensor.camera.rgb"]
    assert float(params["camera_x_m"]) == pytest.approx(camera["x"] + 1.4)
    assert (float(params["camera_z_m"]), float(params["camera_fov_deg"])) == (camera["z"], camera["fov"])
    # the leaderboard passes parameters as `key:=value` words: nothing may need quoting
    assert all(" " not in str(v) for v in params.values())
    monkeypatch.setenv("WAM_DIFF2_MODEL_PATH", str(ROOT / "no-such-model"))
    with pytest.raises(FileNotFoundError, match="WAM_DIFF2_MODEL_PATH: .*no-such-model' is not a checkpoint"):
        getattr(agent_module, agent_module.get_entry_point())("localhost", 2000)


def sensor_by_type(agent) -> dict:
    return {s["type"]: s for s in agent.sensors()}


def test_the_camera_is_the_checkpoints_rig_or_a_named_preset_checked_before_the_bridge(agent_module, monkeypatch,
                                                                                      tiny_checkpoint):
    """A checkpoint without a camera block (the tiny one) needs WAM_DIFF2_CAMERA: refused before anything
    starts without it; with b2d the sensor is Bench2Drive's front camera, and the planner is told the same."""
    monkeypatch.setenv("WAM_DIFF2_MODEL_PATH", str(tiny_checkpoint))
    monkeypatch.delenv("WAM_DIFF2_CAMERA", raising=False)
    agent_class = getattr(agent_module, agent_module.get_entry_point())
    with pytest.raises(ConfigError, match="no camera block.*WAM_DIFF2_CAMERA"):
        agent_class("localhost", 2000)
    monkeypatch.setenv("WAM_DIFF2_CAMERA", "b2d")
    agent = agent_class("localhost", 2000)
    camera = sensor_by_type(agent)["sensor.camera.rgb"]
    assert (camera["width"], camera["height"], camera["fov"], camera["x"], camera["z"]) == (1600, 900, 70.0, 0.8, 1.6)
    assert agent.entrypoint["parameters"]["camera_fov_deg"] == "70.0"
    monkeypatch.setenv("WAM_DIFF2_CAMERA", "navsim-typo")
    with pytest.raises(ConfigError, match="camera preset 'navsim-typo' is not one of b2d, demo"):
        agent_class("localhost", 2000)


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
                      "geo.lat_ref_deg": 42.0, "geo.lon_ref_deg": 2.0, "publish_tf": True}
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
    pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")
    from test.support.ros_helpers import ros_context as context_on_domain

    with context_on_domain(8) as context:
        yield context


def spinning(context, *nodes):
    from rclpy.executors import MultiThreadedExecutor
    from test.support.ros_helpers import spin_in_thread

    return spin_in_thread(context, *nodes, executor_type=MultiThreadedExecutor)


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


# ----------------------------------------------------------------------------- the Bench2Drive harness
def test_each_evaluator_port_gets_its_own_ros_domain_on_localhost(agent_module, monkeypatch):
    ports = [30000 + 150 * i for i in range(8)]                  # Bench2Drive's 8 evaluators on one host
    domains = [leaderboard_params.evaluator_domain_id(p) for p in ports]
    assert len(set(domains)) == 8 and all(1 <= d <= 101 for d in domains)
    # a busy port moves the evaluator up by a few: it keeps its block's domain
    assert [leaderboard_params.evaluator_domain_id(p + 3) for p in ports] == domains
    for bad in (0, -1, 70000, "2000", True):
        with pytest.raises(ValueError, match="carla_port"):
            leaderboard_params.evaluator_domain_id(bad)
    import os
    agent = getattr(agent_module, agent_module.get_entry_point())("localhost", 30150)
    assert os.environ["ROS_DOMAIN_ID"] == str(domains[1]) and os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert agent.entrypoint["parameters"]["model_path"] == str(ROOT / "models" / "wam-diff2-demo-b32")


def test_the_model_comes_from_the_environment_or_team_config_and_the_demo_only_when_asked(agent_module, tmp_path,
                                                                                        tiny_checkpoint, monkeypatch):
    rule = leaderboard_params.model_path_from
    assert rule({"WAM_DIFF2_MODEL_PATH": "/a", "TEAM_CONFIG": "/b"}, "/demo") == ("/a", "WAM_DIFF2_MODEL_PATH")
    assert rule({"TEAM_CONFIG": "/b"}, "/demo") == ("/b", "TEAM_CONFIG")
    assert rule({"TEAM_CONFIG": "/ckpt+route_0_Town12_save"}, "/demo") == ("/ckpt", "TEAM_CONFIG")   # B2D's form
    assert rule({"WAM_DIFF2_MODEL_PATH": "demo"}, "/demo") == ("/demo", "WAM_DIFF2_MODEL_PATH=demo")
    for environ in ({}, {"WAM_DIFF2_MODEL_PATH": " ", "TEAM_CONFIG": "+save"}):
        with pytest.raises(ValueError, match="no model: set WAM_DIFF2_MODEL_PATH .*TEAM_CONFIG.*=demo"):
            rule(environ, "/demo")
    # the checks the agent makes before anything starts, each naming the variable and the fault
    assert agent_module.model_path({"TEAM_CONFIG": f"{tiny_checkpoint}+save"}) == str(tiny_checkpoint)
    import ament_index_python.packages as ament
    monkeypatch.setattr(ament, "get_package_share_directory", lambda package: str(ROOT))   # the share's layout
    assert agent_module.model_path({"WAM_DIFF2_MODEL_PATH": "demo"}) == str(ROOT / "models" / "wam-diff2-demo-b32")
    with pytest.raises(FileNotFoundError, match="TEAM_CONFIG: '/nowhere' is not a checkpoint directory"):
        agent_module.model_path({"TEAM_CONFIG": "/nowhere"})
    with pytest.raises(ValueError, match="WAM_DIFF2_MODEL_PATH: .*config.json: missing"):
        agent_module.model_path({"WAM_DIFF2_MODEL_PATH": str(tmp_path)})
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="has no \\*.safetensors weights"):
        agent_module.model_path({"WAM_DIFF2_MODEL_PATH": str(weightless)})


def test_metric_info_json_is_written_per_step_as_bench2drive_reads_it(agent_module, monkeypatch, tmp_path):
    import json
    steps = iter(range(1000))

    def get_metric_info(self):                                   # Bench2Drive's AutonomousAgent has it
        k = next(steps)
        return {"acceleration": [k, 0.0, 0.0], "angular_velocity": [0.0, 0.0, 0.1], "forward_vector": [1.0, 0.0, 0.0],
                "right_vector": [0.0, 1.0, 0.0], "location": [k * 0.5, 2.0, 0.0], "rotation": [0.0, 0.0, 90.0]}

    cls = getattr(agent_module, agent_module.get_entry_point())
    plain = cls("localhost", 2000)
    plain.setup("config+route_7_save")                             # no SAVE_PATH: not under Bench2Drive
    assert plain.run_step({}, 0.05) == "control at 0.05" and plain._metrics is None
    monkeypatch.setenv("SAVE_PATH", str(tmp_path))
    monkeypatch.setattr(agent_module.ROS2Agent, "get_metric_info", get_metric_info, raising=False)
    monkeypatch.setattr(agent_module.ROS2Agent, "get_hero", lambda self: setattr(self, "hero_actor", "hero"),
                        raising=False)
    agent = cls("localhost", 2000)
    agent.setup(f"{ROOT / 'models' / 'wam-diff2-demo-b32'}+route_7_Town12_save")
    for k in range(150):
        assert agent.run_step({}, 0.05 * k) == f"control at {0.05 * k}"
    written = json.loads((tmp_path / "route_7_Town12_save" / "metric_info.json").read_text())
    assert len(written) == 100                                    # written every 100 steps while driving ...
    agent.destroy()                                               # ... and at the end of the route
    assert agent.destroyed
    written = json.loads((tmp_path / "route_7_Town12_save" / "metric_info.json").read_text())
    assert list(written) == [str(k) for k in range(150)] and written["149"]["location"] == [74.5, 2.0, 0.0]
    assert set(written["0"]) == {"acceleration", "angular_velocity", "forward_vector", "right_vector", "location",
                                 "rotation"}


@pytest.mark.ros
def test_a_planner_that_fails_to_configure_fails_the_agent_at_once_with_its_reason(agent_module, tiny_checkpoint,
                                                                                 tmp_path, monkeypatch):
    """The real planner node on a checkpoint whose weights are not safetensors at all (it passes the agent's
    checks): its configure fails, and the leaderboard's wait for /carla/hero/status (here: the base class's
    stand-in, waiting as the leaderboard does) is released; the constructor cleans up and raises the reason."""
    rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")
    import os
    import shutil
    import time
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from std_msgs.msg import Bool
    from test.support.ros_helpers import unique_domain_id
    from wam_diff2_ros.qos import LATCHED_QOS
    from wam_diff2_ros.planner.node import PlannerNode

    monkeypatch.setenv("WAM_DIFF2_CAMERA", "demo")               # the tiny checkpoint names no camera
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    domain = unique_domain_id(8) % 101 or 1
    port = (domain - 1) * 150 + 2                                 # the evaluator whose domain that is
    assert leaderboard_params.evaluator_domain_id(port) == domain
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    planner = PlannerNode(context=context, parameter_overrides=[Parameter("model_path", value=str(broken)),
                                                                 Parameter("device", value="cpu")])
    executor = MultiThreadedExecutor(context=context)
    executor.add_node(planner)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    waited = {}

    def leaderboard_wait(agent):                                   # ROS2Agent: wait_for_message on the status
        wait_context = rclpy.Context()
        rclpy.init(context=wait_context)                          # the domain the agent set in the environment
        node = rclpy.create_node("leaderboard_node", context=wait_context)
        got = []
        node.create_subscription(Bool, "/carla/hero/status", got.append, LATCHED_QOS)
        waiter = SingleThreadedExecutor(context=wait_context)
        waiter.add_node(node)
        t = time.monotonic()
        while not got and time.monotonic() - t < 60.0:
            waiter.spin_once(timeout_sec=0.1)
        waiter.shutdown()
        waited.update(seconds=time.monotonic() - t, messages=[m.data for m in got], domain=os.environ["ROS_DOMAIN_ID"])
        node.destroy_node()
        rclpy.shutdown(context=wait_context)

    agent_module.ROS2Agent.on_init = leaderboard_wait
    os.environ["WAM_DIFF2_MODEL_PATH"] = str(broken)              # restored by the fixture's monkeypatch
    try:
        with pytest.raises(RuntimeError, match="the planner failed to configure .*broken"):
            getattr(agent_module, agent_module.get_entry_point())("localhost", port)
    finally:
        agent_module.ROS2Agent.on_init = None
        executor.shutdown()
        spin.join(5.0)
        planner.destroy_node()
        rclpy.shutdown(context=context)
    assert waited["messages"] == [False] and waited["domain"] == str(domain) and waited["seconds"] < 30.0
