"""The house, drawn from its own imports: no circle, no arrow running back up the
layers DESIGN.md names, one door from the command line, rooms of a readable size."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "resetctl"

#: Layers from the top (0) down: a module may import its own layer or any below it.
#: The longest matching prefix names a module's layer.
LAYERS: dict[str, int] = {
    "resetctl.__main__": 0,
    "resetctl.cli": 1,
    "resetctl.cli_command": 1,
    "resetctl.cli_groups": 1,
    "resetctl.cli_output": 1,
    "resetctl.cli_serve": 1,
    "resetctl.web": 1,
    "resetctl.serve": 1,
    "resetctl.api": 2,
    "resetctl": 2,  # the package: re-exports the API lazily
    "resetctl.controls": 3,
    "resetctl.demo": 3,
    "resetctl.enqueue": 3,
    "resetctl.request_fields": 3,
    "resetctl.observe": 3,
    "resetctl.ops": 3,
    "resetctl.ops_measures": 3,
    "resetctl.ops_providers": 3,
    "resetctl.report": 3,
    "resetctl.replay": 3,
    "resetctl.timings": 3,
    "resetctl.templates": 3,
    "resetctl.sweep": 4,
    "resetctl.calls": 4,
    "resetctl.folds": 4,
    "resetctl.work": 4,
    "resetctl.tracing": 4,
    "resetctl.rollout": 4,
    "resetctl.routes": 4,
    "resetctl.decks": 4,
    "resetctl.pool": 4,
    "resetctl.providers": 5,
    "resetctl.failover": 7,
    "resetctl.instances": 9,
    "resetctl.lanes": 7,
    "resetctl.clocks": 7,
    "resetctl.transports": 5,
    "resetctl.limits": 5,
    "resetctl.store": 6,
    "resetctl.render": 7,
    "resetctl.privacy": 7,
    "resetctl.telemetry": 7,
    "resetctl.summary": 7,
    "resetctl.tick": 7,
    "resetctl.machine": 8,
    "resetctl.config": 9,
    "resetctl.policy": 9,
    "resetctl.distributions": 10,
    "resetctl.durations": 10,
    "resetctl.errors": 10,
    "resetctl.files": 10,
    "resetctl.frozen": 10,
    "resetctl.schema_facts": 10,
}
#: No file in the package grows past this many lines.
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every resetctl module ``name`` imports, at any depth (lazy and type-only
    imports included: each is an arrow in the house)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            # `from resetctl import machine` imports the submodule, not the facade.
            targets = submodules or [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)
    return LAYERS[best]


def test_every_module_has_a_layer() -> None:
    """Each module of the package sits on a named layer (a new one is placed on purpose)."""
    named = [p for p in LAYERS if p != "resetctl"]
    unplaced = [
        n
        for n in MODULES
        if n != "resetctl" and not any(n == p or n.startswith(p + ".") for p in named)
    ]
    assert unplaced == []


def test_the_imports_have_no_circle() -> None:
    """No module reaches itself through its imports (Tarjan's strongly connected parts)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert circles == []


def test_no_arrow_runs_back_up() -> None:
    """Every import points to the importer's own layer or one below it."""
    back = sorted(
        f"{source} -> {target}"
        for source, targets in GRAPH.items()
        for target in targets
        if _layer(target) < _layer(source)
    )
    assert back == []


def test_the_command_line_has_one_door() -> None:
    """The CLI reaches the library only through the API: nothing from the store (nor
    the modules that hold rules or SQL), and nothing imports the entry point."""
    cli = [n for n in MODULES if n == "resetctl.cli" or n.startswith("resetctl.cli")]
    closed = ("resetctl.store", "resetctl.ops", "resetctl.report", "resetctl.sweep")
    reached = sorted(
        f"{source} -> {target}"
        for source in cli
        for target in GRAPH[source]
        if any(target == c or target.startswith(c + ".") for c in closed)
    )
    assert reached == []
    assert [n for n, targets in GRAPH.items() if "resetctl.__main__" in targets] == []


def test_the_http_service_goes_through_the_api() -> None:
    """web.py and serve reach notices only through the handle: nothing from the store nor
    the modules that hold the rules or the SQL behind it."""
    served = [n for n in MODULES if n == "resetctl.web" or n.startswith("resetctl.serve")]
    closed = (
        "resetctl.store",
        "resetctl.ops",
        "resetctl.report",
        "resetctl.sweep",
        "resetctl.enqueue",
        "resetctl.controls",
        "resetctl.observe",
    )
    reached = sorted(
        f"{source} -> {target}"
        for source in served
        for target in GRAPH[source]
        if any(target == c or target.startswith(c + ".") for c in closed)
    )
    assert len(served) > 3
    assert reached == []


def test_no_file_grows_past_the_limit() -> None:
    """Rooms that each do one job: no module over MAX_LINES lines."""
    sizes = {n: len(p.read_text(encoding="utf-8").splitlines()) for n, p in MODULES.items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}
