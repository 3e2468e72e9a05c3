"""The IBIS model folder and the comparison folder: the one module that spells their file names.

A model folder (``<results>/<model>[__<dtype>][__matched]``, :mod:`.folder`) holds ``items.jsonl`` (the
items run there), ``framings.jsonl``, ``run.json`` (model, protocol, variant, stages), ``decisions.jsonl``
(behaviour, one writer), ``captures/<item>/<framing>/`` (one capture per pair), ``attention.json`` +
``attention.safetensors`` (the aggregate), ``metrics.json``, ``report.md`` / ``report.html`` and the
executors' ``errors.jsonl``. A comparison folder (``attnprobe compare --out``) holds ``compare.json``,
``compare_flips.json``, ``compare.md`` and ``compare.html``.

The study code, ``attnprobe ibis`` / ``attnprobe compare`` and the app ask :class:`ModelFolderLayout` /
:class:`CompareLayout` for paths, read through their readers and validate with the same ``problem``:
the app (``root`` given) and the CLI (no ``root``) cannot disagree on what a folder holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import ERRORS_FILE, load_json, read_jsonl
from attnprobe.io.layout import FolderLayout
from attnprobe.studies.ibis.framings import PROTOCOLS, IbisProtocol

ITEMS_FILE = "items.jsonl"
FRAMINGS_FILE = "framings.jsonl"
RUN_FILE = "run.json"
DECISIONS_FILE = "decisions.jsonl"
CAPTURES_DIR = "captures"
ATTENTION_INDEX = "attention.json"
ATTENTION_ARRAYS = "attention.safetensors"
METRICS_FILE = "metrics.json"
REPORT_MD, REPORT_HTML = "report.md", "report.html"
# a folder with items.jsonl and one of these is a model folder (app discovery)
MARKERS = (DECISIONS_FILE, ATTENTION_INDEX, METRICS_FILE)
# the files whose times key the app's cache of a loaded folder
WATCHED = (ITEMS_FILE, DECISIONS_FILE, METRICS_FILE, ATTENTION_INDEX, ATTENTION_ARRAYS)

COMPARE_JSON, COMPARE_FLIPS_JSON = "compare.json", "compare_flips.json"
COMPARE_MD, COMPARE_HTML = "compare.md", "compare.html"

# run.json's fields the code reads, with the type each must have when present
_RUN_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("model", (str,), "a string"), ("protocol", (str,), "a string"), ("reminder", (str, type(None)), "a string"),
    ("variant", (dict,), "an object"), ("stages", (dict,), "an object"), ("items_sha256", (str,), "a string"))


def _error(where: str):
    return lambda message, path=None, line=None: AttnprobeError(
        f"{where}, line {line}: {message}" if line is not None else f"{where}: {message}")


@dataclass(frozen=True)
class _Layout(FolderLayout):
    """Paths checked by :func:`attnprobe.io.layout_path` (inside ``root`` for the app, no symlink below
    ``folder`` for the CLI), errors naming the file relative to ``root`` when there is one."""

    def read_object(self, name: str, *, missing: Any = None) -> Any:
        """One JSON object file of the folder (``missing`` when absent) through the one JSON loader (size,
        depth, UTF-8); one AttnprobeError naming the file otherwise."""
        path = self.path(name)
        if not (path.exists() or path.is_symlink()):
            return missing
        obj = load_json(path, error=_error(self.where(path)))
        if not isinstance(obj, dict):
            raise AttnprobeError(f"{self.where(path)}: expected a JSON object, got {type(obj).__name__}")
        return obj

    def read_lines(self, name: str, problems: list[str] | None = None) -> list[dict]:
        """The object records of a JSON Lines file ([] when absent; a torn last line is skipped). A corrupt
        line or a non-object raises, or, with ``problems`` (the app), is listed there and ends the read."""
        path = self.path(name)
        out: list[dict] = []
        where = self.where(path)
        try:
            for i, rec in read_jsonl(path, torn_tail="skip", missing_ok=True, error=_error(where)):
                if not isinstance(rec, dict):
                    raise AttnprobeError(f"{where}, line {i}: not a JSON object")
                out.append(rec)
        except AttnprobeError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
        return out


@dataclass(frozen=True)
class ModelFolderLayout(_Layout):
    """One IBIS model folder."""

    @staticmethod
    def is_folder(names: Iterable[str]) -> bool:
        """A model folder: items.jsonl and decisions, attention or metrics (app discovery)."""
        names = set(names)
        return ITEMS_FILE in names and any(m in names for m in MARKERS)

    # ---------------------------------------------------------------- paths
    @property
    def items(self) -> Path:
        return self.path(ITEMS_FILE)

    @property
    def framings(self) -> Path:
        return self.path(FRAMINGS_FILE)

    @property
    def run(self) -> Path:
        return self.path(RUN_FILE)

    @property
    def decisions(self) -> Path:
        return self.path(DECISIONS_FILE)

    @property
    def captures(self) -> Path:
        return self.path(CAPTURES_DIR)

    def capture(self, item_id: str, framing: str) -> Path:
        """``captures/<item>/<framing>/``: one pair's capture."""
        return self.path(CAPTURES_DIR, item_id, framing)

    @property
    def attention_index(self) -> Path:
        return self.path(ATTENTION_INDEX)

    @property
    def attention_arrays(self) -> Path:
        return self.path(ATTENTION_ARRAYS)

    @property
    def metrics(self) -> Path:
        return self.path(METRICS_FILE)

    @property
    def report_md(self) -> Path:
        return self.path(REPORT_MD)

    @property
    def report_html(self) -> Path:
        return self.path(REPORT_HTML)

    @property
    def errors(self) -> Path:
        return self.path(ERRORS_FILE)

    # ---------------------------------------------------------------- validation
    @staticmethod
    def problem(run: Any) -> str | None:
        """Why ``run`` (a parsed run.json) cannot be used, naming the field; None when it can. Checks every
        field the study and the app read: an object; model / protocol / reminder / items_sha256 strings,
        variant and stages objects (when present); the protocol one of :data:`PROTOCOLS`."""
        if not isinstance(run, dict):
            return f"expected a JSON object, got {type(run).__name__}"
        for key, types, kind in _RUN_FIELDS:
            if key in run and not isinstance(run[key], types):
                return f"field '{key}' is {type(run[key]).__name__}, not {kind}"
        if "protocol" in run and run["protocol"] not in PROTOCOLS:
            return f"field 'protocol' is {run['protocol']!r}, not one of {', '.join(PROTOCOLS)}"
        return None

    # ---------------------------------------------------------------- readers
    def read_run(self) -> dict:
        """run.json ({} when there is none), refused with one line naming the field when :meth:`problem`."""
        run = self.read_object(RUN_FILE, missing={})
        problem = self.problem(run)
        if problem:
            raise AttnprobeError(f"{self.where(self.run)}: {problem}")
        return run

    def protocol(self, run: dict | None = None) -> str:
        """The folder's protocol; a folder made before protocols existed holds the matched layout."""
        return (self.read_run() if run is None else run).get("protocol", "matched")

    def ibis_protocol(self, run: dict | None = None) -> IbisProtocol:
        """The folder's protocol and the reminder its run recorded (a folder without one: the protocol's
        default), so a report re-aggregates the captures with the framings they were made from."""
        run = self.read_run() if run is None else run
        try:
            return IbisProtocol(self.protocol(run), run.get("reminder"))
        except ValueError:  # a reminder this protocol does not take (a hand-edited run.json): its default
            return IbisProtocol(self.protocol(run))

    def read_metrics(self) -> dict | None:
        return self.read_object(METRICS_FILE)

    def read_items(self) -> list:
        """items.jsonl as validated items (:func:`~attnprobe.studies.ibis.items.load_items`); the study's
        reader. The app shows the records as they are (:meth:`read_item_records`)."""
        from attnprobe.studies.ibis.items import load_items

        path = self.items
        if not path.is_file():
            raise AttnprobeError(f"{self.where(self.folder)}: no {ITEMS_FILE} (not an IBIS model folder; run "
                                 "'attnprobe ibis run' first)")
        return load_items(path)

    def read_item_records(self, problems: list[str] | None = None) -> list[dict]:
        return self.read_lines(ITEMS_FILE, problems)

    def read_decisions(self, problems: list[str] | None = None) -> list[dict]:
        """The latest record per (item, framing) of decisions.jsonl (a rerun with --force appends newer
        ones), as written (the app shows them so; the metrics read both readouts of each,
        :func:`~attnprobe.studies.ibis.behaviour.read_decisions`). With ``problems`` (the app) a bad line
        or a record without item_id/framing is listed, not raised."""
        latest: dict[tuple, dict] = {}
        for rec in self.read_lines(DECISIONS_FILE, problems):
            if "item_id" not in rec or "framing" not in rec:
                msg = f"{self.where(self.decisions)}: a record without item_id or framing"
                if problems is None:
                    raise AttnprobeError(msg)
                problems.append(msg)
                continue
            latest[(rec["item_id"], rec["framing"])] = rec
        return list(latest.values())

    def attention_problem(self, index: Any, arrays: dict) -> str | None:
        """Why attention.json and attention.safetensors disagree (None: they agree): every framing's
        ``mass.<framing>`` is [items, categories, layers, heads]."""
        if not isinstance(index, dict):
            return f"{self.where(self.attention_index)}: expected a JSON object"
        try:
            n, c = len(index["items"]), len(index["categories"])
            for fr in index["framings"]:
                shp = arrays[f"mass.{fr}"].shape
                if shp[:2] != (n, c):
                    return (f"{self.where(self.attention_arrays)}: mass.{fr} has shape {shp}, expected "
                            f"({n}, {c}, layers, heads)")
        except (KeyError, TypeError) as exc:
            return f"{self.where(self.attention_index)}: malformed ({type(exc).__name__}: {exc})"
        return None

    def read_attention(self) -> tuple[dict, dict] | None:
        """(attention.json, attention.safetensors arrays), None when not aggregated yet; one AttnprobeError
        when unreadable or when they disagree (:meth:`attention_problem`)."""
        from safetensors.numpy import load_file

        from attnprobe.io import check_regular_file

        if not (self.attention_index.exists() or self.attention_index.is_symlink()):
            return None
        index = load_json(self.attention_index, error=_error(self.where(self.attention_index)))
        path = self.attention_arrays
        if not path.exists():
            raise AttnprobeError(f"{self.where(path)}: file not found")
        try:
            check_regular_file(path)  # safetensors opens it blocking: a FIFO would hang
            arrays = load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise AttnprobeError(f"{self.where(path)}: cannot read safetensors ({exc})") from None
        problem = self.attention_problem(index, arrays)
        if problem:
            raise AttnprobeError(problem)
        return index, arrays

    # ---------------------------------------------------------------- done
    def decided(self) -> set[tuple[str, str]]:
        """The (item, framing) pairs decisions.jsonl holds."""
        return {(r["item_id"], r["framing"]) for r in self.read_decisions()}

    @staticmethod
    def decision_done(decided: set[tuple[str, str]], item_id: str, framing: str, since: float | None = None) -> bool:
        """Behaviour's rule: the pair is in ``decided`` (:meth:`decided`, read once per job). With ``since``
        (a retried Ray shard) never: replicas write nothing, the driver appends, so a shard has nothing of
        its own to skip."""
        return since is None and (item_id, framing) in decided

    def capture_done(self, item_id: str, framing: str, since: float | None = None) -> bool:
        """Attention's rule: the pair's capture has its meta.json (written last, atomically), written at or
        after ``since`` when given. Which settings made it is checked once per folder before any model
        loads (``check_settings`` in the capture stage), not per capture."""
        from attnprobe.execution.job import written_since
        from attnprobe.results.result import META_FILE

        return written_since(self.capture(item_id, framing) / META_FILE, since)


