"""One parameter system: a spec per parameter (name, type, default, range or choices, when it applies, help with
its unit), one validator, and the generated YAML / README tables / JSON schemas. The nodes declare their ROS
parameters from these specs, the evaluator names the planner's from them, and ``python -m wam_diff2_core.params
--write`` regenerates config/*.yaml, the README tables and schema/ (as Autoware keeps beside its parameter
files; a test checks the checked-in ones match and validates the YAML files against the schemas).
"""
from __future__ import annotations

from dataclasses import Field, dataclass, fields, is_dataclass
from typing import Any, Iterable, Mapping, Sequence, TypeVar

from ..config import ConfigError, check_value

LIVE, CONFIGURE, START = "live", "configure", "start"
APPLY_MOMENTS = (LIVE, CONFIGURE, START)
UNSET_DEFAULT = "unset: the checkpoint's"


@dataclass(frozen=True)
class ParamSpec:
    """One node parameter. ``apply``: ``live`` (at the next input), ``configure`` (when the model is
    loaded; rejected while one is) or ``start`` (read once, read-only). A default of None declares the
    parameter unset (``type_`` then names its type and ``shown_default`` the value documented for it)."""

    name: str
    default: Any
    description: str
    apply: str = LIVE
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    type_: type | None = None
    shown_default: Any = None

    def __post_init__(self):
        assert self.apply in APPLY_MOMENTS, self.apply
        assert self.default is not None or self.type_ is not None, f"{self.name}: an unset spec needs type_"

    @property
    def kind(self) -> type:
        return self.type_ or type(self.default)


@dataclass(frozen=True)
class ParamError:
    names: tuple[str, ...]     # the parameters the problem involves
    message: str               # names the offending field and value

    def __str__(self) -> str:
        return self.message


def defaults(specs: Iterable[ParamSpec]) -> dict[str, Any]:
    return {s.name: s.default for s in specs}


def by_name(specs: Iterable[ParamSpec]) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


def check_values(specs: Sequence[ParamSpec], values: Mapping[str, Any]) -> list[ParamError]:
    """Each given value against its spec by the settings' validator, :func:`~wam_diff2_core.config.check_value`
    (an int for a float checked as the int it is; unknown names and values left unset, None for a spec whose
    default is None, are ignored); each error names its parameter."""
    errors: list[ParamError] = []
    for spec in specs:
        value = values.get(spec.name)
        if spec.name not in values or (value is None and spec.default is None):
            continue
        as_int = spec.kind is float and isinstance(value, int) and not isinstance(value, bool)
        try:
            check_value(spec.name, value, int if as_int else spec.kind,
                        {"choices": spec.choices, "low": spec.low, "high": spec.high})
        except ConfigError as exc:
            errors.append(ParamError((spec.name,), str(exc)))
    return errors


def _nested(f: Field) -> type | None:
    """The settings dataclass a field holds whole (its fields become parameters of their own), else None."""
    return f.default_factory if is_dataclass(f.default_factory) else None


def field_specs(prefix: str, settings: type, apply: str = LIVE, *, note: str = "", unset: bool = False,
                **bounds: float) -> tuple[ParamSpec, ...]:
    """A spec per field of the dataclass ``settings`` (a nested settings' fields in its place) named ``prefix`` +
    its name, from the field's ``setting``: default, help (+ ``note``), choices and range (``bounds``: a low /
    high where the field has none). ``unset``: unset by default, the field's default documented."""
    specs: list[ParamSpec] = []
    for f in fields(settings):
        if _nested(f):
            specs += field_specs(prefix, _nested(f), apply, note=note, unset=unset, **bounds)
            continue
        meta = {**bounds, **{k: v for k, v in f.metadata.items() if v is not None}}
        specs.append(ParamSpec(prefix + f.name, None if unset else f.default, meta["help"] + note, apply,
                               choices=meta.get("choices"), low=meta.get("low"), high=meta.get("high"),
                               type_=type(f.default) if unset else None, shown_default=f.default if unset else None))
    return tuple(specs)


Settings = TypeVar("Settings")


