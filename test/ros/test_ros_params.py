"""The planner's parameters against their single sources: declarations, YAML, README, launch files."""
from __future__ import annotations

import ast
import re

import pytest
import yaml

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from wam_diff2_core.config import DECODING_FIELDS  # noqa: E402
from wam_diff2_core.params import planner as params  # noqa: E402
from wam_diff2_core.params.parameter_file import flatten  # noqa: E402
from wam_diff2_core.params.spec import markdown_table  # noqa: E402
from wam_diff2_ros.planner import launching  # noqa: E402
from wam_diff2_ros.parameters import read_all  # noqa: E402
from wam_diff2_ros.planner.interface import INPUT_TOPICS  # noqa: E402
from wam_diff2_ros.planner.node import PlannerNode  # noqa: E402
from test.support.ros_helpers import ros_context  # noqa: E402

pytestmark = pytest.mark.ros
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
BUILTIN = {"use_sim_time", "start_type_description_service"}   # declared by rclpy itself


@pytest.fixture(scope="module")
def context():
    with ros_context(0) as ctx:
        yield ctx


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
        if spec.kind is float and not spec.name.startswith(params.DECODING_PREFIX) \
                and not spec.name.endswith((".temperature", ".top_p")):
            # physical quantities carry their unit in the name (sampling settings, like decoding.*, have none)
            assert re.search(r"_(s|m|deg|hz|ms|mps|mps2)$", spec.name), spec.name


def test_an_unset_list_spec_is_a_string_array(context):
    """List specs are ROS string arrays (config.check_value); unset, rclpy's list() guess would be BYTE_ARRAY."""
    from rcl_interfaces.msg import ParameterType
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from wam_diff2_core.params.spec import ParamSpec
    from wam_diff2_ros.parameters import declare_all

    node = Node("unset_list_spec", context=context)
    try:
        assert declare_all(node, [ParamSpec("topics", None, "topics to take", type_=list)]) == {}
        assert node.describe_parameter("topics").type == ParameterType.PARAMETER_STRING_ARRAY
        assert node.set_parameters([Parameter("topics", value=["/a", "/b"])])[0].successful
        assert read_all(node, [ParamSpec("topics", None, "", type_=list)]) == {"topics": ["/a", "/b"]}
    finally:
        node.destroy_node()


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
# Launch files start the planner through wam_diff2_ros/planner/launching.py (planner_node: its one
# LifecycleNode; planner_parameters / two_planners: the parameters as data), leaderboard.launch.py
# still with its own LifecycleNode. launch / launch_ros are not installable here: the files are read
# with ast, the helper's data is called with plain values.
def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def _const_args(calls: list[ast.Call]) -> set[str]:
    return {c.args[0].value for c in calls if c.args and isinstance(c.args[0], ast.Constant)}


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _recorded(build) -> tuple[object, list[str]]:
    """What ``build(argument)`` returns with each launch argument's value being its name, and the names read."""
    names: list[str] = []
    return build(lambda name: names.append(name) or name), names


def _planners(tree: ast.AST) -> list[dict]:
    """Each planner a launch file starts: {"parameters": names set after params_file, "remaps": input names,
    "parameter_values": {name: source}, "arguments": launch arguments the helper reads for it}."""
    planners = []
    for node in _calls(tree, "LifecycleNode") + _calls(tree, "Node"):       # written out (leaderboard)
        if ast.literal_eval(_keyword(node, "executable")) != launching.EXECUTABLE:
            continue                                                       # the controller: test_controller_node
        assert ast.literal_eval(_keyword(node, "package")) == launching.PACKAGE
        assert _keyword(node, "namespace") is not None                    # launch_ros' LifecycleNode requires it
        values = {ast.literal_eval(k): ast.unparse(v) for d in _keyword(node, "parameters").elts
                  if isinstance(d, ast.Dict) for k, v in zip(d.keys, d.values)}
        remaps = [ast.literal_eval(r.elts[0]) for r in getattr(_keyword(node, "remappings"), "elts", [])]
        planners.append({"parameters": set(values), "parameter_values": values, "remaps": remaps, "arguments": []})
    for call in _calls(tree, "planner_node"):
        helper_reads = ["params_file"] + (["namespace"] if _keyword(call, "namespace") is None else [])
        parameters = call.args[0]
        if isinstance(parameters, ast.Call):                              # planner_parameters(launch_argument, {...})
            assert ast.unparse(parameters.func) == "planner_parameters"
            assert ast.unparse(parameters.args[0]) == "launch_argument"
            fixed = parameters.args[1] if len(parameters.args) > 1 else ast.Dict(keys=[], values=[])
            values = {**{n: f"launch_argument('{n}')" for n in launching.PARAMETER_ARGUMENTS},
                      **{ast.literal_eval(k): ast.unparse(v) for k, v in zip(fixed.keys, fixed.values)}}
            remappings, remap_reads = _keyword(call, "remappings"), []
            if isinstance(remappings, ast.Call):                          # bridge_remappings(launch_argument)
                data, remap_reads = _recorded(getattr(launching, ast.unparse(remappings.func)))
                remaps = [r[0] for r in data]
            else:
                remaps = [ast.literal_eval(r.elts[0]) for r in getattr(remappings, "elts", [])]
            planners.append({"parameters": set(values), "parameter_values": values, "remaps": remaps,
                             "arguments": helper_reads + list(launching.PARAMETER_ARGUMENTS) + remap_reads})
        else:                                                              # from two_planners(launch_argument)
            assert _calls(tree, "two_planners"), ast.unparse(call)
            data, reads = _recorded(launching.two_planners)
            for _, values, remaps in data:
                planners.append({"parameters": set(values), "parameter_values": values,
                                 "remaps": [r[0] for r in remaps], "arguments": helper_reads + reads})
    return planners


