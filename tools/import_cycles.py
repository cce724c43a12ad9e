"""Fails when the modules of a package import each other in a cycle (TYPE_CHECKING imports included).

    python tools/import_cycles.py services/session
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports (`from package import module` counts as the module)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def cycles(root: Path) -> list[list[str]]:
    paths = {module_name(path): path for path in sorted(root.rglob("*.py"))}
    graph = {name: imports_of(path, name, set(paths)) for name, path in paths.items()}
    found, state = [], {}  # state: 1 visiting, 2 done

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                found.append(trail[trail.index(target):] + [name, target] if target in trail else [name, target])
            elif target not in state:
                visit(target, trail + [name])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [])
    return found


def main(argv: list[str]) -> int:
    found = cycles(Path(argv[0] if argv else "services/session"))
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
