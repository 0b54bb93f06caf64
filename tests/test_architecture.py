"""The package's structure, checked from its source with ``ast`` (nothing is imported but the layout).

**Import graph.** Nodes are the modules under ``src/mlm_pipeline``; each import of a module of the
package is an edge: ``import mlm_pipeline.a.b``, ``from mlm_pipeline.a import b`` (an edge to the
module ``a.b`` when it is one, else to the package ``a``), and relative imports alike. Importing
``a.b`` also runs the package ``a``'s ``__init__``; that implicit step is not an edge (a package's
``__init__`` may import its own modules without making a cycle). Two graphs are checked:

* *module level*: the imports that run when the module is imported (top level, class bodies,
  module-level ``if``/``try``), except those under ``if TYPE_CHECKING:``, which never run. A cycle
  here breaks or depends on import order.
* *all imports*: the above plus imports inside functions (deferred, usually to keep a heavy or
  optional dependency off the import path). A cycle closed by a deferred import still ties two
  layers to each other, as the driver and the executors once were.

Both must be acyclic. Beyond cycles, the layering is asserted where it was once broken: executors
never import the driver, and a run's state (``mlm_pipeline.run``) imports neither the driver nor
an executor.

**Run-layout names.** The names of a run's directory (the public constants of
``mlm_pipeline.run.layout``) are spelled only there. A string literal elsewhere in ``src`` spells
one when it equals the name, or when it has no whitespace and one of its ``/``-separated parts
equals it (``"shards/x"``, an f-string's ``"/_tasks/"``) or starts with the shard prefix (``part-``). Prose (help texts, docstrings, with
spaces) may mention the names. ``shards`` is also a manifest and marker field, so a bare
``"shards"`` counts only as an argument of a ``join`` call.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "mlm_pipeline"


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(src: Path = SRC) -> dict[str, Path]:
    return {_module_name(p, src): p for p in sorted((src / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, *, module_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module (see the module docstring for which count)."""
    found: list = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and module_level_only:
            return
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:  # the body runs only under a type checker
                visit(stmt)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(tree)
    return found


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules an import statement names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level:  # relative: from the importer's package, up level - 1 more
        base = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    if source not in modules:
        return set()
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.add(sub if sub in modules else source)
    return out