def settings_from(settings: type[Settings], values: Mapping[str, Any], prefix: str) -> Settings:
    """The dataclass ``settings`` from the parameter values of its :func:`field_specs`."""
    return settings(**{f.name: settings_from(_nested(f), values, prefix) if _nested(f) else values[prefix + f.name]
                       for f in fields(settings)})


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return repr(value)


def _format_range(spec: ParamSpec) -> str:
    if spec.choices is not None:
        return " / ".join(spec.choices)
    if spec.low is not None or spec.high is not None:
        return f"{format_value(spec.low) if spec.low is not None else ''} .. " \
               f"{format_value(spec.high) if spec.high is not None else ''}"
    return ""


def markdown_table(specs: Iterable[ParamSpec]) -> str:
    rows = ["| name | type | default | range | applied | description |", "|---|---|---|---|---|---|"]
    type_names = {str: "string", int: "int", float: "double", bool: "bool", list: "string[]"}
    for s in specs:
        description = s.description.replace("|", "\\|")
        default = UNSET_DEFAULT if s.default is None else f"`{format_value(s.default)}`"
        rows.append(f"| `{s.name}` | {type_names[s.kind]} | {default} | {_format_range(s)} "
                    f"| {s.apply} | {description} |")
    return "\n".join(rows)


def yaml_block(specs: Iterable[ParamSpec], indent: int = 4, unset_note: Sequence[str] = ()) -> str:
    """The ros__parameters block with every default, nested on the dots; specs unset by default
    follow as comments (after ``unset_note``) with their ``shown_default``."""
    specs = list(specs)
    unset = [s for s in specs if s.default is None]
    lines = _yaml_lines([(s.name, s.default) for s in specs if s.default is not None], indent)
    if unset:
        lines += [" " * indent + "# " + line for line in unset_note]
        lines += ["#" + line[1:] if line.startswith(" ") else "# " + line
                  for line in _yaml_lines([(s.name, s.shown_default) for s in unset], indent)]
    return "\n".join(lines)


def _yaml_lines(items: list[tuple[str, Any]], indent: int) -> list[str]:
    lines, opened = [], []
    for name, value in items:
        *groups, leaf = name.split(".")
        common = 0
        while common < min(len(groups), len(opened)) and groups[common] == opened[common]:
            common += 1
        opened = opened[:common]
        for g in groups[common:]:
            lines.append(" " * (indent + 2 * len(opened)) + f"{g}:")
            opened.append(g)
        lines.append(" " * (indent + 2 * len(opened)) + f"{leaf}: {format_value(value)}")
    return lines


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array"}


def json_schema(specs: Iterable[ParamSpec], node: str, title: str) -> dict[str, Any]:
    """A JSON Schema (draft-07) of a ROS parameter file for ``node``, as Autoware lays them out: ``/**:
    ros__parameters:`` with the parameters nested on the dots; those with a default required, unset ones not."""
    tree: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    for spec in specs:
        *groups, leaf = spec.name.split(".")
        node_schema, path = tree, [tree]
        for group in groups:
            node_schema = node_schema["properties"].setdefault(group, {"type": "object", "properties": {},
                                                                       "required": [], "additionalProperties": False})
            path.append(node_schema)
        if spec.default is not None:            # its groups are required too
            for parent, group in zip(path, groups):
                if group not in parent["required"]:
                    parent["required"].append(group)
        entry: dict[str, Any] = {"type": _JSON_TYPES[spec.kind], "description": spec.description}
        if spec.kind is list:
            entry["items"] = {"type": "string"}
        if spec.default is not None:
            entry["default"] = spec.default
            node_schema["required"].append(leaf)
        if spec.choices is not None:
            entry["enum"] = list(spec.choices)
        if spec.low is not None:
            entry["minimum"] = spec.low
        if spec.high is not None:
            entry["maximum"] = spec.high
        node_schema["properties"][leaf] = entry
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": title,
        "type": "object",
        "definitions": {node: tree},
        "properties": {"/**": {"type": "object", "properties": {"ros__parameters": {"$ref": f"#/definitions/{node}"}},
                               "required": ["ros__parameters"], "additionalProperties": False}},
        "required": ["/**"],
        "additionalProperties": False,
    }
