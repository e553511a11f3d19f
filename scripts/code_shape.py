"""The shape of the source tree in three figures: module sizes, the functions over a length, and the largest.

Why: issue 14 asks for before/after figures of a refactor (modules a reader takes in one sitting,
functions short enough to read). `duplicates` counts repeated code; this counts size. Run it from the
repository root: `python scripts/code_shape.py [--tree src/asyncrl] [--over 60]`.
"""

from __future__ import annotations

import argparse
import ast
import statistics
from pathlib import Path


def long_functions(path: Path, *, over: int) -> list[tuple[str, int]]:
    """(qualified name, line count) of every function in `path` longer than `over` lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > over:
                    found.append((f"{prefix}{child.name}", length))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default="src/asyncrl")
    parser.add_argument("--over", type=int, default=60, help="report functions longer than this")
    parser.add_argument("--largest", type=int, default=10, help="how many of the largest modules to list")
    args = parser.parse_args()
    files = sorted(Path(args.tree).rglob("*.py"))
    sizes = {path: len(path.read_text().splitlines()) for path in files}
    print(
        f"modules: {len(files)}  lines: {sum(sizes.values())}  "
        f"median: {statistics.median(sizes.values()):.0f}  max: {max(sizes.values())}"
    )
    print(f"largest {args.largest}:")
    for path, size in sorted(sizes.items(), key=lambda item: -item[1])[: args.largest]:
        print(f"  {size:5d}  {path}")
    long = [(path, name, length) for path in files for name, length in long_functions(path, over=args.over)]
    print(f"functions over {args.over} lines: {len(long)}")
    for path, name, length in sorted(long, key=lambda item: -item[2]):
        print(f"  {length:5d}  {path}::{name}")


if __name__ == "__main__":
    main()
