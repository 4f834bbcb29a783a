"""Where the generated parameter YAML files and tables live, and how to rewrite them.

Each YAML file keeps its header comments up to ``ros__parameters:``; each markdown table is the
block of ``|`` lines that follows its anchor text; each JSON schema (``schema/<node>.schema.json``) is
generated whole.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import controller, localization, planner
from .spec import json_schema, markdown_table, yaml_block

ROOT = Path(__file__).resolve().parents[2]
YAML_MARKER = "  ros__parameters:\n"
TABLE_HEADER = "| name | type | default |"
TABLES = {"planner": planner, "controller": controller, "localization": localization}


@dataclass(frozen=True)
class Generated:
    path: str                 # relative to the repository root
    table: str                # "planner" | "controller" | "localization"
    anchor: str | None        # markdown: the text the table follows; None: a YAML parameter file or a schema

    def render(self, text: str) -> str:
        """``text`` with its generated part rewritten from the table."""
        module: ModuleType = TABLES[self.table]
        if self.path.endswith(".schema.json"):
            schema = json_schema(module.SPECS, module.NODE, f"Parameters of the WAM-Diff2 {self.table} node")
            return json.dumps(schema, indent=2) + "\n"
        if self.anchor is None:
            head = text[: text.index(YAML_MARKER) + len(YAML_MARKER)]
            return head + yaml_block(module.SPECS, unset_note=getattr(module, "UNSET_NOTE", ())) + "\n"
        start = text.index(TABLE_HEADER, text.index(self.anchor))
        end = start
        while end < len(text) and text.startswith("|", end):
            end = text.find("\n", end) + 1 or len(text)
        return text[:start] + markdown_table(module.SPECS) + "\n" + text[end:]


FILES = (
    Generated("config/planner.yaml", "planner", None),
    Generated("config/controller.yaml", "controller", None),
    *(Generated(f"schema/{table}.schema.json", table, None) for table in TABLES),
    Generated("wam_diff2_ros/README.md", "planner", "## Parameters"),
    Generated("docs/carla.md", "localization", "Parameters (generated from `wam_diff2_core/params/localization.py`"),
    Generated("docs/carla.md", "controller", "Parameters (`config/controller.yaml`; generated from "
                                             "`wam_diff2_core/params/controller.py`"),
)


def stale(root: Path = ROOT) -> list[str]:
    """The generated files whose checked-in text differs from what the tables give."""
    texts = {f.path: _read(root / f.path) for f in FILES}
    wanted = dict(texts)
    for f in FILES:
        wanted[f.path] = f.render(wanted[f.path])
    return [path for path in texts if texts[path] != wanted[path]]


def write(root: Path = ROOT) -> list[Path]:
    """Rewrite every generated part from the tables; the files written."""
    written = []
    for f in FILES:
        path = root / f.path
        text = _read(path)
        new = f.render(text)
        if new != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new)
            written.append(path)
    return written


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
