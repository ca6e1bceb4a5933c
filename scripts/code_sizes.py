"""The code's shape in numbers: the largest modules, classes and functions of
src/spotbook, and how many bare status strings are left outside the enums.

    python scripts/code_sizes.py              # the working tree
    python scripts/code_sizes.py --rev 5503be8  # any commit, to compare before/after
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the status words of runs, attempts and cells (spotbook._models' enums)
STATUS_WORDS = {
    "pending", "running", "succeeded", "failed", "interrupted", "cancelled", "completed",
    "exited", "executed", "preempted", "killed", "superseded", "storage-error", "timed-out",
    "resume-refused", "restart",
}  # fmt: skip


def sources(rev: str | None) -> Iterator[tuple[str, str]]:
    """(path, text) of every module under src/spotbook, at ``rev`` or in the tree."""
    if rev is None:
        for path in sorted((ROOT / "src" / "spotbook").rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text()
        return
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "src/spotbook"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in sorted(n for n in names if n.endswith(".py")):
        text = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        yield name, text


def span(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def measure(rev: str | None, top: int) -> None:
    modules: list[tuple[int, str]] = []
    classes: list[tuple[int, str, int, int]] = []
    functions: list[tuple[int, str]] = []
    bare = 0
    for path, text in sources(rev):
        tree = ast.parse(text)
        modules.append((len(text.splitlines()), path))
        short = path.removeprefix("src/spotbook/")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                attrs = {
                    t.attr
                    for n in ast.walk(node)
                    if isinstance(n, ast.Assign | ast.AnnAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                }
                classes.append((span(node), f"{short}:{node.name}", len(methods), len(attrs)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((span(node), f"{short}:{node.name}"))
            elif (
                isinstance(node, ast.Constant)
                and node.value in STATUS_WORDS
                and not short.startswith("_models")
            ):
                bare += 1
    print(f"== {rev or 'working tree'}: {len(modules)} modules, {sum(m[0] for m in modules)} lines")
    print("largest modules:")
    for lines, path in sorted(modules, reverse=True)[:top]:
        print(f"  {lines:5d}  {path}")
    print("largest classes (lines, methods, attributes set on self):")
    for lines, name, methods, attrs in sorted(classes, reverse=True)[:top]:
        print(f"  {lines:5d}  {methods:3d}  {attrs:3d}  {name}")
    print("largest functions:")
    for lines, name in sorted(functions, reverse=True)[:top]:
        print(f"  {lines:5d}  {name}")
    print(f"status words as bare string literals outside _models.py: {bare}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", help="a commit (repeat to compare several)")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    for rev in args.rev or [None]:
        measure(rev, args.top)


if __name__ == "__main__":
    main()
