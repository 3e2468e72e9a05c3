"""The counterfactual stage's run folder: the one module that spells its file and folder names.

``OUT/<trajectory>/<policy>/step_<i>/`` (atomic; ``record.json`` written last) holds ``record.json``,
``masses.safetensors`` and the two capture results ``original/`` and ``counterfactual/``; ``OUT``
holds ``summary.json`` and ``summary.md`` (written by the stage, whichever command ran it) and the
executors' ``errors.jsonl``. The stage (:mod:`.store`, :mod:`.job`, :mod:`.summary`), ``attnprobe
counterfactual`` / ``attnprobe report`` and the app's Counterfactual page ask :class:`CounterfactualLayout`
for paths, read steps through it and validate records with its ``problem``
(:func:`~attnprobe.counterfactual.records.record_problem`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import load_json, safe_name, safetensors_problem
from attnprobe.io.layout import FolderLayout
from attnprobe.results.result import META_FILE, SCORES_FILE

RECORD_FILE, MASSES_FILE = "record.json", "masses.safetensors"
ORIGINAL_DIR, COUNTERFACTUAL_DIR = "original", "counterfactual"  # the two captures of a step
STEP_PREFIX = "step_"  # a step folder is step_<message index:04d> (Step.key)
SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"
STEP_FILES = (RECORD_FILE, MASSES_FILE, f"{ORIGINAL_DIR}/{META_FILE}", f"{COUNTERFACTUAL_DIR}/{META_FILE}")
SAFETENSORS_FILES = (MASSES_FILE, f"{ORIGINAL_DIR}/{SCORES_FILE}", f"{COUNTERFACTUAL_DIR}/{SCORES_FILE}")
MASS_ARRAYS = ("mass_original", "mass_counterfactual", "removed_tokens")  # what the app page draws


@dataclass(frozen=True)
class CounterfactualLayout(FolderLayout):
    """A counterfactual run folder ``OUT`` (``folder``). Paths are checked by
    :func:`attnprobe.io.layout_path`: inside ``root`` for the app (the data directory; the app's layout is
    rooted at it and finds the steps anywhere below), with no symlink below ``folder`` otherwise."""

    @staticmethod
    def is_folder(names: Iterable[str]) -> bool:
        """A step folder (its record and masses; app discovery leaves its two captures to the page)."""
        names = set(names)
        return RECORD_FILE in names and MASSES_FILE in names

    # ---------------------------------------------------------------- paths
    @property
    def summary_json(self) -> Path:
        return self.path(SUMMARY_JSON)

    @property
    def summary_md(self) -> Path:
        return self.path(SUMMARY_MD)

    def policy_dir(self, trajectory_id: str, policy: str) -> Path:
        return self.path(safe_name(trajectory_id), safe_name(policy))

    def step_dir(self, step, policy: str) -> Path:
        """``<trajectory>/<policy>/step_<i>/`` of a :class:`~attnprobe.counterfactual.steps.Step`."""
        return self.path(safe_name(step.trajectory.id), safe_name(policy), step.key)

    def record(self, step_folder: str | os.PathLike = ".") -> Path:
        return self.path(step_folder, RECORD_FILE)

    def masses(self, step_folder: str | os.PathLike = ".") -> Path:
        return self.path(step_folder, MASSES_FILE)

    def capture(self, step_folder: str | os.PathLike = ".", side: str = ORIGINAL_DIR) -> Path:
        """One of a step's two captures (``side``: ``original`` or ``counterfactual``)."""
        if side not in (ORIGINAL_DIR, COUNTERFACTUAL_DIR):
            raise ValueError(f"side must be {ORIGINAL_DIR} or {COUNTERFACTUAL_DIR}, not {side!r}")
        return self.path(step_folder, side)

    def step_records(self, trajectory_id: str, policy: str) -> list[Path]:
        """The record files of the finished steps of one (trajectory, policy)."""
        return sorted(self.policy_dir(trajectory_id, policy).glob(f"{STEP_PREFIX}*/{RECORD_FILE}"))

    # ---------------------------------------------------------------- done
    def step_done(self, step, policy: str, settings: dict, since: float | None = None) -> bool:
        """Done: every file of the step folder is there (safetensors complete), its record was made with
        ``settings`` from a trajectory with the same content hash (a changed trajectory is redone), and
        (``since``) it was written at or after that time. An unreadable record means the step is redone."""
        folder = self.step_dir(step, policy)
        path = folder / RECORD_FILE
        if not all((folder / f).is_file() for f in STEP_FILES):
            return False
        if any(safetensors_problem(folder / f) for f in SAFETENSORS_FILES):  # truncated: not done, redone
            return False
        try:
            record = load_json(path)
            if since is not None and path.stat().st_mtime < since:
                return False
        except (AttnprobeError, OSError):  # unreadable (torn, not UTF-8, too large): redo the step
            return False
        return (isinstance(record, dict) and record.get("settings") == settings
                and record.get("trajectory_hash") == step.trajectory.content_hash())

    # ---------------------------------------------------------------- validation and readers
    @staticmethod
    def problem(record: Any, *, app: bool = False) -> str | None:
        """Why a step record cannot be summarised (``app``: or shown); None when it can
        (:func:`~attnprobe.counterfactual.records.record_problem`, the one validator)."""
        from attnprobe.counterfactual.records import record_problem

        return record_problem(record, app=app)

    @staticmethod
    def masses_problem(arrays: dict) -> str | None:
        missing = [k for k in MASS_ARRAYS if k not in arrays]
        return f"missing {', '.join(missing)}" if missing else None

    def read_record(self, step_folder: str | os.PathLike = ".", *, app: bool | None = None) -> dict:
        """A step's record.json through the one JSON loader; with ``app`` set, also refused with one line
        naming the field when :meth:`problem` (``app=True``: the page's fields too)."""
        path = self.record(step_folder)
        where = self.where(path)
        if not (path.exists() or path.is_symlink()):
            raise AttnprobeError(f"{self.where(path.parent)}: not a counterfactual step (no {RECORD_FILE})")
        record = load_json(path, error=lambda message, path=None, line=None: AttnprobeError(
            f"{where}, line {line}: {message}" if line is not None else f"{where}: {message}"))
        if not isinstance(record, dict):
            raise AttnprobeError(f"{where}: not a counterfactual step record")
        if app is not None and (problem := self.problem(record, app=app)):
            raise AttnprobeError(f"{where}: {problem}")
        return record

    def read_masses(self, step_folder: str | os.PathLike = ".", *, check: bool = False) -> dict:
        """A step's masses.safetensors (``check``: refused when an array the page draws is missing)."""
        from safetensors.numpy import load_file

        from attnprobe.io import check_regular_file

        path = self.masses(step_folder)
        if not path.exists():
            raise AttnprobeError(f"{self.where(path)}: file not found")
        try:
            check_regular_file(path)  # safetensors opens it blocking: a FIFO would hang
            arrays = load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise AttnprobeError(f"{self.where(path)}: cannot read safetensors ({exc})") from None
        if check and (problem := self.masses_problem(arrays)):
            raise AttnprobeError(f"{self.where(path)}: {problem}")
        return arrays

    def find_steps(self, limit: int = 5000) -> tuple[list[str], list[tuple[str, str]]]:
        """(step folders ``.../<trajectory>/<policy>/step_*`` holding a record anywhere below ``folder``,
        relative to it; problems). Symlinked folders are not followed; a symlinked step folder is listed
        as a problem."""
        def rel(p: Path) -> str:
            r = p.relative_to(self.folder).as_posix()
            return "." if r == "" else r

        out: list[str] = []
        problems: list[tuple[str, str]] = []
        for dirpath, dirnames, filenames in os.walk(self.folder, followlinks=False):
            here = Path(dirpath)
            for d in sorted(dirnames):
                if d.startswith(STEP_PREFIX) and (here / d).is_symlink():
                    problems.append((rel(here) + "/" + d if here != self.folder else d,
                                     "a symlinked step folder (not followed)"))
            dirnames.sort()
            if here.name.startswith(STEP_PREFIX) and RECORD_FILE in filenames:
                out.append(rel(here))
                if len(out) >= limit:
                    break
        return sorted(out), problems


def iter_record_files(root: str | Path) -> Iterator[tuple[Path, Any, str | None]]:
    """Every ``<trajectory>/<policy>/step_*/record.json`` under ``root``, sorted, without following
    symlinked folders (a symlinked step folder is listed as a problem): ``(path, record, problem)``
    where ``record`` is None when the file cannot be read and ``problem`` says why (or is None)."""
    from attnprobe.counterfactual.records import record_problem

    root = Path(root)
    found: list[tuple[Path, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        for d in sorted(dirnames):
            if (here / d).is_symlink() and depth == 2 and d.startswith(STEP_PREFIX):
                found.append((here / d / RECORD_FILE, "a symlinked step folder (not followed)"))
        if depth >= 3:
            dirnames[:] = []
        if depth == 3 and here.name.startswith(STEP_PREFIX) and RECORD_FILE in filenames:
            found.append((here / RECORD_FILE, None))
    for path, problem in sorted(found):
        if problem:
            yield path, None, problem
            continue
        try:
            if path.is_symlink() or not path.is_file():
                raise AttnprobeError(f"{path}: not a regular file")
            record = load_json(path)
        except (AttnprobeError, OSError) as exc:
            yield path, None, str(exc)
            continue
        yield path, record, record_problem(record)
