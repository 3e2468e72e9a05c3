"""The layout promises of docs/architecture.md, checked on the source tree (no model needed).

- the import contracts in ``.importlinter`` hold (layers, hooks below capture, executors that know no
  study, studies independent of each other); ``lint-imports`` in .ci/run checks the same file;
- the import graph of attnprobe / attnprobe_hooks / attnprobe_app is acyclic (function-level imports
  count: a lazy import is still a dependency);
- no module hands data between functions through a module-level global (``global`` statements);
- a capture backend is chosen only through the registry (no ``backend == "..."`` branches elsewhere);
- every package folder is listed in pyproject.toml (else a non-editable install misses it).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from support.paths import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR = PYPROJECT["tool"]["setuptools"]["package-dir"]
CODE_ROOTS = {name: ROOT / folder for name, folder in PACKAGE_DIR.items() if name != "attnprobe_data"}


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for name, folder in CODE_ROOTS.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            parts = [name] + [p for p in rel.parts if p != "__init__"]
            out[".".join(parts)] = (f, f.name == "__init__.py")
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (f, is_pkg) in mods.items():
        pkg = m if is_pkg else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != m:
                    graph[m].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_import_contracts_hold():
    # In a subprocess: import-linter configures logging (dictConfig), which would silence this
    # process's existing loggers for every later test.
    import subprocess

    r = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                        f"sys.exit(lint_imports(config_filename={str(ROOT / '.importlinter')!r}, no_cache=True))"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_counterfactual_is_a_stage_below_the_studies():
    """Counterfactual is a stage, not a study: its own layer between the studies and ``agents`` in .importlinter
    and off the independence contract, so the loop study imports it directly (no callback handed in by the
    CLI) and nothing else reaches into capture.api's private names."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    layers = [x.strip() for x in cfg["importlinter:contract:pipeline"]["layers"].strip().splitlines()]
    i = layers.index("attnprobe.counterfactual")
    assert layers[i - 1] == "attnprobe.studies | attnprobe.distributed" and layers[i + 1] == "attnprobe.agents"
    assert "attnprobe.counterfactual" not in cfg["importlinter:contract:studies-independent"]["modules"]
    executors = cfg["importlinter:contract:executors-know-no-study"]
    assert "attnprobe.generation" in executors["forbidden_modules"].split()  # a chat job wraps its own model
    graph = import_graph()
    assert "attnprobe.counterfactual.study" in graph["attnprobe.studies.loop.attention_study"]  # its one door
    source = "\n".join(p.read_text() for root in CODE_ROOTS.values() for p in root.rglob("*.py"))
    assert "CounterfactualRunner" not in source
    assert not re.search(r"from attnprobe\.capture\.api import \(?\s*_", source)


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 40  # the walk really saw the tree
    assert "attnprobe.capture.api" in graph and "attnprobe_hooks.scoring" in graph
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_no_module_global_hand_over():
    offenders = []
    for m, (f, _) in modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Global):
                offenders.append(f"{m}:{node.lineno} global {', '.join(node.names)}")
    assert not offenders, "module-level state written from functions:\n" + "\n".join(offenders)


