"""The import graph of a package of this repository, read from its source (any import, also under
TYPE_CHECKING or inside a function), and the search for a cycle in it: the tests of `proxy/` and
`evalkit/` hold each package to one direction of imports."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at `path` of the package whose folder is `root`."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: ModuleType) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports."""
    root = Path(str(package.__file__)).parent
    modules = {module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        anchor = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = anchor.split(".")[: len(anchor.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as the list of its modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None