def _declared_arguments(tree: ast.AST) -> set[str]:
    declared = _const_args(_calls(tree, "DeclareLaunchArgument"))
    for call in _calls(tree, "DeclareLaunchArgument"):
        if ast.unparse(call.args[0]) == "f'{namespace}_model_path'":      # two_planners.launch.py, per planner
            declared |= {f"{namespace}_model_path" for namespace in launching.TWO_PLANNERS}
    for call in _calls(tree, "declare_planner_arguments"):
        names = _keyword(call, "names")
        declared |= set(ast.literal_eval(names) if names is not None else launching.ARGUMENT_DESCRIPTIONS)
    return declared


def test_the_launch_files_exist():
    assert {p.name for p in LAUNCH_FILES} == {"planner.launch.py", "carla_planner.launch.py", "bag_replay.launch.py",
                                             "leaderboard.launch.py", "two_planners.launch.py"}


def test_the_helper_holds_the_one_planner_node():
    source = (ROOT / "wam_diff2_ros" / "planner" / "launching.py").read_text()
    (node,) = _calls(ast.parse(source), "LifecycleNode")
    assert {"package", "executable", "name", "namespace", "parameters", "remappings"} <= {k.arg for k in node.keywords}
    assert (launching.PACKAGE, launching.EXECUTABLE) == ("wam_diff2_ros", "wam-diff2-planner")
    assert "wam-diff2-planner=wam_diff2_ros.entry_point:planner" in (ROOT / "setup.py").read_text()
    # launch / launch_ros only inside the functions that build launch actions
    module_level = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any((getattr(n, "module", None) or n.names[0].name).split(".")[0] in ("launch", "launch_ros")
                   for n in module_level)


def test_shared_argument_defaults_come_from_the_parameter_table_and_the_config():
    defaults = launching.argument_defaults("/share")
    assert set(defaults) == set(launching.ARGUMENT_DESCRIPTIONS)
    assert defaults["device"] == params.DEFAULTS["device"]
    assert defaults["image_reliability"] == params.DEFAULTS["image_reliability"]
    assert defaults["params_file"] == "/share/config/planner.yaml" and defaults["model_path"] is None
    assert defaults["namespace"] == ""
    for name in launching.PARAMETER_ARGUMENTS:
        assert name in params.SPECS_BY_NAME
    with pytest.raises(ValueError, match="image_reliability"):
        launching.argument_defaults("/share", image_reliability="sometimes")


# leaderboard.launch.py builds its nodes from wam_diff2_core.params.leaderboard (test_controller_node.py)
@pytest.mark.parametrize("path", [p for p in LAUNCH_FILES if p.name != "leaderboard.launch.py"], ids=lambda p: p.name)
def test_launch_file_parses_and_sets_only_declared_parameters(path, declared):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    compile(tree, str(path), "exec")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    planners = _planners(tree)
    assert len(planners) == (2 if path.name == "two_planners.launch.py" else 1)
    declared_args = _declared_arguments(tree)
    for planner in planners:
        assert "model_path" in planner["parameters"], "the launch file should set at least model_path"
        unknown = planner["parameters"] - set(declared) - BUILTIN
        assert not unknown, f"{path.name} sets undeclared parameter(s) {sorted(unknown)}"
        for source_name in planner["remaps"]:
            assert source_name in INPUT_TOPICS.values(), f"{path.name} remaps unknown topic {source_name}"
        # every launch argument read (here or by the helper) is declared
        used = (_const_args(_calls(tree, "LaunchConfiguration")) | _const_args(_calls(tree, "launch_argument"))
                | set(planner["arguments"]))
        assert used <= declared_args, f"undeclared launch arguments {sorted(used - declared_args)}"


