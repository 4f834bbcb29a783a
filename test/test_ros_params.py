"""The planner's parameters against their single sources: declarations, YAML, README, launch files."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from wam_diff2_core.config import DECODING_FIELDS  # noqa: E402
from wam_diff2_core.params import planner as params  # noqa: E402
from wam_diff2_core.params.spec import markdown_table  # noqa: E402
from wam_diff2_ros.parameters import read_all  # noqa: E402
from wam_diff2_ros.planner_node import INPUT_TOPICS, PlannerNode  # noqa: E402
from ros_helpers import unique_domain_id  # noqa: E402

pytestmark = pytest.mark.ros
ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
BUILTIN = {"use_sim_time", "start_type_description_service"}   # declared by rclpy itself


@pytest.fixture(scope="module")
def context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=unique_domain_id(0))
    yield ctx
    rclpy.shutdown(context=ctx)


@pytest.fixture(scope="module")
def node(context):
    node = PlannerNode(context=context)          # never spun: its autostart timer does not fire
    yield node
    node.destroy_node()


@pytest.fixture(scope="module")
def declared(node) -> dict:
    names = set(node.list_parameters([], 10).names) - BUILTIN
    values = read_all(node, params.SPECS)                # None where declared unset
    return {n: values[n] if n in values else node.get_parameter(n).value for n in names}


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_declared_parameters_are_the_specs_with_their_defaults(declared):
    assert declared == params.DEFAULTS


def test_yaml_lists_every_declared_parameter_with_its_default(declared):
    doc = yaml.safe_load((ROOT / "config" / "planner.yaml").read_text())
    values = flatten(doc["/**"]["ros__parameters"])
    assert values == {n: v for n, v in declared.items() if v is not None}
    assert params.validate_values(values) == []


def _uncommented_decoding_block() -> dict:
    """config/planner.yaml's commented-out decoding block, as it reads once uncommented."""
    text = (ROOT / "config" / "planner.yaml").read_text()
    block = text[text.index("#   decoding:"):]
    lines = ["    " + line[1:] if line.startswith("#") else line for line in block.splitlines()]
    return yaml.safe_load("\n".join(lines))["decoding"]


def test_decoding_parameters_are_unset_so_the_checkpoint_decides(node, declared):
    """One precedence rule: a node parameter left unset takes the checkpoint's setting (config.py)."""
    decoding = {n: v for n, v in declared.items() if n.startswith(params.DECODING_PREFIX)}
    assert set(decoding) == {params.DECODING_PREFIX + n for n in DECODING_FIELDS}
    assert all(v is None for v in decoding.values())
    assert params.decoding_overrides(declared) == {}
    assert params.decoding_overrides({**declared, "decoding.block_size": 8}) == {"block_size": 8}


def test_decoding_parameters_derive_from_the_core_settings(node):
    yaml_decoding = _uncommented_decoding_block()
    assert set(yaml_decoding) == set(DECODING_FIELDS)
    for name, field in DECODING_FIELDS.items():
        full = params.DECODING_PREFIX + name
        assert yaml_decoding[name] == field.default
        descriptor = node.describe_parameter(full)
        assert descriptor.description == field.metadata["help"]
        low, high = field.metadata["low"], field.metadata["high"]
        if low is not None:
            rng = (descriptor.integer_range or descriptor.floating_point_range)[0]
            assert (rng.from_value, rng.to_value) == (low, high)
        if field.metadata["choices"]:
            assert all(c in descriptor.additional_constraints for c in field.metadata["choices"])


def test_descriptors_mark_ranges_units_and_read_only(node):
    assert node.describe_parameter("autostart").read_only
    assert node.describe_parameter("image_transport").read_only       # the subscription is made at start
    assert not node.describe_parameter("model_path").read_only      # settable while unconfigured
    assert "configure" in node.describe_parameter("model_path").additional_constraints
    assert node.describe_parameter("image_timeout_s").floating_point_range[0].from_value > 0
    assert node.describe_parameter("lockstep_every_n_images").integer_range[0].from_value == 1
    for spec in params.SPECS:
        assert node.describe_parameter(spec.name).description == spec.description
        if spec.kind is float and not spec.name.startswith(params.DECODING_PREFIX):
            # physical quantities carry their unit in the name
            assert re.search(r"_(s|m|deg|hz|ms|mps|mps2)$", spec.name), spec.name


