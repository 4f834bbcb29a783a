"""A ROS 2 parameter YAML read without ROS: the values one node would get, by the node's dotted names
(what ``wam-diff2 eval-bag --params-file`` applies as the planner node would); ``flatten`` and ``nested``
turn a file's nested sections into dotted names and back.

    values = read_node_params("config/planner.yaml")          # {"route.lookahead_m": 30.0, ...}
"""
from __future__ import annotations

from pathlib import Path

from ..config import ConfigError
from ..topics import PLANNER_NODE


def read_node_params(path: str | Path, node: str = PLANNER_NODE) -> dict:
    """The ``ros__parameters`` of a ROS 2 parameter YAML for ``node`` (``/**`` first, then the node's
    own section), flattened to the node's dotted names (``route.lookahead_m``). ConfigError naming the file
    when it cannot be read or holds no parameters for ``node``."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of node names to ros__parameters")
    merged: dict = {}
    for key in ("/**", node, "/" + node):
        section = data.get(key)
        if isinstance(section, dict) and isinstance(section.get("ros__parameters"), dict):
            merged.update(flatten(section["ros__parameters"]))
    if not merged:
        raise ConfigError(f"{path}: no ros__parameters under '/**' or {node!r}")
    return merged


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested parameter sections as dotted names: ``{"route": {"lookahead_m": 30}}`` -> ``{"route.lookahead_m": 30}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def nested(values: dict) -> dict:
    """Dotted parameter names as a ROS parameter file nests them: ``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    out: dict = {}
    for name, value in values.items():
        *groups, last = name.split(".")
        level = out
        for g in groups:
            level = level.setdefault(g, {})
        level[last] = value
    return out
