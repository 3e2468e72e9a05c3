"""The runner's output: the one module that spells its file names.

For ``out = X.jsonl`` (``attnprobe run --out``), beside it in the same folder:

- ``X.jsonl``            every model call as a trajectory (loadable with attnprobe.load_trajectories)
- ``X.results.ndjson``   one line per finished run (answer, correctness, tokens per agent, seconds)
- ``X.summary.json``     accuracy and the token table (rewritten atomically after each run), and at the end
                         its ``caveats``
- ``X.history.jsonl``    only under a context policy: each search worker's full history
- ``errors.jsonl``       the executors' failures (in the folder)

:class:`RunnerLayout` gives the paths (no symlink below the folder followed; inside ``root`` for a reader
rooted at the app's data directory), the one reader of the results and the one ``done`` rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import ERRORS_FILE, layout_path, read_jsonl

RESULTS_SUFFIX, SUMMARY_SUFFIX, HISTORY_SUFFIX = ".results.ndjson", ".summary.json", ".history.jsonl"


@dataclass(frozen=True)
class RunnerLayout:
    """The files of one runner output ``out`` (the calls file ``X.jsonl``); ``folder`` is its folder."""

    out: Path
    root: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        if self.root is not None:
            object.__setattr__(self, "root", Path(self.root).resolve())
            object.__setattr__(self, "out", layout_path(self.folder, self.out, self.root))

    @property
    def folder(self) -> Path:
        return self.out.parent

    def hold(self):
        """The output's lock (:func:`attnprobe.io.hold_file_lock`), held for a whole run: a second run into the
        same ``out`` is refused in one line naming the first one's PID; other outputs in the folder are free."""
        from attnprobe.io import hold_file_lock

        return hold_file_lock(self.out, "output of attnprobe run")

    @staticmethod
    def is_folder(names: Iterable[str]) -> bool:
        """A folder holding a runner output (a results file)."""
        return any(n.endswith(RESULTS_SUFFIX) for n in names)

    def _path(self, suffix: str) -> Path:
        return layout_path(self.folder, self.out.with_suffix(suffix), self.root)

    # ---------------------------------------------------------------- paths
    @property
    def calls(self) -> Path:
        return layout_path(self.folder, self.out, self.root)

    @property
    def results(self) -> Path:
        return self._path(RESULTS_SUFFIX)

    @property
    def summary(self) -> Path:
        return self._path(SUMMARY_SUFFIX)

    @property
    def history(self) -> Path:
        return self._path(HISTORY_SUFFIX)

    @property
    def errors(self) -> Path:
        return layout_path(self.folder, self.folder / ERRORS_FILE, self.root)

    def files(self) -> tuple[Path, ...]:
        """What a run writes and ``--force`` deletes (the executors' errors.jsonl is the folder's)."""
        return (self.calls, self.results, self.summary, self.history)

    # ---------------------------------------------------------------- validation and readers
    @staticmethod
    def problem(result: Any) -> str | None:
        """Why a results line cannot be used (None: it can): an object with a string ``run_id`` and
        ``question`` (what resume and scoring read)."""
        if not isinstance(result, dict):
            return f"not a JSON object ({type(result).__name__})"
        for key in ("run_id", "question"):
            if not isinstance(result.get(key), str):
                return f"field '{key}' is missing or not a string"
        return None

    def read_results(self) -> dict[str, dict]:
        """The finished runs by run id (the last line of a run id wins); a torn last line is skipped; a bad
        line is one AttnprobeError naming the file, line and field."""
        out: dict[str, dict] = {}
        for line, rec in read_jsonl(self.results, torn_tail="skip", missing_ok=True):
            problem = self.problem(rec)
            if problem:
                raise AttnprobeError(f"{self.results}, line {line}: {problem}")
            out[rec["run_id"]] = rec
        return out

    # ---------------------------------------------------------------- done
    @staticmethod
    def same_inputs(result: dict, question: dict) -> bool:
        """Whether a finished run was made from this question: the same text and gold answers (a result
        records both), so an answer is never scored against an old gold."""
        return result.get("question") == question["question"] and (result.get("gold") or None) == \
            (question.get("answers") or None)

    @classmethod
    def done(cls, results: dict[str, dict], run_id: str, question: dict) -> bool:
        """The runner's rule: a result of ``run_id`` made from this question (:meth:`same_inputs`) is in
        ``results`` (:meth:`read_results`). No file time: the driver hands out only unfinished questions
        and holds the output's lock, so a result that appears later was written by this run (a retried
        Ray shard skips it). The settings are checked once for the whole output before any model loads
        (``check_resume``)."""
        rec = results.get(run_id)
        return rec is not None and cls.same_inputs(rec, question)
