"""One parameter system: the nodes' ROS-free spec tables, the one validator, the generated files.

The planner's, the controller's and the localization node's parameters are tables in
``wam_diff2_core.params``; ``config/*.yaml`` and the README / docs tables are generated from them
(``python -m wam_diff2_core.params --write``), the JSON schemas in schema/ too, and the evaluator names the planner's parameters from
its table. (The nodes' declarations against the tables: test_ros_params.py, test_controller_node.py,
test_localization_node.py.)
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from test.support import REPO_ROOT as ROOT
from wam_diff2_core.params import controller, generated, localization, planner
from wam_diff2_core.params.parameter_file import flatten, nested
from wam_diff2_core.params.spec import ParamSpec, check_values, markdown_table, yaml_block

TABLES = {"planner": planner, "controller": controller, "localization": localization}


def test_the_checked_in_yaml_files_and_tables_match_the_spec_tables():
    assert generated.stale(ROOT) == []
    out = subprocess.run([sys.executable, "-m", "wam_diff2_core.params", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_tables_need_no_torch():
    """The controller and localization nodes, and eval-bag's --help, read the tables without the model code."""
    code = ("import sys; sys.modules['torch'] = None; "
            "import wam_diff2_core.params.planner, wam_diff2_core.params.controller, wam_diff2_core.params.localization")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_changed_default_shows_in_every_generated_file(tmp_path, monkeypatch):
    for f in generated.FILES:
        (tmp_path / f.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f.path).write_text((ROOT / f.path).read_text())
    old = controller.SPECS_BY_NAME["control.max_throttle"]
    changed = ParamSpec(old.name, 0.5, old.description, old.apply, low=old.low, high=old.high)
    monkeypatch.setattr(controller, "SPECS", tuple(changed if s is old else s for s in controller.SPECS))
    assert generated.stale(tmp_path) == ["config/controller.yaml", "schema/controller.schema.json", "docs/carla.md"]
    generated.write(tmp_path)
    assert "max_throttle: 0.5" in (tmp_path / "config/controller.yaml").read_text()
    assert markdown_table(controller.SPECS) in (tmp_path / "docs/carla.md").read_text()
    schema = json.loads((tmp_path / "schema/controller.schema.json").read_text())
    assert schema["definitions"]["wam_diff2_controller"]["properties"]["control"]["properties"][
        "max_throttle"]["default"] == 0.5
    assert generated.stale(tmp_path) == []


def _parameter_file(name: str) -> dict:
    """The node's parameter file as a ROS user writes it: config/<node>.yaml, or one generated from the
    table's defaults (the localization node has no file of its own)."""
    path = ROOT / "config" / f"{name}.yaml"
    text = path.read_text() if path.exists() else "/**:\n  ros__parameters:\n" + yaml_block(TABLES[name].SPECS) + "\n"
    return yaml.safe_load(text)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_parameter_files_validate_against_their_json_schemas(name):
    """schema/<node>.schema.json (generated from the same table) accepts the node's parameter file and
    refuses what the node would refuse: a value out of range, of another type, an unknown name."""
    schema = json.loads((ROOT / "schema" / f"{name}.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    params = _parameter_file(name)
    jsonschema.validate(params, schema)
    values = flatten(params["/**"]["ros__parameters"])
    assert {"/**": {"ros__parameters": nested(values)}} == params      # flatten and nested undo each other
    ranged = next(s for s in TABLES[name].SPECS if s.high is not None or s.choices is not None)
    for bad in ((ranged.high * 2 + 1) if ranged.choices is None else "not-a-choice", [1, 2]):
        broken = {"/**": {"ros__parameters": nested({**values, ranged.name: bad})}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    unknown = copy.deepcopy(params)
    unknown["/**"]["ros__parameters"]["no_such_parameter"] = 1
    with pytest.raises(jsonschema.ValidationError, match="no_such_parameter"):
        jsonschema.validate(unknown, schema)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_default_passes_its_own_validation_and_names_are_unique(name):
    table = TABLES[name]
    assert len(table.SPECS_BY_NAME) == len(table.SPECS)
    assert check_values(table.SPECS, table.DEFAULTS) == []


@pytest.mark.parametrize("name, values, message", [
    ("planner", {"lockstep_every_n_images": 0}, "lockstep_every_n_images: 0 is below 1"),
    ("planner", {"mode": "fast"}, "mode: 'fast' is not one of realtime, lockstep"),
    ("planner", {"image_timeout_s": float("nan")}, "image_timeout_s: must be finite, got nan"),
    ("controller", {"control.max_throttle": 2.0}, "control.max_throttle: 2.0 is above 1.0"),
    ("controller", {"tick_source": 3}, "tick_source: expected str, got 3"),
    ("controller", {"plan_deadline_s": float("inf")}, "plan_deadline_s: must be finite, got inf"),
    ("localization", {"filter.speed_stddev_mps": 0.0}, "filter.speed_stddev_mps: 0.0 is below 1e-05"),
])
def test_the_one_validator_names_the_offending_parameter(name, values, message):
    table = TABLES[name]
    errors = check_values(table.SPECS, {**table.DEFAULTS, **values})
    assert [str(e) for e in errors] == [message]
    assert [e.names for e in errors] == [(next(iter(values)),)]


def test_the_planners_validator_adds_the_cross_parameter_rules():
    errors = planner.validate_values({**planner.DEFAULTS, "image.min_pixels": 4096, "image.max_pixels": 1024})
    assert [e.names for e in errors] == [("image.min_pixels", "image.max_pixels")]
    errors = planner.validate_values({**planner.DEFAULTS, "detection_every_n_frames": 3})     # tasks: plan
    assert [(e.names, str(e)) for e in errors] == [(("detection_every_n_frames", "tasks"), "detection_every_n_frames: "
                                                    "3 needs both tasks (plan and detect), tasks are ['plan']")]
    assert planner.validate_values({**planner.DEFAULTS, "detection_every_n_frames": 3, "tasks": "both"}) == []


def test_the_evaluator_takes_the_planners_parameters_from_its_table(tmp_path):
    """``eval-bag --params-file``: every parameter it names is in the planner's table, with its flag."""
    from wam_diff2_core.cli import build_parser
    from wam_diff2_core.cli.eval_bag import _apply_params_file

    assert set(planner.FLAG_PARAMETERS) <= set(planner.SPECS_BY_NAME)
    params = tmp_path / "planner.yaml"
    params.write_text("/**:\n  ros__parameters:\n    odometry_timeout_s: 2\n    route:\n      lookahead_m: 12\n"
                      "    decoding:\n      block_size: 8\n    image:\n      min_pixels: 0\n    device: cpu\n")
    args = build_parser().parse_args(["eval-bag", "bag", "--out", "o", "--params-file", str(params),
                                      "--route-lookahead-m", "40"])
    for name in planner.FLAG_PARAMETERS:              # a flag for each
        assert hasattr(args, planner.cli_dest(name)), name
    _apply_params_file(args)
    assert (args.odometry_timeout_s, args.route_lookahead_m, args.block_size) == (2.0, 40.0, 8)   # the flag wins
    assert args.min_pixels is None and args.device == "cpu" and args.max_waypoint_abs_m is None
    help_text = build_parser()._subparsers._group_actions[0].choices["eval-bag"].format_help()
    assert f"node default {planner.DEFAULTS['odometry_timeout_s']}" in help_text
