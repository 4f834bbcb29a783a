"""The import graph of wam_diff2_core and wam_diff2_ros has no cycles and runs only down the layers.

The graph is read with ast from the sources (every ``import`` and ``from ... import``, at module
level and inside functions, relative ones resolved), so a lazy import that would only run on some
code path counts too; imports under ``if TYPE_CHECKING:`` (annotations only, never run) do not count
for the layers, but do for cycles (two modules that need each other to be read are a circle).
``from package import name`` is an edge to ``package.name`` when that is a module, else to
``package``. The layer order below is written once more in the package READMEs
(wam_diff2_core/README.md, wam_diff2_ros/README.md); a module may import modules of its own layer
(acyclically) and of any layer below it, never one above.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from test.support import REPO_ROOT as ROOT

PACKAGES = ("wam_diff2_core", "wam_diff2_ros")

# lowest first; a module belongs to the layer with the longest prefix of its name (a bare package
# name, the package's __init__, matches only itself: a new module must be placed here)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("wam_diff2_core", "wam_diff2_core._openmp", "wam_diff2_core._log_filters", "wam_diff2_core.version", "wam_diff2_core.config", "wam_diff2_core.utils",
                    "wam_diff2_core.topics", "wam_diff2_core.profiling")),
    ("values", ("wam_diff2_core.outputs", "wam_diff2_core.vehicle_projection", "wam_diff2_core.images", "wam_diff2_core.geometry", "wam_diff2_core.data",
                "wam_diff2_core.control", "wam_diff2_core.routes", "wam_diff2_core.localization",
                "wam_diff2_core.frame_inputs", "wam_diff2_core.speed_profile", "wam_diff2_core.pdm", "wam_diff2_core.candidate_selection",
                "wam_diff2_core.camera_rig")),
    ("model", ("wam_diff2_core.model",)),
    ("decoding", ("wam_diff2_core.decoding",)),
    ("policy", ("wam_diff2_core.policy",)),
    ("parameters", ("wam_diff2_core.params",)),
    ("evaluation", ("wam_diff2_core.evaluation", "wam_diff2_core.trainer", "wam_diff2_core.benchmark")),
    ("simulation", ("wam_diff2_core.sim",)),
    ("command line", ("wam_diff2_core.cli",)),
    ("ROS conversions", ("wam_diff2_ros", "wam_diff2_ros.conversions", "wam_diff2_ros.keep_latest",
                         "wam_diff2_ros.parameters", "wam_diff2_ros.spinning", "wam_diff2_ros.qos",
                         "wam_diff2_ros.optional_msgs", "wam_diff2_ros.diagnostics",
                         "wam_diff2_ros.planner")),     # the planner's pieces
    ("ROS nodes", ("wam_diff2_ros.planner.node", "wam_diff2_ros.planner.policy", "wam_diff2_ros.controller_node",
                   "wam_diff2_ros.localization_node", "wam_diff2_ros.entry_point", "wam_diff2_ros.planner.launching")),
    ("ROS tools", ("wam_diff2_ros.tools",)),
]

# the ROS conversions and nodes use the core up to here (the policy and the parameter tables), not the
# evaluator, the simulator, the trainer or the command line; the ROS tools may use all of it
NODES_USE_CORE_UP_TO = "parameters"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def module_imports(source: str, name: str, package: str, files, type_only: bool) -> frozenset[str]:
    """The modules of ``files`` (names) that module ``name`` (its ``source``; ``package`` the package its
    relative imports start from) imports; ``type_only``: also the imports under ``if TYPE_CHECKING:``."""
    targets: set[str] = set()
    tree = ast.parse(source, filename=name)
    skipped = set() if type_only else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        else:
            continue
        for target in found:
            if target.split(".")[0] not in PACKAGES:
                continue
            while target not in files and "." in target:     # wam_diff2_ros.msg: generated, the package
                target = target.rpartition(".")[0]
            if target != name:
                targets.add(target)
    return frozenset(targets)


@functools.lru_cache(maxsize=2)
def import_graph(type_only: bool = False) -> dict[str, frozenset[str]]:
    """{module: the modules of these packages it imports} (read once per session; not to be changed);
    ``type_only``: also the imports under ``if TYPE_CHECKING:``."""
    files = sources()
    return {name: module_imports(path.read_text(encoding="utf-8"), name,
                                 name if path.name == "__init__.py" else name.rpartition(".")[0], files, type_only)
            for name, path in files.items()}


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and the package README)"
    return best[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "wam_diff2_core.model.checkpoint" in graph["wam_diff2_core.policy"]           # from .model.checkpoint
    assert "wam_diff2_core.trainer.recipes" in graph["wam_diff2_core.trainer.command_line"]  # inside run()
    assert "wam_diff2_ros.planner.node" in graph["wam_diff2_ros.tools.dds_closed_loop"]   # inside a method
    assert "wam_diff2_core.sim.route_runs" in graph["wam_diff2_core.sim.sensors"]         # inside a function
    assert len(graph) > 90


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_not_even_type_only_imports_make_a_cycle():
    """A circle through ``if TYPE_CHECKING:`` imports is still two modules that need each other to be read."""
    assert cycles(import_graph(type_only=True)) == []


def test_imports_run_only_down_the_layers():
    graph = import_graph()
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in sorted(graph.items()) for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_the_nodes_use_only_the_policy_side_of_the_core():
    names = [name for name, _ in LAYERS]
    limit, nodes = names.index(NODES_USE_CORE_UP_TO), (names.index("ROS conversions"), names.index("ROS nodes"))
    found = [f"{m} -> {t} ({names[layer_of(t)]})" for m, targets in sorted(import_graph().items())
             if layer_of(m) in nodes for t in sorted(targets)
             if t.startswith("wam_diff2_core") and layer_of(t) > limit]
    assert not found, found


def test_the_checks_would_see_a_type_only_cycle():
    """Modules that import each other only for annotations (under ``if TYPE_CHECKING:``, or inside a
    function) are a circle to the type-only graph; the run-time graph skips the TYPE_CHECKING import."""
    files = {"wam_diff2_core.a", "wam_diff2_core.b"}
    a = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .b import B\n"
    b = "def f():\n    from .a import A\n"
    graph = {name: module_imports(source, name, "wam_diff2_core", files, type_only=True)
             for name, source in (("wam_diff2_core.a", a), ("wam_diff2_core.b", b))}
    assert cycles(graph) == [["wam_diff2_core.a", "wam_diff2_core.b"]]
    assert module_imports(a, "wam_diff2_core.a", "wam_diff2_core", files, type_only=False) == frozenset()
    assert "wam_diff2_core.policy" in import_graph(type_only=True)["wam_diff2_ros.conversions"]   # TYPE_CHECKING
    assert "wam_diff2_core.policy" not in import_graph()["wam_diff2_ros.conversions"]


def test_the_checks_would_see_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("wam_diff2_core.frame_inputs") < layer_of("wam_diff2_core.policy")
    assert layer_of("wam_diff2_core.cli.bench") > layer_of("wam_diff2_core.trainer.command_line")


def test_the_package_readmes_state_the_same_layer_order():
    for package in PACKAGES:
        text = (ROOT / package / "README.md").read_text()
        names = [name for name, prefixes in LAYERS if prefixes[0].split(".")[0] == package]
        positions = [text.find(f"**{name}**") for name in names]
        assert all(p >= 0 for p in positions), f"{package}/README.md does not name every layer: {names}"
        assert positions == sorted(positions), f"{package}/README.md names the layers in another order"
