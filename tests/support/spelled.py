"""Where file names are spelled in the source (issue 28: each folder's names in its layout.py only).

:func:`spelled` parses every module of ``attnprobe/`` and ``app/`` and lists the string literals (f-string
parts included, docstrings and prose left out) that name a file: the literal is the name, or a path that
has it as one part (``"captures/x"``, ``f"{out}/record.json"``), or (for suffixes such as
``.results.ndjson``) ends with it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _names(text: str, name: str) -> bool:
    if " " in text:  # prose (help text, messages): may name a file in words
        return False
    if name.startswith("."):
        return text.endswith(name)
    return name in text.split("/")


@functools.cache
def _literals(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, text) of every string literal of one module but its docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return tuple((node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs)


def spelled(names: list[str]) -> dict[str, list[str]]:
    """name -> the ``path:line`` of every literal that spells it (only modules whose text holds a name
    are parsed)."""
    found: dict[str, list[str]] = {n: [] for n in names}
    for base in ("attnprobe", "app"):
        for path in sorted((REPO / base).rglob("*.py")):
            if not any(n in path.read_text(encoding="utf-8") for n in names):
                continue
            for line, text in _literals(path):
                for n in names:
                    if _names(text, n):
                        found[n].append(f"{path.relative_to(REPO).as_posix()}:{line}")
    return found


def outside(found: dict[str, list[str]], allowed: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """The hits not in a file (or under a folder) that ``allowed[name]`` lists."""
    return {n: bad for n, hits in found.items()
            if (bad := [h for h in hits if not h.split(":")[0].startswith(allowed.get(n, ()))])}
