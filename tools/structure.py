"""The house's shape, read from the source: which layer imports which, and import circles.

    .venv/bin/python tools/structure.py [--all-imports]

Prints each package's import circles among its own modules (strongly connected components of
more than one module), counting module-level imports, `if TYPE_CHECKING:` ones included (a
dependency for the type checker is a dependency); `--all-imports` counts imports inside
functions too. tests/test_structure.py asserts there are none, and that the layers point one
way (protocol <- pool <- session <- daemon).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("protocol", "pool", "session", "daemon")


def module_files() -> dict[str, Path]:
    """`mcpool.<layer>.<module>` -> its file."""
    found = {}
    for layer in LAYERS:
        for path in sorted((REPO / layer).glob("*.py")):
            name = f"mcpool.{layer}" if path.stem == "__init__" else f"mcpool.{layer}.{path.stem}"
            found[name] = path
    return found


def _resolve(module: str, node: ast.ImportFrom, files: dict[str, Path]) -> list[str]:
    """What `from ... import ...` in `module` depends on: the modules it names, else the
    module (or package) it imports from."""
    # A package's __init__ is its own package; a module's package is its parent.
    package = module if module.count(".") == 1 else module.rsplit(".", 1)[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    named = [f"{target}.{alias.name}" for alias in node.names]
    modules = [name for name in named if name in files]
    return modules or [target]


def imports_of(module: str, path: Path, files: dict[str, Path], *, all_imports: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.update(_resolve(module, node, files))
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, part, []):
                        if isinstance(child, ast.ExceptHandler):
                            visit(child.body)
                        else:
                            visit([child])
            elif all_imports and isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                visit(node.body)

    visit(tree.body)
    return found


def graph(*, all_imports: bool = False) -> dict[str, set[str]]:
    files = module_files()
    edges: dict[str, set[str]] = {}
    for module, path in files.items():
        edges[module] = {
            target
            for target in imports_of(module, path, files, all_imports=all_imports)
            if target in files and target != module
        }
    return edges


def private_trio_imports() -> list[tuple[str, str]]:
    """(module, what) for every import of trio's private parts (`trio._...`), anywhere in a
    module (inside functions too): the daemon uses trio's public API only (issue 27)."""
    files = module_files()
    return sorted(
        (module, target)
        for module, path in files.items()
        for target in imports_of(module, path, files, all_imports=True)
        if target.startswith("trio._")
    )


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(found)


def layer_of(module: str) -> str:
    return module.split(".")[1]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a lower layer of a higher one."""
    rank = {layer: n for n, layer in enumerate(LAYERS)}
    return sorted(
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if rank[layer_of(b)] > rank[layer_of(a)]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all-imports", action="store_true")
    args = ap.parse_args()
    edges = graph(all_imports=args.all_imports)
    bad = 0
    for component in circles(edges):
        bad += 1
        names = " ".join(m.split(".", 1)[1] for m in component)
        print(f"circle ({len(component)} modules): {names}")
    for a, b in upward(edges):
        bad += 1
        print(f"upward import: {a} -> {b}")
    for module, target in private_trio_imports():
        bad += 1
        print(f"trio's internals: {module} imports {target}")
    if not bad:
        print("no circles, layers point one way")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
