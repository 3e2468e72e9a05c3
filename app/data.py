"""Data access for the app: everything it reads goes through here.

Rules (DESIGN section 12): the app reads only inside its data directory (every path is resolved,
symlinks included, and must stay inside it), and it reads only JSON and safetensors. JSON goes
through :func:`attnprobe.io.load_json` (files over ``attnprobe.io.MAX_JSON_BYTES`` = 64 MiB are refused
unread, nesting deeper than ``MAX_JSON_DEPTH`` = 100 is refused), so one hostile file costs its own
entry, never a page. No Streamlit import here, so this module is testable and reusable on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.counterfactual.layout import CounterfactualLayout
from attnprobe.errors import AttnprobeError
from attnprobe.results.result import META_FILE, SCORES_FILE, TEXT_FILE, CaptureResult
from attnprobe.studies.ibis.layout import WATCHED, CompareLayout, ModelFolderLayout
from attnprobe.studies.loop.layout import StudyLayout

ENV_DATA = "ATTNPROBE_APP_DATA"
IBIS_WATCHED = WATCHED  # the files whose times key the app's cache of an IBIS folder (common.ibis)


class DataError(AttnprobeError):
    """Something in the data directory cannot be shown; the message says what and where."""


class PathEscapeError(DataError):
    """A requested path points outside the data directory."""


# ------------------------------------------------------------------ paths
def data_root(path: str | os.PathLike | None) -> Path:
    """The resolved data directory, or a DataError saying why it cannot be used."""
    if path is None or str(path).strip() == "":
        raise DataError("no data directory configured: start the app with 'attnprobe app --data DIR' "
                        f"(or set {ENV_DATA})")
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(f"data directory {root} does not exist")
    if not root.is_dir():
        raise DataError(f"data directory {root} is not a folder")
    return root.resolve()


def resolve_inside(root: Path, rel: str | os.PathLike) -> Path:
    """Resolve ``rel`` (relative to ``root``, or absolute) and refuse anything outside ``root``.

    Symlinks are resolved first, so a link inside the folder that points elsewhere is refused too.
    """
    from attnprobe.io import OutsideFolder, resolved_inside

    try:
        return resolved_inside(root, rel)  # the one rule, shared with every study's Layout (root given)
    except OutsideFolder as exc:
        why = str(exc)
        raise PathEscapeError(why + (" (the app only reads inside its data directory)" if why.startswith("refused")
                                     else "")) from None


def rel_to(root: Path, path: Path) -> str:
    r = Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    return "." if r == "" else r


def read_json(root: Path, rel: str | os.PathLike) -> Any:
    """One JSON file inside ``root`` through attnprobe's one loader (size cap, depth limit, UTF-8); a
    DataError naming the file (relative to the data directory) on anything wrong."""
    from attnprobe.io import load_json

    path = resolve_inside(root, rel)
    where = rel_to(root, path)

    def error(message: str, path=None, line: int | None = None) -> DataError:
        return DataError(f"{where}, line {line}: {message}" if line is not None else f"{where}: {message}")

    if not path.exists():
        raise error("file not found")
    return load_json(path, error=error)  # refuses a folder, FIFO or device in place of the file, unopened  # size, depth, UTF-8 and I/O errors all come back as DataError


def read_jsonl(root: Path, rel: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """(records, problems) through attnprobe's one JSON Lines reader: a torn last line (a crash
    mid-append) is skipped; a corrupt line or a non-object is reported and ends the read there."""
    from attnprobe.io import read_jsonl as _read

    path = resolve_inside(root, rel)
    out: list[dict] = []
    if not path.is_file():
        return out, []
    where = rel_to(root, path)
    try:
        for i, rec in _read(path, torn_tail="skip", error=lambda msg, path, line: DataError(f"{where} line {line}: {msg}")):
            if not isinstance(rec, dict):
                return out, [f"{where} line {i}: not a JSON object"]
            out.append(rec)
    except DataError as exc:
        return out, [str(exc)]
    return out, []


def read_safetensors(root: Path, rel: str | os.PathLike) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    from attnprobe.io import check_regular_file

    path = resolve_inside(root, rel)
    if not path.exists():
        raise DataError(f"{rel_to(root, path)}: file not found")
    try:
        check_regular_file(path)  # safetensors opens it blocking: a FIFO would hang the page
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise DataError(f"{rel_to(root, path)}: cannot read safetensors ({exc})") from None


# ------------------------------------------------------------------ discovery
@dataclass
class CaptureEntry:
    rel: str
    trajectory_id: str
    model: str
    framing: str
    num_turns: int
    num_tokens: int
    num_queries: int
    layers: int
    ibis: bool  # a decision capture inside an IBIS model folder
    mtime: float
    study: str = ""  # the study folder (with study.json) this per-call capture belongs to, else ""

    @property
    def label(self) -> str:
        where = f"study {self.study} · " if self.study else ""
        return f"{where}{self.trajectory_id} · {self.model} · {self.num_turns} turns ({self.rel})"


@dataclass
class Inventory:
    root: Path
    captures: list[CaptureEntry] = field(default_factory=list)
    ibis: list[str] = field(default_factory=list)      # IBIS model folders (relative)
    compares: list[str] = field(default_factory=list)  # folders with compare.json
    studies: list[str] = field(default_factory=list)   # folders with study.json (attnprobe study interference)
    problems: list[str] = field(default_factory=list)  # unreadable things, shown to the user

    def trajectory_captures(self, *, ibis: bool = False, studies: bool = False) -> list[CaptureEntry]:
        """The captures a picker offers: a study's per-call captures (dozens per study; the Study page
        shows them by step) and IBIS decision captures only when asked for."""
        return [e for e in self.captures if (ibis or not e.ibis) and (studies or not e.study)]

    @property
    def empty(self) -> bool:
        return not (self.captures or self.ibis or self.compares or self.studies)


def discover(root: Path, max_dirs: int = 200_000) -> Inventory:
    """Walk ``root`` (without following symlinked folders) for captures, IBIS model folders, compare
    outputs and interference studies. Unreadable candidates are listed in ``problems``; nothing here raises."""
    root = Path(root).resolve()
    inv = Inventory(root)
    ibis_dirs: list[Path] = []
    study_dirs: list[Path] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        seen += 1
        if seen > max_dirs:
            inv.problems.append(f"stopped scanning after {max_dirs} folders; point --data at a smaller folder")
            break
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        d = Path(dirpath)
        names = set(filenames)
        if CounterfactualLayout.is_folder(names):
            dirnames[:] = []  # a counterfactual step (its own page); its original/ and counterfactual/ captures
            continue
        rel = rel_to(root, d)
        if ModelFolderLayout.is_folder(names):
            inv.ibis.append(rel)
            ibis_dirs.append(d)
        if CompareLayout.is_folder(names):
            inv.compares.append(rel)
        if StudyLayout.is_folder(names):
            inv.studies.append(rel)  # read (and refused if bad) by the Study page
            study_dirs.append(d)
        if META_FILE in names:
            try:
                meta = read_json(root, Path(rel) / META_FILE)
            except DataError as exc:
                inv.problems.append(f"unreadable: {exc}")
                continue
            if not isinstance(meta, dict) or "format_version" not in meta or "trajectory_id" not in meta:
                continue  # some other tool's meta.json: not ours, not a problem
            try:
                inv.captures.append(CaptureEntry(
                    rel=rel, trajectory_id=str(meta["trajectory_id"]), model=str(meta.get("model", "?")),
                    framing=str(meta.get("framing") or (meta.get("ibis") or {}).get("framing") or ""),
                    num_turns=int(meta.get("num_turns", 0)), num_tokens=int(meta.get("num_tokens", 0)),
                    num_queries=len(meta.get("queries", [])), layers=len(meta.get("layers", [])),
                    ibis=any(p == d or p in d.parents for p in ibis_dirs),
                    mtime=(d / META_FILE).stat().st_mtime,
                    study=next((rel_to(root, p) for p in reversed(study_dirs) if p in d.parents), "")))
            except (TypeError, ValueError, OSError) as exc:
                inv.problems.append(f"unreadable: {rel}/{META_FILE}: malformed capture metadata ({exc})")
    return inv


# ------------------------------------------------------------------ captures
def load_capture(root: Path, rel: str) -> CaptureResult:
    """Load one capture folder inside ``root``; a DataError (never a crash) on anything wrong."""
    folder = resolve_inside(root, rel)
    for name in (META_FILE, SCORES_FILE, TEXT_FILE):
        p = folder / name
        if p.exists() or p.is_symlink():
            resolve_inside(root, p)  # a symlinked file pointing outside is refused
    if not (folder / META_FILE).is_file():
        raise DataError(f"{rel}: not a capture folder (no {META_FILE})")
    read_json(root, Path(rel) / META_FILE)  # size and depth limits before CaptureResult parses it
    if not (folder / SCORES_FILE).exists():
        raise DataError(f"{rel}: incomplete capture ({SCORES_FILE} is missing)")
    try:
        res = CaptureResult.load(folder)
    except AttnprobeError as exc:
        raise DataError(str(exc).replace(str(root), "<data>")) from None
    except (KeyError, TypeError, ValueError, IndexError, RecursionError, OSError) as exc:
        raise DataError(f"{rel}: malformed capture ({type(exc).__name__}: {exc})") from None
    problem = capture_problem(res)
    if problem:
        raise DataError(f"{rel}: inconsistent capture: {problem}")
    return res


def capture_problem(res: CaptureResult) -> str | None:
    """The first way the arrays and metadata of ``res`` disagree (the pages index one with the
    other), or None. CaptureResult.load checks only the score shapes against queries x segments."""
    from attnprobe.render.segments import AUTHORS, ROLES

    ids = np.asarray(res.input_ids)
    if ids.ndim != 1:
        return f"input_ids has shape {ids.shape}, expected one row of token ids"
    n, nq, ns, nl = len(ids), len(res.queries), len(res.segments), len(res.layers)
    claimed = res.meta.get("num_tokens")
    if claimed is not None and claimed != n:
        return f"meta.json says num_tokens {claimed!r} but scores.safetensors holds {n} input_ids"
    if not res.segments:
        return "no segments"
    for i, s in enumerate(res.segments):
        if not (0 <= s.start <= s.end <= n) or s.turn < 0:
            return f"segments[{i}] spans tokens [{s.start}, {s.end}) of turn {s.turn}, outside the {n} tokens"
        if s.role not in ROLES or s.author not in AUTHORS:
            return (f"segments[{i}] has role {s.role!r} / author {s.author!r} (known: {', '.join(ROLES)} / "
                    f"{', '.join(AUTHORS)})")
    turns = res.num_turns
    claimed = res.meta.get("num_turns")
    if claimed is not None and claimed != turns:
        return f"meta.json says num_turns {claimed!r} but the segments cover {turns} turns"
    for i, q in enumerate(res.queries):
        if not (0 <= q.position < n) or not (0 <= q.turn < turns):
            return f"queries[{i}] is token {q.position} of turn {q.turn}, outside the {n} tokens / {turns} turns"
    lh = res.layer_head_attention
    if lh.shape[1] != nl or lh.shape[2] < 1:
        return f"layer_head_attention has shape {lh.shape}, expected ({nq}, {nl} layers, heads, {ns})"
    if len(set(res.layers)) != nl:
        return f"layers {res.layers} repeat a layer"
    if res.token_attention.shape != (nq, n):
        return f"token_attention has shape {res.token_attention.shape}, expected ({nq} queries, {n} tokens)"
    if res.offsets is not None and (res.offsets.ndim != 2 or res.offsets.shape[1] != 2 or len(res.offsets) < n):
        return f"offsets has shape {res.offsets.shape}, expected ({n} tokens, 2)"
    for name in ("segment_attention", "layer_head_attention", "token_attention"):  # one NaN blanks every mean
        arr = np.asarray(getattr(res, name))
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr))) if arr.dtype.kind == "f" else 0
        if bad:
            return f"{name} holds {bad} NaN or infinite value{'s' if bad > 1 else ''} (left out of every number)"
    return None


# ------------------------------------------------------------------ IBIS
@dataclass
class IbisFolder:
    rel: str
    items: list[dict]
    decisions: list[dict]
    metrics: dict | None
    attention_index: dict | None
    attention: dict[str, np.ndarray] | None
    run: dict
    problems: list[str]

    @property
    def model(self) -> str:
        return str((self.metrics or {}).get("model") or self.run.get("model") or Path(self.rel).name)


def load_ibis(root: Path, rel: str) -> IbisFolder:
    """One IBIS model folder read through :class:`ModelFolderLayout` (the study's own readers and
    validation, every path kept inside ``root``); each unreadable file is one line in ``problems``."""
    resolve_inside(root, rel)  # the folder itself: PathEscapeError, the page's one line
    layout = ModelFolderLayout(Path(rel), root)
    problems: list[str] = []
    items = layout.read_item_records(problems)
    decisions = layout.read_decisions(problems)  # the latest per (item, framing): a rerun appends newer records
    metrics = index = arrays = None
    run: dict = {}
    try:
        metrics = layout.read_metrics()
    except AttnprobeError as exc:
        problems.append(str(exc))
    try:
        run = layout.read_run()
    except AttnprobeError as exc:
        problems.append(str(exc))
    try:
        index, arrays = layout.read_attention() or (None, None)
    except AttnprobeError as exc:
        problems.append(str(exc))
    return IbisFolder(rel, items, decisions, metrics, index, arrays, run, problems)


def load_compare(root: Path, rel: str) -> list[dict]:
    resolve_inside(root, rel)
    try:
        return CompareLayout(Path(rel), root).read_rows()
    except AttnprobeError as exc:
        raise DataError(str(exc)) from None
