"""The interference study's folder: the one place its file and folder names are spelled, the one reader of
each of its files, the one validator of ``study.json`` (:meth:`StudyLayout.problem`) and the one rule for
"this item is finished" (:meth:`StudyLayout.done`). The study (job, study, attention), its CLI and the app's
Study page all ask a :class:`StudyLayout` for paths, so the CLI and the app name and check the same files.

::

    OUT/
      study.json  study.md            the tables (study.py), study.json indexes the results it summarised
      attention.json  attention.md    study attention's numbers (attention.py)
      .attnprobe-settings.json        the options record (attnprobe.io.settings, shared by every command)
      <slug>/                         one per setting (slug: ':' -> '-', :func:`.context.slug`)
        calls/<qid>.jsonl             every model call of a question, as sent
        history/<qid>.jsonl           the question's full history
        results/<qid>.json            its outcome, stamped with its inputs (written last: done)
        calls.jsonl                   the calls of the current results, gathered (one file to capture)
        capture/  counterfactual/     study attention's captures and counterfactual steps

Every path a layout returns is checked by the one helper of every study's layout,
:func:`attnprobe.io.layout_path`. In the CLI and the jobs (no ``root``) no symlink below the folder is followed
(:func:`attnprobe.io.inside`): folders are checked up to and including themselves, files up to their folder (a
symlinked file is the reader's to refuse or skip, and an atomic write replaces the link itself). In the app
(``root``: its data directory) a path must resolve inside ``root`` (:func:`attnprobe.io.resolved_inside`). Both
refusals are :class:`attnprobe.io.OutsideFolder`; every error is one :class:`AttnprobeError` line naming the
file (relative to ``root`` in the app, which shows it and goes on).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import written_since
from attnprobe.io import inside, load_json, read_jsonl
from attnprobe.io.layout import FolderLayout
from attnprobe.studies.loop.context import legacy_slug, slug
from attnprobe.studies.loop.metrics import MEASURES

log = logging.getLogger(__name__)

STUDY_JSON, STUDY_MD = "study.json", "study.md"
ATTENTION_JSON, ATTENTION_MD = "attention.json", "attention.md"
CALLS, HISTORY, RESULTS = "calls", "history", "results"  # per-question files under <slug>/
CALLS_JSONL = "calls.jsonl"  # the gathered calls of a setting's current results
CAPTURE, COUNTERFACTUAL = "capture", "counterfactual"
SETTING_PARTS = (CALLS, HISTORY, RESULTS, CALLS_JSONL, CAPTURE, COUNTERFACTUAL)  # what the study writes or reads

# the per-setting numbers study.json holds (metrics.summarize; the app's table shows each with its CI)
SETTING_NUMBERS = ("accuracy", *(k for k, _, _ in MEASURES))


def _num(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _ci_ok(v) -> bool:
    return v is None or (isinstance(v, list) and len(v) == 2 and all(_num(x) and x is not None for x in v))


@dataclass(frozen=True)
class StudyLayout(FolderLayout):
    """One interference study folder. ``root``: the app's data directory (paths must resolve inside it);
    None in the CLI and the jobs (no symlink below ``folder`` is followed)."""

    # ------------------------------------------------------------------ checked paths (FolderLayout._checked)
    @property
    def study_json(self) -> Path:
        return self._checked(self.folder / STUDY_JSON)

    @property
    def study_md(self) -> Path:
        return self._checked(self.folder / STUDY_MD)

    @property
    def attention_json(self) -> Path:
        return self._checked(self.folder / ATTENTION_JSON)

    @property
    def attention_md(self) -> Path:
        return self._checked(self.folder / ATTENTION_MD)

    @staticmethod
    def setting_name(spec: str) -> str:
        """The name of setting ``spec``'s folder (``:`` written ``-``, one-to-one: :func:`.context.slug`)."""
        return slug(spec)

    def setting(self, spec: str) -> SettingLayout:
        """The folder of setting ``spec`` (:class:`SettingLayout`)."""
        return SettingLayout(self, slug(spec))

    def setting_dir(self, spec: str) -> Path:
        """``OUT/<slug>/``, the folder of setting ``spec``."""
        return self.setting(spec).dir

    def calls(self, spec: str, qid: str) -> Path:
        return self.setting(spec).calls(qid)

    def history(self, spec: str, qid: str) -> Path:
        return self.setting(spec).history(qid)

    def result(self, spec: str, qid: str) -> Path:
        return self.setting(spec).result(qid)

    def calls_file(self, spec: str) -> Path:
        return self.setting(spec).calls_file

    def capture_dir(self, spec: str) -> Path:
        return self.setting(spec).capture_dir

    def counterfactual_dir(self, spec: str) -> Path:
        return self.setting(spec).counterfactual_dir

    def check(self, settings) -> None:
        """One line (:class:`attnprobe.io.OutsideFolder`) when a setting's folder, or a part of it that the
        study writes or reads (:data:`SETTING_PARTS`), is a symlink: a received study folder must not make
        us write or read outside it; also when two settings would share one folder (:func:`.context.slug`
        is one-to-one, so only a hash collision or two names equal up to case, which share a folder on
        macOS and Windows, can do it). A setting whose folder name changed in issue 38 (a refiner URL or
        model: :func:`.context.legacy_slug`) is named in a warning when its old folder is there: it is left
        alone and the setting runs again in its new folder. Checked before any model loads."""
        seen: dict[str, str] = {}
        for s in settings:
            name = slug(s)
            if seen.get(name.lower(), s) != s:
                raise AttnprobeError(f"{self.folder}: settings {seen[name.lower()]!r} and {s!r} would share the "
                                     f"folder {name!r}; run them in two studies")
            seen[name.lower()] = s
            old = legacy_slug(s)
            if old != name and (self.folder / old).is_dir() and not (self.folder / name).exists():
                log.warning("%s: made by an older attnprobe under the folder name of setting %s; left alone, the "
                            "setting runs in %s", self.folder / old, s, name)
            for part in SETTING_PARTS:
                inside(self.folder, self.folder / name / part)

    @classmethod
    def of_capture(cls, rel: str | Path, root: Path | None = None) -> SettingLayout | None:
        """The setting folder a per-call capture ``<study>/<name>/capture/<id>`` belongs to (``rel``:
        relative to ``root`` when given), else None."""
        parts = Path(rel).parts
        if len(parts) < 3 or parts[-2] != CAPTURE:
            return None
        base = Path(root) if root is not None else Path()
        return SettingLayout(cls(base.joinpath(*parts[:-3]), root=root), parts[-3])

    @staticmethod
    def is_folder(names: set[str]) -> bool:
        """Whether a folder holding the files ``names`` is an interference study (the app's scan)."""
        return STUDY_JSON in names

    # ------------------------------------------------------------------ study.json
    @staticmethod
    def problem(obj: Any, *, stamps: bool = False) -> str | None:
        """The first thing wrong with a parsed study.json, naming the field, or None. The checks of the app's
        Study page (what it reads) and, with ``stamps``, of ``study attention`` (the stamps of the results
        it summarised, ``results``: missing in a study.json from before issue 27)."""
        if not isinstance(obj, dict):
            return "expected a JSON object"
        settings = obj.get("settings")
        if not isinstance(settings, dict) or not settings:
            return "'settings' is not an object of per-setting summaries"
        for s, m in settings.items():
            if not isinstance(m, dict):
                return f"'settings.{s}' is not an object"
            for k in SETTING_NUMBERS:
                if not _num(m.get(k)):
                    return f"'settings.{s}.{k}' is {m.get(k)!r}, not a finite number"
                if not _ci_ok(m.get(f"{k}_ci")):
                    return f"'settings.{s}.{k}_ci' is {m.get(f'{k}_ci')!r}, not [low, high]"
        for name, kind, what in (("config", dict, "an object"), ("bootstrap", dict, "an object"),
                                 ("models", list, "a list"), ("scorer", str, "a string")):
            if obj.get(name) is not None and not isinstance(obj[name], kind):
                return f"'{name}' is {type(obj[name]).__name__}, not {what}"
        if not _num(obj.get("questions_total")):
            return f"'questions_total' is {obj['questions_total']!r}, not a number"
        if not isinstance(obj.get("baseline"), str) or obj["baseline"] not in settings:
            return f"'baseline' {obj.get('baseline')!r} is not one of the settings"
        for name in ("paired", "questions"):
            if not isinstance(obj.get(name, {}), dict):
                return f"'{name}' is not an object"
        for s, c in (obj.get("paired") or {}).items():
            if not isinstance(c, dict) or not isinstance(c.get("fixed", []), list) or \
                    not isinstance(c.get("broken", []), list):
                return f"'paired.{s}' is not an object with 'fixed' and 'broken' lists"
        for q, rec in (obj.get("questions") or {}).items():
            if not isinstance(rec, dict) or not isinstance(rec.get("correct", {}), dict) or \
                    not isinstance(rec.get("answer", {}), dict):
                return f"'questions.{q}' is not an object with 'correct' and 'answer' objects"
        results = obj.get("results")
        if results is not None or stamps:
            if not (isinstance(results, dict) and all(isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
                                                      for v in results.values())):
                return ("'results' is missing or not the stamps of the results (made by an older attnprobe); run "
                        "'attnprobe study interference' on this folder again first")
        return None

    def _load(self, path: Path) -> Any:
        """One JSON file through attnprobe's one loader; in the app the error names it from the root."""
        if self.root is None:
            return load_json(path)
        where = self.where(path)
        return load_json(path, error=lambda m, path=None, line=None: AttnprobeError(
            f"{where}, line {line}: {m}" if line is not None else f"{where}: {m}"))

    def read_study(self, *, stamps: bool = True) -> dict:
        """study.json, checked (:meth:`problem`; ``stamps``: its results' stamps too, as ``study attention``
        needs them); a folder without one, a symlinked one or a bad one is one clear error."""
        path = self.study_json
        if self.root is None:
            inside(self.folder, path)  # a symlinked study.json is refused, not followed
        if not path.is_file():
            raise AttnprobeError(f"{self.where(self.folder)}: not an interference study folder (no {STUDY_JSON}); "
                            f"make one with 'attnprobe study interference QUESTIONS --out {self.folder}'")
        obj = self._load(path)
        problem = self.problem(obj, stamps=stamps)
        if problem:
            raise AttnprobeError(f"{self.where(path)}: {problem}")
        return obj

    def read_attention(self) -> Any:
        """attention.json as written (None when there is none); unreadable or symlinked: one error."""
        path = self.attention_json
        if self.root is None:
            inside(self.folder, path)
        return self._load(path) if path.is_file() else None

    # ------------------------------------------------------------------ results and their stamped records
    def read_result(self, spec: str, qid: str) -> dict | None:
        """A finished item's result, or None when missing, a symlink (not followed) or unreadable (then the
        item is redone, and the symlink replaced by the new result)."""
        path = self.result(spec, qid)
        if path.is_symlink() or not path.is_file():
            return None
        try:
            rec = load_json(path, error=lambda m, path, line: AttnprobeError(m))
        except AttnprobeError:
            return None
        return rec if isinstance(rec, dict) else None

    @staticmethod
    def finished(rec: dict | None, stamp: str, fields: Mapping[str, Any] | None = None) -> bool:
        """Whether a result was made from the inputs whose stamp is ``stamp`` and records ``fields`` as
        given (a missing field reads as ``{}``: a result from before a field was recorded is run again)."""
        return (rec is not None and rec.get("inputs") == stamp
                and all(rec.get(k, {}) == v for k, v in (fields or {}).items()))

    def done(self, spec: str, qid: str, stamp: str, *, since: float | None = None,
             fields: Mapping[str, Any] | None = None) -> bool:
        """The one "finished" rule of an item: its result file is there (no symlink), written since ``since``
        when given, and made from these inputs (:meth:`finished`)."""
        path = self.result(spec, qid)
        return written_since(path, since) and self.finished(self.read_result(spec, qid), stamp, fields)

    def current_results(self, spec: str, study: dict | None = None) -> dict[str, str]:
        """``{question id: stamp}`` of the setting's results that study.json summarised and that are still
        on disk with that stamp (a deleted or rewritten result file drops its question), in study order."""
        stamps = ((study or self.read_study()).get("results") or {}).get(spec) or {}
        return {qid: st for qid, st in stamps.items()
                if (rec := self.read_result(spec, qid)) is not None and rec.get("inputs") == st}

    def stamped(self, spec: str, stamps: Mapping[str, str], part: str = CALLS) -> list[tuple[Path, int, dict]]:
        """The one reader of a setting's stamped records: per question of ``stamps`` (``{qid: result
        stamp}``, in that order) the records of ``<slug>/<part>/<qid>.jsonl`` (``part``: calls or history)
        made for that result (``meta.inputs``), as ``(file, line, record)``. A symlink is never read through
        (it could point out of the study folder): its question is left out with a warning."""
        if part not in (CALLS, HISTORY):
            raise ValueError(f"part must be {CALLS!r} or {HISTORY!r}")
        out = []
        for qid, st in stamps.items():
            path = self.calls(spec, qid) if part == CALLS else self.history(spec, qid)
            if path.is_symlink():
                log.warning("%s: is a symlink; not followed (its question is left out)", path)
                continue
            out += [(path, line, rec) for line, rec in read_jsonl(path, missing_ok=True)
                    if isinstance(rec, dict) and ((rec.get("meta") or {}).get("inputs") == st)]
        return out


