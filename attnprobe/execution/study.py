"""A study as a type: one protocol every command that runs a study implements, and the one driver that runs it.

Why: a study used to be a convention (seven entry points, each taking its executor differently and
returning something else). Now a study is four things, and :func:`run_study` does the rest the same way
for every one of them:

- ``Options``: the record of the command's options, every one declared once with
  :func:`attnprobe.io.options.option` / :func:`~attnprobe.io.options.same_as` (the CLI builds the parser
  from it); its ``force`` field redoes finished work;
- ``layout(options)``: the study's :class:`Layout` (the folder it writes, locked while it runs);
- ``plan(options, layout)``: pure; reads and refuses the inputs before any model loads, and returns a
  :class:`Plan`: groups of jobs run in order (IBIS interleaves its stages item group by item group: one
  group each), the stamp the settings check compares, and what ``finish`` needs;
- ``finish(options, layout, counts)``: writes the study's summary files and returns an :class:`Outcome`
  (the lines to print and the exit code).

:func:`run_study` locks the folder, recovers what an interrupted run left, checks the settings (and the
plan's per-result conflicts), opens the executor once, runs the groups, records the settings once something
is finished, and finishes. It lives in the lowest layer beside :class:`~attnprobe.execution.job.Job`, and,
like the executors, knows no study.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from attnprobe.errors import AttnprobeError
from attnprobe.execution.counts import RunCounts

# A step of a group: a job, or a function that builds it from the open executor (a job whose items or
# settings need the model, e.g. the counterfactual settings made where the model is, or the IBIS capture
# items read from the decisions the group before wrote; None: nothing to run), or :func:`part`: another
# study run as a part of this one, on the same executor; or a function returning a generator that yields
# jobs, is sent each one's counts and returns a value (a stage that records its counts after its job: IBIS).
Step = Any  # a Job, or Callable[[executor], Job | Part | Generator | None]


@runtime_checkable
class Layout(Protocol):
    """Where a study writes. The folder the driver locks, recovers and records settings in is
    :func:`folder_of` the layout: its ``folder`` (the :class:`attnprobe.io.layout.FolderLayout` family, whose
    ``root`` is the app's data directory) or else its ``root`` (the capture folder). A layout whose output
    is one file among others in its folder (the runner's ``X.jsonl``) has ``hold()``: its own lock and
    checks, and the driver neither creates, locks nor recovers the folder."""

    root: Path | None


def folder_of(layout: Layout) -> Path:
    """The folder ``layout`` writes (see :class:`Layout`)."""
    folder = getattr(layout, "folder", None)  # the capture layout's folder(id) is a method: its root is the folder
    return Path(folder if isinstance(folder, (str, os.PathLike)) else layout.root)


@dataclass
class Plan:
    """What :meth:`Study.plan` found, before any model loads.

    ``groups``: run in order, each group's steps in order, all on the one executor; ``stamp``: the options
    that must match what ``root`` was made with (:func:`attnprobe.io.settings.check_settings`; None: no
    check), ``names`` how each key is spelled on the command line; ``conflicts()``: called under the lock,
    before the executor opens: refuses what cannot be continued (raises), may clear what ``force`` redoes,
    and returns the finished results made with other settings (refused unless ``force``; ``results``: how
    that error names them, e.g. "captures made"); ``data``: what ``finish`` needs from the plan."""

    groups: Sequence[Sequence[Step]]
    stamp: Mapping[str, Any] | None = None
    names: Mapping[str, str] | None = None
    conflicts: Callable[[], list[str]] | None = None
    results: str = "results made"
    data: Any = None


@dataclass
class Counts:
    """What the executor reported: ``jobs`` the counts of each job run, by its ``stage``, in run order (a
    stage run in several groups is summed); ``total`` all of them together; ``plan`` the plan they ran;
    ``parts``: the outcome of each study run as a part (:func:`part`), by its name; ``returned``: what each
    generator step returned, in order."""

    plan: Plan
    jobs: dict[str, RunCounts] = field(default_factory=dict)
    parts: dict[str, Outcome] = field(default_factory=dict)
    returned: list = field(default_factory=list)

    @property
    def total(self) -> RunCounts:
        return RunCounts(sum(c.done_before for c in self.jobs.values()), sum(c.done for c in self.jobs.values()),
                         sum(c.failed for c in self.jobs.values()))

    def add(self, stage: str, counts: Mapping[str, int]) -> None:
        old, new = self.jobs.get(stage, RunCounts()), RunCounts.of(counts)
        self.jobs[stage] = RunCounts(old.done_before + new.done_before, old.done + new.done, old.failed + new.failed)


@dataclass(frozen=True)
class Outcome:
    """What a study's run ends with: ``lines`` for stdout (a summary table), ``notes`` for stderr (the
    count line), ``exit_code`` (0 ok, 1 some items failed); ``counts``: what the run counted (the driver
    sets it), for a caller that composes studies; ``value``: what the study hands such a caller (a summary)."""

    lines: Sequence[str] = ()
    notes: Sequence[str] = ()
    exit_code: int = 0
    counts: Counts | None = None
    value: Any = None


@runtime_checkable
class Study(Protocol):
    """A command that runs a study (see the module docstring). ``name``: the command, as the settings
    record and the count line name it; ``folder``: how errors name the locked folder."""

    name: str
    folder: str
    Options: type

    def layout(self, options: Any) -> Layout: ...

    def plan(self, options: Any, layout: Any) -> Plan: ...

    def finish(self, options: Any, layout: Any, counts: Counts) -> Outcome: ...


def _drive(steps: Generator, ex, counts: Counts) -> Any:
    """Run the jobs a generator step yields, sending it each one's counts; what it returns."""
    try:
        job = next(steps)
        while True:
            c = ex.run(job)
            counts.add(job.stage, c)
            job = steps.send(c)
    except StopIteration as end:
        return end.value


@dataclass(frozen=True)
class Part:
    """What a :func:`part` step ran: the part's study name and its outcome."""

    name: str
    outcome: Outcome


def part(study: Study, options: Any, name: str | None = None) -> Step:
    """A step that runs ``study`` as a part of another (``study masking``: a capture, then a counterfactual
    run): its own folder lock, settings check and finish, on the executor the whole run opened once; its
    outcome is ``Counts.parts[name]`` (default: the study's name)."""
    def step(ex) -> Part:
        return Part(name or study.name, run_study(study, options, lambda: nullcontext(ex)))

    return step


class StudyBase:
    """The usual parts of a :class:`Study`: its layout is ``Layout(options.out)`` (a study whose options
    name their folder otherwise defines ``layout`` itself), its folder named "output folder" in errors."""

    folder = "output folder"
    Layout: type

    def layout(self, options: Any) -> Any:
        return self.Layout(Path(options.out))


def run_study(study: Study, options: Any, open_executor: Callable[[], AbstractContextManager]) -> Outcome:
    """Run ``study`` with ``options``: plan (inputs refused before anything else), lock the layout's root,
    recover, check the settings and conflicts, open the executor once (``open_executor()``, a context
    manager) and run every group, record the settings once something finished, finish."""
    from attnprobe.io import ensure_writable_dir, hold_dir_lock, recover_atomic_dirs
    from attnprobe.io.settings import check_settings, finished_something, record_settings

    layout = study.layout(options)
    plan = study.plan(options, layout)
    force = bool(getattr(options, "force", False))
    root = folder_of(layout)
    own = getattr(layout, "hold", None)
    if own is None:
        ensure_writable_dir(root, study.folder)
    # one run per folder (or output file): a second is refused, naming the first's PID
    with own() if own is not None else hold_dir_lock(root, study.folder):
        if own is None:
            recover_atomic_dirs(root)
        if plan.stamp is not None:
            check_settings(root, study.name, plan.stamp, force=force, names=plan.names)
        conflicts = [] if plan.conflicts is None else plan.conflicts()
        conflicts = [] if force else conflicts
        if conflicts:
            more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
            raise AttnprobeError(f"{root} holds {plan.results} with other settings: {conflicts[0]}{more}; "
                                 "use --force to redo or another --out")
        counts = Counts(plan)
        if any(plan.groups):
            with open_executor() as ex:  # the model loads only if some job has something left to do
                for group in plan.groups:
                    for step in group:
                        job = step if hasattr(step, "items") else step(ex)
                        if isinstance(job, Generator):
                            counts.returned.append(_drive(job, ex, counts))
                        elif isinstance(job, Part):
                            counts.parts[job.name] = job.outcome
                            for stage, c in job.outcome.counts.jobs.items():
                                counts.add(stage, c.__dict__)
                        elif job is not None:
                            counts.add(job.stage, ex.run(job))
        if plan.stamp is not None and finished_something(counts.total.__dict__):
            record_settings(root, study.name, plan.stamp, force=force)
        return replace(study.finish(options, layout, counts), counts=counts)