def test_backends_only_through_the_registry():
    """No `backend == "vllm"`-style branching outside the registry module."""
    pattern = re.compile(r"""backend\s*(==|!=|in)\s*[\("']+(transformers|vllm)""")
    offenders = []
    for m, (f, _) in modules().items():
        if m == "attnprobe_hooks.backend":
            continue
        for i, line in enumerate(f.read_text().splitlines(), start=1):
            if pattern.search(line):
                offenders.append(f"{m}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _shipped_folders() -> dict[str, Path]:
    """Every folder a wheel must carry, by its package name: folders with Python modules under the
    code roots, and folders holding data (templates, shipped trajectories) anywhere under the package dirs."""
    out = {}
    for name, folder in PACKAGE_DIR.items():
        root = ROOT / folder
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            rel = d.relative_to(root).parts
            if any(part.startswith((".", "__")) for part in rel):
                continue
            files = [f for f in d.iterdir() if f.is_file() and f.suffix not in (".pyc",)]
            if files:
                out[".".join((name, *rel))] = d
    return out


def test_every_package_folder_is_installed():
    """Every folder with modules or data is a listed package (setuptools warns about, and will drop,
    data folders that are not), and every listed package exists."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set(_shipped_folders())
    assert found - listed == set(), f"package folders missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but absent: {sorted(listed - found)}"
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for pkg, folder in _shipped_folders().items():
        if not (folder / "__init__.py").exists():  # a data folder: its files are package data
            assert pkg in data, f"{pkg}: a data folder without package-data patterns"


def test_shipped_data_is_package_data():
    from attnprobe.resources import SAMPLE_TRAJECTORIES, data_path

    data_root = ROOT / PACKAGE_DIR["attnprobe_data"]
    shipped = set()
    for pkg, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        if pkg == "attnprobe_data" or pkg.startswith("attnprobe_data."):
            folder = data_root.joinpath(*pkg.split(".")[1:])
            shipped |= {p.relative_to(data_root) for pat in patterns for p in folder.glob(pat)}
    for name in (*SAMPLE_TRAJECTORIES, "ibis_items.jsonl", "questions.jsonl", "corpus/docs.jsonl"):
        assert Path(name) in shipped, name
        assert data_path(*name.split("/")).is_file()


def test_capture_folder_names_are_spelled_only_in_its_layout():
    """Issue 39: the capture folder is the main product; its file names are spelled once, in
    ``results/layout.py`` (``CaptureLayout``), and ``errors.jsonl`` once, in ``io/errlog.py``."""
    where: dict[str, list[str]] = {}
    for root in CODE_ROOTS.values():
        for f in root.rglob("*.py"):
            text = f.read_text()
            for name in ("meta.json", "text.json", "scores.safetensors", "qk.safetensors", "errors.jsonl"):
                if re.search(rf"[\"']{re.escape(name)}[\"']", text):
                    where.setdefault(name, []).append(str(f.relative_to(ROOT)))
    assert where == {**{n: ["attnprobe/results/layout.py"] for n in
                        ("meta.json", "text.json", "scores.safetensors", "qk.safetensors")},
                     "errors.jsonl": ["attnprobe/io/errlog.py"]}


def test_executors_are_built_in_the_executor_layer_and_the_cli_adapter_only():
    """Issue 39: a study builds no executor (an API caller's loaded model: execution.local.in_process); the CLI
    picks every executor through cli/adapter.py's one function and never branches on the cluster option;
    the commands' options are declared on records (at most 20 hand-written add_argument calls in the CLI)."""
    allowed = ("attnprobe/execution/", "attnprobe/distributed/", "attnprobe/cli/adapter.py")
    builders = re.compile(r"\b(LocalExecutor|RayExecutor|open_executor)\(")
    found = [f"{p.relative_to(ROOT).as_posix()}:{n}" for root in CODE_ROOTS.values() for p in sorted(root.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if builders.search(line) and not p.relative_to(ROOT).as_posix().startswith(allowed)
             and not line.lstrip().startswith(("def ", "#"))]
    outside_cli = [f for f in found if not f.startswith("attnprobe/cli/")]
    assert outside_cli == []
    for f in found:  # a command module asks the adapter (its open_executor), never builds one itself
        assert "from attnprobe.cli.adapter import open_executor" in (ROOT / f.split(":")[0]).read_text(), f
    cli = ROOT / "attnprobe" / "cli"
    text = {p.name: p.read_text() for p in cli.glob("*.py")}
    assert not [n for n, t in text.items() if n != "options.py" and re.search(r"cluster_options\(args\) is", t)]
    assert sum(t.count("add_argument(") for t in text.values()) <= 20