@dataclass(frozen=True)
class SettingLayout:
    """One setting's folder ``<study>/<name>/`` (``name``: the setting's slug), its paths checked as its
    study's (:meth:`StudyLayout._checked`). The app builds one from a capture's path
    (:meth:`StudyLayout.of_capture`), where the setting's spec is not known."""

    study: StudyLayout
    name: str

    def _path(self, *parts: str, is_dir: bool = False) -> Path:
        return self.study._checked(self.study.folder.joinpath(self.name, *parts), is_dir=is_dir)

    @property
    def dir(self) -> Path:
        return self._path(is_dir=True)

    @property
    def calls_dir(self) -> Path:
        return self._path(CALLS, is_dir=True)

    def calls(self, qid: str) -> Path:
        """``calls/<qid>.jsonl``: the question's model calls (named by the question id as is)."""
        return self._path(CALLS, f"{qid}.jsonl")

    def history(self, qid: str) -> Path:
        return self._path(HISTORY, f"{qid}.jsonl")

    def result(self, qid: str) -> Path:
        return self._path(RESULTS, f"{qid}.json")

    @property
    def calls_file(self) -> Path:
        """``calls.jsonl``: the gathered calls of the setting's current results."""
        return self._path(CALLS_JSONL)

    @property
    def capture_dir(self) -> Path:
        return self._path(CAPTURE, is_dir=True)

    @property
    def counterfactual_dir(self) -> Path:
        return self._path(COUNTERFACTUAL, is_dir=True)