@pytest.mark.parametrize("path", [p for p in LAUNCH_FILES if p.name != "leaderboard.launch.py"], ids=lambda p: p.name)
def test_launch_files_take_the_shared_planner_arguments(path):
    declared_args = _declared_arguments(ast.parse(path.read_text()))
    shared = {"device", "image_reliability", "params_file"}
    if path.name != "two_planners.launch.py":          # there: a namespace and a model argument per planner
        shared |= {"namespace", "model_path"}
    assert shared <= declared_args


def test_carla_launch_remaps_onto_bridge_topics_with_the_role_name():
    tree = ast.parse((ROOT / "launch" / "carla_planner.launch.py").read_text())
    (call,) = _calls(tree, "planner_node")
    assert ast.unparse(_keyword(call, "remappings")) == "bridge_remappings(launch_argument)"
    remaps = {key: "".join(parts) for key, parts in launching.bridge_remappings(lambda name: f"<{name}>")}
    assert remaps["~/input/odometry"] == "/carla/<role_name>/odometry"
    assert remaps["~/input/route"] == "/carla/<role_name>/waypoints"
    assert remaps["~/input/image"] == "/carla/<role_name>/<camera_id>/image"
    assert "role_name" in _const_args(_calls(tree, "DeclareLaunchArgument"))
    # the bridge publishes reliable: the default here (wam_diff2_ros/README.md, image QoS)
    (arguments,) = _calls(tree, "declare_planner_arguments")
    assert ast.literal_eval(_keyword(arguments, "image_reliability")) == "reliable"


def test_bridge_topic_parts_and_the_shell_printer_spell_the_bridge_names(capsys):
    from wam_diff2_core import topics
    role = object()                                       # a launch substitution
    assert topics.carla_topic_parts("image", role) == ("/carla/", role, "/rgb_front/image")
    assert topics.carla_topic_parts("route", "hero", role) == ("/carla/hero/waypoints",)
    assert topics.main(["carla", "odometry", "--role", "hero"]) == 0
    assert capsys.readouterr().out == "/carla/hero/odometry\n"
    topics.main(["carla"])
    assert "image /carla/ego_vehicle/rgb_front/image" in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit):
        topics.main(["carla", "no_such_topic"])
    assert "name: 'no_such_topic' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["carla_planner.launch.py", "bag_replay.launch.py"])
def test_simulator_and_bag_launches_run_on_sim_time(name):
    (planner,) = _planners(ast.parse((ROOT / "launch" / name).read_text()))
    assert planner["parameter_values"]["use_sim_time"] == "True"


def test_the_leaderboard_launchs_nodes_run_on_sim_time():
    """leaderboard.launch.py builds its nodes from wam_diff2_core.params.leaderboard (test_leaderboard_agent)."""
    from wam_diff2_core.params import leaderboard
    assert all(node.parameters["use_sim_time"] is True for node in leaderboard.NODES)


def test_two_planners_share_one_camera_in_their_own_namespaces():
    data, _ = _recorded(launching.two_planners)
    assert [namespace for namespace, _, _ in data] == list(launching.TWO_PLANNERS) == ["block32", "ar"]
    assert [values["model_path"] for _, values, _ in data] == ["block32_model_path", "ar_model_path"]
    assert data[0][2] == data[1][2] == [("~/input/image", "image_topic"), ("~/input/odometry", "odometry_topic")]
    assert data[0][1]["device"] == data[1][1]["device"] == "device"


def test_bag_launch_plays_with_clock():
    tree = ast.parse((ROOT / "launch" / "bag_replay.launch.py").read_text())
    play = _calls(tree, "ExecuteProcess")[0]
    cmd = [ast.unparse(e) for e in _keyword(play, "cmd").elts]
    assert cmd[:3] == ["'ros2'", "'bag'", "'play'"] and "'--clock'" in cmd


def test_ros2_run_script_and_console_entry_point():
    script = ROOT / "scripts" / "ros2_run" / "wam-diff2-planner"
    assert script.stat().st_mode & 0o111, "must be executable"
    assert "from wam_diff2_ros.entry_point import planner" in script.read_text()      # -> planner_node.main
    assert "wam-diff2-planner=wam_diff2_ros.entry_point:planner" in (ROOT / "setup.py").read_text()

