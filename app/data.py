"""Data access for the app: everything it reads goes through here.

Rules (DESIGN section 12): the app reads only inside its data directory (every path is resolved,
symlinks included, and must stay inside it), and it reads only JSON and safetensors.
No Streamlit import here, so this module is testable and reusable on its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.results.result import META_FILE, SCORES_FILE, TEXT_FILE, CaptureResult

ENV_DATA = "ATTNPROBE_APP_DATA"
MAX_JSON_BYTES = 512 * 1024 * 1024  # refuse absurd JSON files instead of exhausting memory
IBIS_MARKERS = ("decisions.jsonl", "attention.json", "metrics.json")


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
    root = Path(root).resolve()
    s = os.fspath(rel)
    if "\x00" in s:
        raise PathEscapeError("path contains a NUL byte")
    cand = (root / s).resolve()  # an absolute ``s`` replaces root here, then gets checked
    if cand != root and root not in cand.parents:
        raise PathEscapeError(f"refused '{s}': it is outside the data directory {root} (the app only reads "
                              f"inside its data directory)")
    return cand


def rel_to(root: Path, path: Path) -> str:
    r = Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    return "." if r == "" else r


def read_json(root: Path, rel: str | os.PathLike) -> Any:
    path = resolve_inside(root, rel)
    if not path.is_file():
        raise DataError(f"{rel_to(root, path)}: file not found")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DataError(f"{rel_to(root, path)}: larger than {MAX_JSON_BYTES >> 20} MiB, not read")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{rel_to(root, path)}: corrupt JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                        ) from None
    except UnicodeDecodeError:
        raise DataError(f"{rel_to(root, path)}: not UTF-8 text") from None


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

    path = resolve_inside(root, rel)
    if not path.is_file():
        raise DataError(f"{rel_to(root, path)}: file not found")
    try:
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

    @property
    def label(self) -> str:
        return f"{self.trajectory_id} · {self.model} · {self.num_turns} turns ({self.rel})"


@dataclass
class Inventory:
    root: Path
    captures: list[CaptureEntry] = field(default_factory=list)
    ibis: list[str] = field(default_factory=list)      # IBIS model folders (relative)
    compares: list[str] = field(default_factory=list)  # folders with compare.json
    problems: list[str] = field(default_factory=list)  # unreadable things, shown to the user

    @property
    def empty(self) -> bool:
        return not (self.captures or self.ibis or self.compares)


def _is_ibis_folder(names: set[str]) -> bool:
    return "items.jsonl" in names and any(m in names for m in IBIS_MARKERS)


def discover(root: Path, max_dirs: int = 200_000) -> Inventory:
    """Walk ``root`` (without following symlinked folders) for captures, IBIS model folders and
    compare outputs. Unreadable candidates are listed in ``problems``; nothing here raises."""
    root = Path(root).resolve()
    inv = Inventory(root)
    ibis_dirs: list[Path] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        seen += 1
        if seen > max_dirs:
            inv.problems.append(f"stopped scanning after {max_dirs} folders; point --data at a smaller folder")
            break
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        d = Path(dirpath)
        names = set(filenames)
        rel = rel_to(root, d)
        if _is_ibis_folder(names):
            inv.ibis.append(rel)
            ibis_dirs.append(d)
        if "compare.json" in names:
            inv.compares.append(rel)
        if META_FILE in names:
            try:
                meta = read_json(root, Path(rel) / META_FILE)
            except DataError as exc:
                inv.problems.append(str(exc))
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
                    mtime=(d / META_FILE).stat().st_mtime))
            except (TypeError, ValueError) as exc:
                inv.problems.append(f"{rel}/{META_FILE}: malformed capture metadata ({exc})")
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
    if not (folder / SCORES_FILE).is_file():
        raise DataError(f"{rel}: incomplete capture ({SCORES_FILE} is missing)")
    try:
        return CaptureResult.load(folder)
    except AttnprobeError as exc:
        raise DataError(str(exc).replace(str(root), "<data>")) from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DataError(f"{rel}: malformed capture ({type(exc).__name__}: {exc})") from None


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
    folder = Path(rel)
    problems: list[str] = []
    items, p = read_jsonl(root, folder / "items.jsonl")
    problems += p
    decisions, p = read_jsonl(root, folder / "decisions.jsonl")
    problems += p
    latest: dict[tuple, dict] = {}
    for d in decisions:
        if "item_id" in d and "framing" in d:
            latest[(d["item_id"], d["framing"])] = d  # a rerun appends newer records
    metrics = index = arrays = None
    run: dict = {}
    for name in ("metrics.json", "run.json"):
        if resolve_inside(root, folder / name).is_file():
            try:
                obj = read_json(root, folder / name)
                if not isinstance(obj, dict):
                    raise DataError(f"{folder / name}: expected a JSON object")
                if name == "metrics.json":
                    metrics = obj
                else:
                    run = obj
            except DataError as exc:
                problems.append(str(exc))
    if resolve_inside(root, folder / "attention.json").is_file():
        try:
            index = read_json(root, folder / "attention.json")
            arrays = read_safetensors(root, folder / "attention.safetensors")
            n = len(index["items"])
            for fr in index["framings"]:
                shp = arrays[f"mass.{fr}"].shape
                if shp[:2] != (n, len(index["categories"])):
                    raise DataError(f"{folder}/attention.safetensors: mass.{fr} has shape {shp}, expected "
                                    f"({n}, {len(index['categories'])}, layers, heads)")
        except DataError as exc:
            problems.append(str(exc))
            index = arrays = None
        except (KeyError, TypeError) as exc:
            problems.append(f"{folder}/attention.json: malformed ({type(exc).__name__}: {exc})")
            index = arrays = None
    return IbisFolder(rel, items, list(latest.values()), metrics, index, arrays, run, problems)


def load_compare(root: Path, rel: str) -> list[dict]:
    rows = read_json(root, Path(rel) / "compare.json")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{rel}/compare.json: expected a list of rows (one per model)")
    return rows