def import_graph(*, module_level_only: bool, src: Path = SRC) -> dict[str, set[str]]:
    sources = _sources(src)
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in _imports(tree, module_level_only=module_level_only):
            edges |= _targets(node, name, path.name == "__init__.py", modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def cyclic_groups(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module: each holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


# A deferred cycle inside the readers (read.base's head sniffing imports read.ranges, which imports
# read.base), removed by the readers' re-layout that puts decompression in a module below both.
# Delete this entry once that has landed; nothing else may join the list.
def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_the_package():
    graph = import_graph(module_level_only=True)
    assert "mlm_pipeline.run.layout" in graph and "mlm_pipeline.executors.local" in graph
    # a few known edges, so that an empty graph cannot pass as acyclic
    assert "mlm_pipeline.run.layout" in graph["mlm_pipeline.formats.sink"]  # from mlm_pipeline.run import layout
    assert "mlm_pipeline.fs" in graph["mlm_pipeline.run.layout"]  # from mlm_pipeline import fs
    assert "mlm_pipeline.read.base" in graph["mlm_pipeline.read"]  # package __init__
    deferred = import_graph(module_level_only=False)
    assert "mlm_pipeline.executors.ray" in deferred["mlm_pipeline.pipeline"]
    assert "mlm_pipeline.executors.ray" not in graph["mlm_pipeline.pipeline"]


def test_no_import_cycle_at_module_level():
    cycle = find_cycle(import_graph(module_level_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_with_deferred_imports():
    graph = import_graph(module_level_only=False)
    new = cyclic_groups(graph)
    if new:
        cycle = find_cycle({m: graph[m] & new[0] for m in new[0]})
        raise AssertionError("import cycle (counting imports inside functions): " + " -> ".join(cycle))


def test_cycle_detection_finds_a_deferred_cycle(tmp_path):
    """The checker itself: a cycle closed inside a function is found in the all-imports graph only."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from mlm_pipeline import b\n\ndef f():\n    return b\n")
    (pkg / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from mlm_pipeline.sub import a\n\n"
                              "def g():\n    from .sub.a import f\n    return f\n")
    assert find_cycle(import_graph(module_level_only=True, src=tmp_path)) is None
    deferred = import_graph(module_level_only=False, src=tmp_path)
    assert find_cycle(deferred) == ["mlm_pipeline.b", "mlm_pipeline.sub.a", "mlm_pipeline.b"]
    assert cyclic_groups(deferred) == [{"mlm_pipeline.b", "mlm_pipeline.sub.a"}]


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_executors_never_import_the_driver_and_run_state_never_imports_executors():
    graph = import_graph(module_level_only=False)
    executors = [m for m in graph if m.startswith("mlm_pipeline.executors")]
    assert len(executors) >= 5
    for module in executors:
        assert "mlm_pipeline.pipeline" not in _reaches(graph, module), module
    for module in (m for m in graph if m.startswith("mlm_pipeline.run")):
        reached = _reaches(graph, module)
        assert "mlm_pipeline.pipeline" not in reached, module
        assert not [m for m in reached if m.startswith("mlm_pipeline.executors")], module


# --------------------------------------------------------------------------------------------
# run-layout names


def _layout_names() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("_layout_for_test", SRC / PACKAGE / "run" / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {k: v for k, v in vars(module).items()
            if k.isupper() and not k.startswith("_") and isinstance(v, str)}


def _is_join(call: ast.AST) -> bool:
    func = getattr(call, "func", None)
    return isinstance(func, (ast.Attribute, ast.Name)) and getattr(func, "attr", getattr(func, "id", "")) == "join"


def stray_layout_literals(source: str, names: dict[str, str]) -> list[tuple[int, str]]:
    """(line, literal) of each string literal in ``source`` that spells a run-layout name."""
    tree = ast.parse(source)
    join_args = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) and _is_join(node)
                 for arg in node.args}
    shards, prefix = names["SHARDS_DIR"], names["SHARD_PREFIX"]
    values = set(names.values())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text = node.value
        if any(c.isspace() for c in text):
            continue  # prose
        parts = text.split("/")
        if text == shards:
            hit = id(node) in join_args
        else:
            hit = (text in values or ("/" in text and bool(set(parts) & values))
                   or any(p.startswith(prefix) for p in parts))
        if hit:
            found.append((node.lineno, text))
    return found


def test_each_run_layout_name_is_spelled_only_in_run_layout():
    names = _layout_names()
    assert {"RUN_FILE", "PLAN_FILE", "MANIFEST_FILE", "TASKS_DIR", "SHARDS_DIR", "SHARD_PREFIX", "TMP_DIR",
            "LEASES_DIR"} <= set(names)
    layout = SRC / PACKAGE / "run" / "layout.py"
    assert stray_layout_literals(layout.read_text(encoding="utf-8"), names)  # the layout itself spells them
    stray = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        if path != layout:
            hits = stray_layout_literals(path.read_text(encoding="utf-8"), names)
            if hits:
                stray[str(path.relative_to(SRC))] = hits
    assert not stray, f"run-layout names spelled outside run/layout.py (use its constants and helpers): {stray}"


@pytest.mark.parametrize("snippet, stray", [
    ('fs.join(output, "_tasks", name)', True),
    ('os.path.join(path, "shards")', True),
    ('url = output + "/manifest.json"', True),
    ('f"{output}/_leases/{task_id}.json"', True),
    ('RUN = "_run.json"', True),
    ('"shards/" + name', True),
    ('f"part-{task_id}-{k:05d}.{fmt}"', True),
    ('glob("part-*.parquet")', True),
    ('manifest["shards"]', False),  # the manifest's field, not the directory
    ('marker.get("shards", [])', False),
    ('help = "writes manifest.json and _tasks/ into the output"', False),  # prose
    ('layout.manifest_url(output)', False),
])
def test_stray_literal_detection(snippet, stray):
    assert bool(stray_layout_literals(snippet, _layout_names())) is stray


MAX_MODULE_LINES = 600


def test_modules_stay_small_or_say_why():
    """A module over ~600 lines mixes concerns unless its docstring states why it is one piece
    (a line starting ``Why one module:``)."""
    too_long = []
    for path in sorted((SRC / "mlm_pipeline").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_MODULE_LINES and "Why one module:" not in doc:
            too_long.append(f"{path.relative_to(SRC)} ({text.count(chr(10))} lines)")
    assert not too_long, "split these, or say why in the docstring: " + ", ".join(too_long)
