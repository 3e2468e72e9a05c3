"""The runner as a job: one work item per question, on the local executor or Ray replicas.

What a run is made of, in order, each done once:

1. :func:`run_questions` takes the output's lock, refuses what cannot be continued (:func:`begin`: the output
   file, records made with other settings), deletes the old records under ``--force``, and drops the calls
   of questions whose text or gold answers changed since they ran;
2. the executor runs the unfinished questions (:class:`RunnerJob`): whoever runs a question appends its
   calls to OUT as they are made (``append_jsonl`` serialises appenders, so Ray replicas may share OUT) and
   its result to ``X.results.ndjson``; a question that stopped half-way replays its recorded calls;
3. the driver keeps the summary: rewritten after every finished question (:meth:`RunnerJob.collect`, the
   one writer of ``X.summary.json``) and once more at the end with its caveats (:func:`write_summary`).

A failing question stops the run (``catch=()``), as it always did: the next invocation resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.agents.recorder import drop_records
from attnprobe.agents.search import SearchBackend, shared_search
from attnprobe.execution.job import WorkItem
from attnprobe.execution.local import in_process
from attnprobe.execution.study import Counts, Outcome, Plan, StudyBase, run_study
from attnprobe.generation.factory import ChatJob
from attnprobe.io import append_jsonl, atomic_write_text, finite_json, read_records
from attnprobe.results.caveats import runner_caveats
from attnprobe.studies.runner.config import RunSettings
from attnprobe.studies.runner.layout import RunnerLayout
from attnprobe.studies.runner.run import (
    changed_runs,
    check_output,
    check_resume,
    run_one,
    summarize,
    warn_summary,
)

log = logging.getLogger(__name__)

def read_results(out: Path) -> dict[str, dict]:
    """The finished runs of ``out`` by run id (:meth:`RunnerLayout.read_results`, the one reader)."""
    return RunnerLayout(out).read_results()


def write_summary(out: Path, settings: RunSettings, results: list[dict], *, questions: list[dict] | None = None
                  ) -> dict:
    """Write ``X.summary.json`` for ``results`` (in question order); with ``questions`` (the end of a run) the
    summary gets its ``caveats`` and their warnings are logged. Returns the summary."""
    summary = summarize(results)
    if questions is not None:
        summary["caveats"] = runner_caveats(results, settings.context_policy.spec)  # computed from the runs
        warn_summary(settings, summary, questions)
    atomic_write_text(RunnerLayout(out).summary, json.dumps(finite_json(
        {"setting": settings.name, "settings": settings.to_dict(), **summary}), indent=2))
    return summary


@dataclass
class RunnerJob(ChatJob):
    """Run every question of ``questions`` not finished in ``path`` (the OUT JSONL) with ``settings``.

    ``search``: a search backend object, or None to build ``make_search(search_kind, corpus)`` where the job
    runs (once per process: what a Ray replica does). The executor hands a chat backend, or a loaded model (a
    Ray replica's) that :class:`ChatJob` wraps in the in-process chat as `attnprobe run` opens it.
    ``batch_size``: questions per executor batch (one ``run`` call; a Ray shard is made of whole batches).
    Inside a batch the questions still run one after another: the manager calls the worker from inside its
    own step, so two questions cannot be stepped together without making both steppable (docs/runner.md)."""

    path: Path
    questions: Sequence[dict]
    settings: RunSettings
    search: SearchBackend | None = None
    search_kind: str = "bm25"
    corpus: str | None = None
    batch_size: int = 1
    unit: str = "q"
    catch: tuple[type[BaseException], ...] = ()  # a failing question stops the run; the next run resumes it
    _calls: dict[str, list[dict]] | None = field(default=None, init=False, repr=False)
    _finished: dict[str, dict] | None = field(default=None, init=False, repr=False)
    _read: tuple[Any, dict[str, dict]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.layout = RunnerLayout(self.path)
        self.questions = list(self.questions)

    @property
    def out(self) -> Path:
        """The folder holding OUT (the executors' ``errors.jsonl`` and Ray's ``distributed.json`` go there)."""
        return self.path.parent

    @property
    def stage(self) -> str:
        return f"run {self.settings.name}"

    def run_id(self, question: dict) -> str:
        return f"{self.settings.name}-{question['id']}"

    def items(self) -> list[WorkItem]:
        return [WorkItem(key=self.run_id(q), tokens=len(q["question"]) // 4 + 1, describe={"question_id": q["id"]},
                         data=q) for q in self.questions]

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        """A result of this question (same text and gold answers) is in ``X.results.ndjson``. ``since`` needs
        no file time here: the driver hands out only unfinished questions and holds the output's lock, so a
        result that appears later was written by this job (a retried Ray shard skips it)."""
        return self.layout.done(self._results(), item.key, item.data)

    def _results(self) -> dict[str, dict]:
        """:func:`read_results`, read again only when the file changed (``done`` is asked once per item)."""
        try:
            st = self.layout.results.stat()
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        if self._read is None or self._read[0] != key:
            self._read = (key, read_results(self.path))
        return self._read[1]

    @property
    def prepare_key(self) -> Any:
        return ("runner",)

    @property
    def chat_options(self) -> dict:
        return {"stop_at_call": None}  # as `attnprobe run` opens the in-process chat

    def _search(self) -> SearchBackend:
        if self.search is not None:
            return self.search
        return shared_search(self.search_kind, self.corpus)

    def _replay(self, run_id: str) -> list[dict] | None:
        """The calls an earlier try of ``run_id`` recorded, read from OUT once per job object (each Ray shard
        gets its own): only that question's run writes or drops its calls, so the index stays true."""
        if self._calls is None:
            self._calls = {}
            for c in read_records(self.path, torn_tail="skip", missing_ok=True):
                self._calls.setdefault((c.get("meta") or {}).get("run_id"), []).append(c)
        return self._calls.pop(run_id, None)

    def run(self, chat: Any, batch: Sequence[WorkItem]) -> list[dict]:
        search = self._search()
        results = []
        for item in batch:
            q = item.data
            # the bar shows the call in flight ("q03: call 7 (worker)"), not a silent 0/1 per question
            result = run_one(chat, search, q, self.settings, self.path, item.key, replay=self._replay(item.key),
                             note=lambda text, qid=q["id"]: self.note(f"{qid}: {text}"))
            append_jsonl(self.layout.results, result)
            results.append(result)
        return results

    def collect(self, item: WorkItem, result: dict) -> None:
        """On the driver, per finished question: the summary of every finished question so far."""
        if self._finished is None:
            self._finished = read_results(self.path)
        self._finished[item.key] = result
        write_summary(self.path, self.settings, self.finished(self._finished))

    def finished(self, by_run: dict[str, dict] | None = None) -> list[dict]:
        """The finished runs of this job's questions, in question order (from the results file by default)."""
        by_run = read_results(self.path) if by_run is None else by_run
        return [by_run[self.run_id(q)] for q in self.questions if self.layout.done(by_run, self.run_id(q), q)]


def begin(out: Path, questions: list[dict], settings: RunSettings, *, resume: bool = True, overwrite: bool = False
          ) -> None:
    """Everything a run can be refused for, checked once, under the output's lock and before any model
    loads; then ``--force`` deletes the old records, and the calls of questions that changed since they ran
    (text or gold answers: other input, not another option) are dropped so they are not replayed."""
    check_output(out, resume=resume, overwrite=overwrite)
    if overwrite:
        for p in RunnerLayout(out).files():
            p.unlink(missing_ok=True)
    check_resume(out, settings)  # other settings (a context policy too) are refused here
    changed = changed_runs(read_results(out), questions, settings.name)
    if changed:
        log.info("run: %d question(s) changed since they ran (text or gold answers), run again: %s", len(changed),
                 ", ".join(sorted(changed)[:5]))
        drop_records(out, {c.get("id") for c in read_records(out, torn_tail="skip", missing_ok=True)
                           if (c.get("meta") or {}).get("run_id") in changed})


@dataclass(frozen=True)
class RunnerOptions:
    """What ``attnprobe run`` takes: the questions (already read), the :class:`RunSettings`, the output
    ``out`` (``X.jsonl``); ``resume=False`` refuses records there, ``force`` starts again; ``search``: a search
    backend object, or None to use the process's shared one of ``search_kind``/``corpus`` (Ray replicas build
    their own); ``batch_size``: questions per executor batch."""

    questions: Sequence[dict]
    settings: RunSettings
    out: str | Path
    search: SearchBackend | None = None
    search_kind: str = "bm25"
    corpus: str | None = None
    resume: bool = True
    force: bool = False
    batch_size: int = 1


class RunnerStudy(StudyBase):
    """``attnprobe run`` as a :class:`~attnprobe.execution.study.Study` (see the module docstring): the
    output's own lock (:meth:`RunnerLayout.hold`), :func:`begin` under it before the executor opens, the
    questions on the executor, then the summary with its caveats."""

    name = "run"
    folder = "output of attnprobe run"
    Options, Layout = RunnerOptions, RunnerLayout

    def plan(self, options: RunnerOptions, layout: RunnerLayout) -> Plan:
        o, out, questions = options, layout.out, list(options.questions)
        jobs: list[RunnerJob] = []

        def begin_run() -> list[str]:  # under the lock, before the executor opens
            begin(out, questions, o.settings, resume=o.resume, overwrite=o.force)
            return []

        def job(ex) -> RunnerJob:
            jobs.append(RunnerJob(out, questions, o.settings, search=o.search, search_kind=o.search_kind,
                                  corpus=o.corpus, batch_size=o.batch_size))
            return jobs[-1]

        return Plan([[job]], conflicts=begin_run, data=(questions, jobs))

    def finish(self, options: RunnerOptions, layout: RunnerLayout, counts: Counts) -> Outcome:
        questions, jobs = counts.plan.data
        from attnprobe.studies.runner.run import token_table

        results = jobs[0].finished()
        s = write_summary(layout.out, options.settings, results, questions=questions)
        c = counts.total
        return Outcome(lines=[token_table({options.settings.name: s}), *(f"Caveat: {x}" for x in s.get("caveats") or [])],
                       notes=[c.line("run", to=layout.out),
                              json.dumps({"out": str(options.out), "accuracy": s["accuracy"], "runs": s["runs"]})],
                       exit_code=c.exit_code, value={"summary": s, "results": results, "skipped": c.done_before,
                                                     "counts": c})


RUNNER = RunnerStudy()


def run_questions(chat, questions: Iterable[dict], settings: RunSettings, out: str | Path, *,
                  search: SearchBackend | None = None, resume: bool = True, overwrite: bool = False,
                  progress: bool = False, batch_size: int = 1, executor=None,
                  search_kind: str = "bm25", corpus: str | None = None) -> dict:
    """:data:`RUNNER` through the one driver, for Python callers: ``{"summary", "results", "skipped", "counts"}``
    (``counts``: :class:`RunCounts`). ``chat`` generates in this process; or pass ``chat=None`` and an
    ``executor`` (Ray replicas of a model: the job wraps their loaded model itself)."""
    options = RunnerOptions(list(questions), settings, Path(out), search=search, search_kind=search_kind,
                            corpus=corpus, resume=resume, force=overwrite, batch_size=batch_size)
    ex = executor if executor is not None else in_process(chat, progress=progress)
    return run_study(RUNNER, options, lambda: contextlib.nullcontext(ex)).value
