"""What the docs and help texts point to exists (issue 38): docs/app.md named modules that do not exist
(``attnprobe.analysis``, ``attnprobe.ibis.report``), docs/methods.md pointed to files outside a clone
(``../shared/seeds/``, DESIGN.md), and help texts cited "issue 30" and "seed 002 E.5" without saying what a
seed is. Read from the files and the real parser; nothing heavy is imported (modules are found by their
source, names by its top-level definitions)."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
DOTTED = re.compile(r"`(attnprobe(?:_hooks|_app)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


@cache
def _top_level_names(origin: str) -> frozenset[str]:
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """``dotted`` is a module, or a module's top-level name (then maybe a class attribute: not checked)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        if i == len(parts):
            return True
        return spec.origin is not None and parts[i] in _top_level_names(spec.origin)
    return False


def test_the_resolver_refuses_what_does_not_exist():
    assert resolves("attnprobe.results.analysis.heatmap") and resolves("attnprobe.io.load_json")
    assert not resolves("attnprobe.analysis.heatmap") and not resolves("attnprobe.ibis.report.compare_rows")
    assert not resolves("attnprobe.results.analysis.no_such_function")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_a_doc_names_exists(doc):
    text = doc.read_text(encoding="utf-8")
    missing = sorted({m.rstrip(".") for m in DOTTED.findall(text) if not resolves(m.rstrip("."))})
    assert missing == []


# Names of files attnprobe writes (not repository files) that methods.md mentions.
OUTPUT_NAMES = {"calls.jsonl", "run.json", "_matched.md", "compare_flips.json", "attention.json", "metrics.json"}
PATHLIKE = re.compile(r"`([A-Za-z0-9_./*-]+\.(?:py|md|json|jsonl|txt|sh|toml|safetensors|html|csv))(?::[^`]*)?`")


@cache
def _repo_files() -> tuple[str, ...]:
    skip = {".git", ".venv", "attnprobe.egg-info", "__pycache__"}
    return tuple(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not skip & set(p.relative_to(ROOT).parts))


def in_repository(path: str) -> bool:
    """A path from the root or docs/, or the tail of a repository file's path (``loop/agents.py``)."""
    if ".." in Path(path).parts:
        return (ROOT / "docs" / path).resolve().is_relative_to(ROOT) and (ROOT / "docs" / path).exists()
    return (ROOT / path).exists() or (ROOT / "docs" / path).exists() or any(
        f == path or f.endswith("/" + path) for f in _repo_files())


def test_methods_points_only_to_files_in_the_repository():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert "../shared" not in text and "DESIGN.md" not in text
    paths = {p for p in PATHLIKE.findall(text) if "*" not in p} - OUTPUT_NAMES
    assert len(paths) > 30  # the code column names files throughout
    assert sorted(p for p in paths if not in_repository(p)) == []
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert sorted(link for link in links if not in_repository(link)) == []


def test_methods_names_each_seed_paper():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    from attnprobe.cli.main import SEEDS

    for title in ("From Inertia to Objectivity: Improving Deep Research Agents with Noise Isolation",
                  "Masking Stale Observations Helps Search Agents -- Until It Doesn't",
                  "Mitigating Context Interference for Reliable and Efficient Search Agents"):
        assert title in text
        assert any(title in t for t in SEEDS.values())
    assert '"seed 002 E.5" is appendix E.5' in text


def _helps():
    import argparse

    from attnprobe.cli.main import build_parser

    def walk(parser, path=()):
        yield " ".join(path) or "attnprobe", parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))

    return dict(walk(build_parser()))


def test_no_help_cites_an_issue_and_every_cited_seed_is_named():
    from attnprobe.cli.main import SEEDS

    helps = _helps()
    assert {c: re.findall(r"\bissues? \d+", " ".join(h.split())) for c, h in helps.items()
            if re.search(r"\bissues? \d+", " ".join(h.split()))} == {}
    body = {c: " ".join(h.split()).split("'seed NNN' cites")[0] for c, h in helps.items()}  # before the note
    cited = {c: sorted(set(re.findall(r"\bseeds? (00\d)", b))) for c, b in body.items()}
    assert cited["study attention"] == ["002"] and "004" in cited["study interference"]
    for command, seeds in cited.items():
        flat = " ".join(helps[command].split())
        for n in seeds:
            assert " ".join(SEEDS[n].split()) in flat, (command, n)
        if seeds:
            assert "'seed 002 E.5': its appendix E.5" in flat, command
