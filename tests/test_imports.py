"""The package's imports point down: no two modules import each other in a circle, and none imports from a layer
above its own, the layers being the table in the package docstring (src/transformer_nmt/__init__.py), bottom up.

The imports are read from the source with ``ast``; nothing is imported. What counts: every ``import
transformer_nmt.X`` and ``from transformer_nmt.X import name`` (or relative ``from .X import name``) anywhere in a
module: at its top, inside a function or a class, under ``if TYPE_CHECKING:``. An import inside a function still
makes the two modules depend on each other, and a circle through one is only postponed to the call. ``from P
import name`` counts as an import of the module P.name where that is a module of the package, else of P. The
parent packages' ``__init__`` files that Python runs on the way to a module are not counted: they import nothing
of the package (checked below).

A module's layer is the table's entry naming it: a top-level module (``checkpoint.py``) or the subpackage it is in
(``inference/``). Within a layer any import may go in any direction, circles aside."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "transformer_nmt"

def module_name(path: Path, root: Path = PACKAGE) -> str:
    """The dotted name of the module at ``path`` in the package at ``root`` (a package's: its ``__init__``'s)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name, for its ``__init__``)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(path: Path, modules, root: Path = PACKAGE) -> set[str]:
    """Which of ``modules`` (dotted names) the module at ``path`` imports, anywhere in it (module docstring)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per dot after the first
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    return {imported for imported in found if imported in modules}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def layer_table(docstring: str) -> list[list[str]]:
    """The docstring's layers, bottom up, each the names it lists (``model/``, ``checkpoint.py``, ...): the
    four-space-indented lines of the block after "The layers, bottom up", names first, then two or more spaces
    and what they hold; a line whose names end in a comma goes on at the next one."""
    block = docstring[docstring.index("The layers, bottom up"):].split("\n\n")[1]
    layers, more = [], False
    for line in block.splitlines():
        if not re.match(r"    \S", line):
            continue  # a description going on
        names = re.split(r"\s{2,}", line.strip())[0]
        listed = [n.strip() for n in names.split(",") if n.strip()]
        if more:
            layers[-1].extend(listed)
        else:
            layers.append(listed)
        more = names.rstrip().endswith(",")
    return layers


def entry_of(name: str) -> str:
    """The table's entry a module falls under: its top-level file, or the subpackage it is in."""
    parts = name.split(".")[1:]
    if not parts:
        return "__init__.py"
    return f"{parts[0]}/" if (PACKAGE / parts[0]).is_dir() else f"{parts[0]}.py"


def package_layers() -> list[list[str]]:
    """The table of the package docstring (``layer_table``)."""
    return layer_table(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()), clean=False))


def layers() -> dict[str, int]:
    """Each module's layer, 0 at the bottom."""
    table = package_layers()
    rank = {entry: i for i, entries in enumerate(table) for entry in entries}
    return {name: rank[entry_of(name)] for name in package_modules() if entry_of(name) in rank}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a, b, ..., a) through each group of modules that import each other (Tarjan's strongly
    connected components; a group of one counts where the module imports itself)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
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
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [circle_in(graph, group) for group in groups]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path from the group's first module back to it through the group (breadth first: a shortest one)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {sorted(group)}")  # a strongly connected group always has one


def test_the_reader_sees_top_level_function_and_relative_imports(tmp_path):
    """The ast reader on a small fake package: every kind of import is found, none invented."""
    modules = {"transformer_nmt", "transformer_nmt.a", "transformer_nmt.sub", "transformer_nmt.sub.b",
               "transformer_nmt.sub.c", "transformer_nmt.d"}
    source = tmp_path / "transformer_nmt" / "sub" / "c.py"
    source.parent.mkdir(parents=True)
    source.write_text("import os\nimport transformer_nmt.a\nfrom transformer_nmt import __version__\n"
                      "from . import b\nfrom ..d import thing\n\ndef f():\n    from transformer_nmt.sub import c\n")
    assert imports_of(source, modules, root=tmp_path / "transformer_nmt") == {
        "transformer_nmt.a", "transformer_nmt", "transformer_nmt.sub.b", "transformer_nmt.d", "transformer_nmt.sub.c"}


def test_the_circle_finder_names_a_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert sorted(circles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_docstring_table_places_every_module_and_names_only_real_ones():
    table = package_layers()
    entries = [entry for layer in table for entry in layer]
    assert len(entries) == len(set(entries)), entries  # each in one layer
    assert table[0][0] == "__init__.py" and table[-1][0] == "train.py", table  # the block read whole
    for entry in entries:
        assert (PACKAGE / entry.rstrip("/")).exists(), f"the layer table names {entry}, which does not exist"
    unplaced = sorted(name for name in package_modules() if name not in layers())
    assert not unplaced, f"modules in no layer of the table in transformer_nmt/__init__.py: {unplaced}"


def test_no_package_init_imports_the_package():
    """What lets the graph leave out the __init__ files that Python runs on the way to a module."""
    graph = import_graph()
    inits = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert {name: sorted(graph[name]) for name in inits if graph[name]} == {}


def test_no_modules_import_each_other_in_a_circle():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_every_import_points_down_the_layers():
    graph, layer = import_graph(), layers()
    upward = {(importer, imported) for importer, targets in graph.items() for imported in targets
              if layer[imported] > layer[importer]}
    assert not upward, "imports up the layers of transformer_nmt/__init__.py's table:\n" + "\n".join(
        f"{importer} ({entry_of(importer)}) imports {imported} ({entry_of(imported)})"
        for importer, imported in sorted(upward))