def test_readme_parameter_table_matches_declared_parameters(declared):
    readme = (ROOT / "wam_diff2_ros" / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (`[^`]*`|unset: the checkpoint's) \|", readme, re.MULTILINE)
    assert [r[0] for r in rows] == [s.name for s in params.SPECS]
    assert set(r[0] for r in rows) == set(declared)
    assert markdown_table(params.SPECS) in readme      # regenerate with: python -m wam_diff2_core.params --write


@pytest.mark.parametrize("values, fragment", [
    ({"tasks": "everything"}, "tasks"),
    ({"mode": "fast"}, "mode"),
    ({"device": "gpu"}, "device"),
    ({"image.min_pixels": 4096, "image.max_pixels": 1024}, "image.min_pixels"),
    ({"decoding.block_size": 0}, "block_size"),
    ({"decoding.top_p": 0.0}, "top_p"),
    ({"decoding.remasking_strategy": "random"}, "remasking_strategy"),
    ({"tasks": "both", "detection_classes": []}, "detection_classes"),
    ({"image_timeout_s": "1"}, "image_timeout_s"),
    ({"camera.horizontal_fov_deg": 180.0}, "horizontal_fov_deg"),
])
def test_validation_names_the_offending_parameter(values, fragment):
    errors = params.validate_values({**params.DEFAULTS, **values})
    assert errors and all(fragment in str(e) for e in errors)


# ----------------------------------------------------------------------------- launch files
def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def _const_args(calls: list[ast.Call]) -> set[str]:
    return {c.args[0].value for c in calls if c.args and isinstance(c.args[0], ast.Constant)}


def test_the_launch_files_exist():
    assert {p.name for p in LAUNCH_FILES} == {"planner.launch.py", "carla_planner.launch.py", "bag_replay.launch.py",
                                             "leaderboard.launch.py"}


# leaderboard.launch.py builds its nodes from wam_diff2_core.params.leaderboard (test_controller_node.py)
@pytest.mark.parametrize("path", [p for p in LAUNCH_FILES if p.name != "leaderboard.launch.py"], ids=lambda p: p.name)
def test_launch_file_parses_and_sets_only_declared_parameters(path, declared):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    compile(tree, str(path), "exec")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    nodes = [n for n in _calls(tree, "LifecycleNode") + _calls(tree, "Node")   # the controller: test_controller_node
             if any(k.arg == "executable" and ast.literal_eval(k.value) == "wam-diff2-planner" for k in n.keywords)]
    assert len(nodes) == 1, "one planner per launch file"
    kwargs = {k.arg: k.value for k in nodes[0].keywords}
    assert ast.literal_eval(kwargs["package"]) == "wam_diff2_ros"
    assert ast.literal_eval(kwargs["executable"]) == "wam-diff2-planner"
    assert "namespace" in kwargs                                  # launch_ros' LifecycleNode requires it
    set_names = set()
    for item in kwargs["parameters"].elts:
        if isinstance(item, ast.Dict):
            set_names |= {ast.literal_eval(k) for k in item.keys}
    assert set_names, "the launch file should set at least model_path"
    unknown = set_names - set(declared) - BUILTIN
    assert not unknown, f"{path.name} sets undeclared parameter(s) {sorted(unknown)}"
    for remap in getattr(kwargs.get("remappings"), "elts", []):
        source_name = ast.literal_eval(remap.elts[0])
        assert source_name in INPUT_TOPICS.values(), f"{path.name} remaps unknown topic {source_name}"
    # every LaunchConfiguration refers to a declared launch argument
    used = _const_args(_calls(tree, "LaunchConfiguration"))
    declared_args = _const_args(_calls(tree, "DeclareLaunchArgument"))
    assert used <= declared_args, f"undeclared launch arguments {sorted(used - declared_args)}"


def test_carla_launch_remaps_onto_bridge_topics_with_the_role_name():
    tree = ast.parse((ROOT / "launch" / "carla_planner.launch.py").read_text())
    remaps = {}
    for node in _calls(tree, "LifecycleNode"):
        for kw in node.keywords:
            if kw.arg == "remappings":
                for remap in kw.value.elts:
                    remaps[ast.literal_eval(remap.elts[0])] = ast.unparse(remap.elts[1])
    assert remaps["~/input/odometry"] == "['/carla/', role, '/odometry']"
    assert remaps["~/input/route"] == "['/carla/', role, '/waypoints']"
    assert remaps["~/input/image"] == "['/carla/', role, '/', camera, '/image']"
    assert "role_name" in _const_args(_calls(tree, "DeclareLaunchArgument"))


def _node_parameters(tree: ast.AST) -> dict[str, str]:
    """{name: source of the value} of the dicts in the planner's parameters=[...]."""
    node = _calls(tree, "LifecycleNode")[0]
    items = next(k.value for k in node.keywords if k.arg == "parameters").elts
    return {ast.literal_eval(k): ast.unparse(v) for d in items if isinstance(d, ast.Dict)
            for k, v in zip(d.keys, d.values)}


@pytest.mark.parametrize("name", ["carla_planner.launch.py", "bag_replay.launch.py"])
def test_simulator_and_bag_launches_run_on_sim_time(name):
    assert _node_parameters(ast.parse((ROOT / "launch" / name).read_text()))["use_sim_time"] == "True"


def test_bag_launch_plays_with_clock():
    tree = ast.parse((ROOT / "launch" / "bag_replay.launch.py").read_text())
    play = _calls(tree, "ExecuteProcess")[0]
    cmd = [ast.unparse(e) for e in next(k.value for k in play.keywords if k.arg == "cmd").elts]
    assert cmd[:3] == ["'ros2'", "'bag'", "'play'"] and "'--clock'" in cmd


def test_ros2_run_script_and_console_entry_point():
    script = ROOT / "scripts" / "ros2_run" / "wam-diff2-planner"
    assert script.stat().st_mode & 0o111, "must be executable"
    assert "from wam_diff2_ros.entry_point import planner" in script.read_text()      # -> planner_node.main
    assert "wam-diff2-planner=wam_diff2_ros.entry_point:planner" in (ROOT / "setup.py").read_text()

