"""No import cycles among the project's modules, and every package says in one line what its layer is for.

The graph is read from the source with ``ast`` (nothing is imported). Every ``import`` statement counts,
wherever it is: at module level, inside a function (a deferred import still ties the two modules together,
and hiding one in a function only moves the cycle to run time) and under ``if TYPE_CHECKING`` (the type
still names the other module). An edge goes to the module named: ``from pkg import name`` points at
``pkg.name`` when that is a module, else at ``pkg``. Parent packages are not edges of their own: importing
``a.b.c`` runs ``a/__init__`` first, but a package's ``__init__`` re-exporting its children is how a package
is built, and a child that imports names *through* its package (``from a.b import X``) still shows up as an
edge to ``a.b``. ``bench/`` and ``scripts/`` are folders of scripts run as ``python bench/x.py``: a bare
``import y`` there is their sibling ``y.py`` (a folder with an ``__init__.py`` is a package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rectrain", "recserve", "tests")
SCRIPT_FOLDERS = ("bench", "scripts")

Edge = tuple[str, str, int]  # (imported module, file, line)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for the packages and the script folders (scripts by their bare file name)."""
    modules = {}
    packages = [*PACKAGES, *(f for f in SCRIPT_FOLDERS if (root / f / "__init__.py").exists())]
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            modules[_module_name(path, root)] = path
    for folder in set(SCRIPT_FOLDERS) - set(packages):
        for path in sorted((root / folder).glob("*.py")):
            modules[f"{folder}/{path.stem}"] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a project module, if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, modules: dict[str, Path]) -> list[str]:
    """The project modules one import statement in ``module`` names."""
    is_package = modules[module].name == "__init__.py"
    if "/" in module:  # a script: bare names are its siblings
        folder = module.split("/")[0]
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        return [f"{folder}/{n.split('.')[0]}" for n in names if f"{folder}/{n.split('.')[0]}" in modules]
    if isinstance(node, ast.Import):
        found = [_known(a.name, modules) for a in node.names]
        return [t for t in found if t]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    found = []
    for alias in node.names:
        child = f"{base}.{alias.name}"
        found.append(child if child in modules else _known(base, modules))
    return [t for t in found if t]


def import_graph(modules: dict[str, Path]) -> dict[str, list[Edge]]:
    graph: dict[str, list[Edge]] = {}
    for module, path in modules.items():
        edges = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [(t, str(path), node.lineno) for t in _targets(node, module, modules) if t != module]
        graph[module] = edges
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = [t for t, _, _ in graph[node]]
            if i < len(targets):
                work.append((node, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(_cycle_in(set(component), graph))
    return found


def _cycle_in(component: set[str], graph: dict[str, list[Edge]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first), closed: [a, ..., a]."""
    first = min(component)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target, _, _ in graph[node]:
                if target == first:
                    return paths[node] + [first]
                if target in component and target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {first} in {sorted(component)}")


def describe(cycle: list[str], graph: dict[str, list[Edge]]) -> str:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        file, line = next((f, n) for t, f, n in graph[a] if t == b)
        steps.append(
            f"{a} -> {b} ({Path(file).relative_to(ROOT) if ROOT in Path(file).parents else file}:{line})"
        )
    return "; ".join(steps)


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph(project_modules(ROOT))
    assert len(graph) > 200  # the walk found the project
    found = [describe(c, graph) for c in cycles(graph)]
    assert not found, "import cycles (move the shared code to a module both can import):\n" + "\n".join(found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize(
    "files, expected",
    [
        # module level, through a function and under TYPE_CHECKING: all three are cycles
        ({"rectrain/a.py": "from rectrain.b import x\n", "rectrain/b.py": "import rectrain.a\n"}, 1),
        (
            {
                "rectrain/a.py": "from rectrain import b\n",
                "rectrain/b.py": "def f():\n    from rectrain.a import y\n",
            },
            1,
        ),
        (
            {
                "rectrain/a.py": "from . import b\n",
                "rectrain/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\n",
            },
            1,
        ),
        # a child importing a name through its package, whose __init__ imports the child
        (
            {
                "rectrain/p/__init__.py": "from rectrain.p.c import C\n",
                "rectrain/p/c.py": "from rectrain.p import D\n",
            },
            1,
        ),
        # scripts import their siblings by bare name; a bench package, by its name
        ({"bench/x.py": "import y\n", "bench/y.py": "def f():\n    import x\n"}, 1),
        (
            {
                "bench/__init__.py": "",
                "bench/x.py": "from bench import y\n",
                "bench/y.py": "from .x import f\n",
            },
            1,
        ),
        # a package re-exporting children that import each other one way only: no cycle
        (
            {
                "rectrain/p/__init__.py": "from rectrain.p.c import C\nfrom rectrain.p.d import D\n",
                "rectrain/p/c.py": "from rectrain.p.d import D\n",
                "rectrain/p/d.py": "import torch\n",
            },
            0,
        ),
    ],
)
def test_the_checker_finds_planted_cycles(tmp_path, files, expected):
    for top in (*PACKAGES, *SCRIPT_FOLDERS):
        (tmp_path / top).mkdir()
    _write(tmp_path, {"rectrain/__init__.py": "", **files})
    graph = import_graph(project_modules(tmp_path))
    assert len(cycles(graph)) == expected


def test_every_package_says_in_one_line_what_its_layer_is_for():
    vague = []
    for init in sorted(
        [*(ROOT / "rectrain").rglob("__init__.py"), *(ROOT / "recserve").rglob("__init__.py")]
    ):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        lines = doc.splitlines()
        # one line: a sentence that ends there (a blank line or nothing follows it)
        if not lines or len(lines[0]) < 20 or (len(lines) > 1 and lines[1].strip()):
            vague.append(str(init.relative_to(ROOT)))
    assert not vague, f"give these __init__.py a one-line docstring saying what the layer is for: {vague}"