@dataclass(frozen=True)
class CompareLayout(_Layout):
    """The folder ``attnprobe compare`` writes."""

    @staticmethod
    def is_folder(names: Iterable[str]) -> bool:
        return COMPARE_JSON in set(names)

    @property
    def rows_json(self) -> Path:
        return self.path(COMPARE_JSON)

    @property
    def flips_json(self) -> Path:
        return self.path(COMPARE_FLIPS_JSON)

    @property
    def table_md(self) -> Path:
        return self.path(COMPARE_MD)

    @property
    def page_html(self) -> Path:
        return self.path(COMPARE_HTML)

    @staticmethod
    def problem(rows: Any) -> str | None:
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return "expected a list of rows (one per model)"
        return None

    def read_rows(self) -> list[dict]:
        path = self.rows_json
        if not (path.exists() or path.is_symlink()):
            raise AttnprobeError(f"{self.where(path)}: file not found")
        rows = load_json(path, error=_error(self.where(path)))
        problem = self.problem(rows)
        if problem:
            raise AttnprobeError(f"{self.where(path)}: {problem}")
        return rows


def model_folders(paths: Iterable[os.PathLike | str]) -> list[Path]:
    """Model folders among ``paths``: a folder with metrics.json or items.jsonl, or the model folders
    (with metrics.json) directly inside a results root."""
    out = []
    for p in map(Path, paths):
        if (p / METRICS_FILE).is_file() or (p / ITEMS_FILE).is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.iterdir() if not q.name.startswith(".") and (q / METRICS_FILE).is_file())
        else:
            raise AttnprobeError(f"{p}: not a folder")
    if not out:
        raise AttnprobeError(f"no IBIS model folders (with {METRICS_FILE}) among: " + ", ".join(map(str, paths)))
    return out
