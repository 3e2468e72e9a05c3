"""The counterfactual stage as a study: its one public door (:data:`COUNTERFACTUAL`, run by
:func:`attnprobe.execution.study.run_study`), for ``attnprobe counterfactual``, for the studies that run
it as one of their parts (``study masking``, ``study attention``) and for Python callers alike.

Why one door: the stage used to have four (``run_counterfactuals``, ``run_steps``, ``run_on_executor``,
``run_files``), and the in-process one skipped the settings check and the summary. Now every run of the
stage checks ``OUT``'s settings record, runs the (step, policy) pairs on the executor it is given, records
the settings once a step is finished, and writes ``OUT/summary.json`` and ``OUT/summary.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnprobe.counterfactual import job as stage_job
from attnprobe.counterfactual.job import CounterfactualJob, StepChoice
from attnprobe.counterfactual.layout import CounterfactualLayout
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.summary import QUERY_TABLES, markdown_table, summarize_dir, write_summary
from attnprobe.execution.study import Counts, Outcome, Plan, StudyBase
from attnprobe.io.options import option, positive_int
from attnprobe.trajectory.schema import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CounterfactualOptions:
    """What one counterfactual run takes. The trajectories: ``files`` (read and validated by the plan, ids
    unique across files) or ``trajectories`` already read (a study's recorded histories); ``choice``: the
    policies (specs, or policy objects from Python) and which steps; ``run``: what each step captures;
    ``batch_size``: trajectories per backend call; ``model``: the model as the settings record compares it
    (``spec``/``backend``/``dtype``); ``models``: "capture model X, agent model Y" for the summary when the
    capture model is not the agent's; ``table``: print the decision table (the command's stdout)."""

    out: Path
    files: Sequence[Path] = ()
    trajectories: Sequence[Trajectory] | None = None
    choice: StepChoice = field(default_factory=StepChoice)
    run: RunOptions = field(default_factory=RunOptions)
    batch_size: int = option(1, flag="--trajectories-per-call", type=positive_int, metavar="N",
                             help="trajectories per backend call; the steps of one trajectory always share one call, "
                                  "which prefills their common prefixes once (vLLM batches all their contexts in one "
                                  "generate)")
    force: bool = False
    model: dict | None = None
    models: str | None = None
    table: bool = True


@dataclass(frozen=True)
class Planned:
    """What the plan found: policy specs, the ``min_past`` used, policy names and the steps."""

    specs: list
    min_past: int
    names: list[str]
    steps: list


class CounterfactualStudy(StudyBase):
    """Every chosen (step, policy) of the trajectories into ``out`` (resumable: finished steps made with the
    same settings are skipped; failures go to ``out/errors.jsonl``), then the summary of ``out``. Other
    options than ``out`` was made with are refused before the model loads unless ``force``
    (:func:`~attnprobe.counterfactual.job.options_record`). The per-policy settings a finished step must
    match are made where the model is (``executor.call``), when the job is built, under the lock."""

    name = "counterfactual"
    Options, Layout = CounterfactualOptions, CounterfactualLayout

    def plan(self, options: CounterfactualOptions, layout: CounterfactualLayout) -> Plan:
        c = options.choice
        if options.trajectories is None:
            specs, min_past, names, steps = c.plan(options.files)
        else:
            specs, min_past, names, steps = c.plan_trajectories(options.trajectories)
        if options.trajectories is None:  # a run of files (the command, study masking) says what it found
            log.info("counterfactual: %d steps with >= %d past turns%s", len(steps), min_past,
                     "" if c.min_past is not None else " (the default for these policies)")
        o = options

        def job(ex) -> CounterfactualJob:
            settings = ex.call(stage_job.counterfactual_settings, list(names), replace(o.run, progress=False))
            return CounterfactualJob(layout.folder, list(steps), list(specs), settings, o.run,
                                     batch_size=o.batch_size, force=o.force)

        return Plan([[job]] if steps else [], stamp=stage_job.options_record(o.run, o.model), names=stage_job.OPTION_NAMES,
                    data=Planned(list(specs), min_past, list(names), list(steps)))

    def finish(self, options: CounterfactualOptions, layout: CounterfactualLayout, counts: Counts) -> Outcome:
        out, planned = layout.folder, counts.plan.data
        skipped: list = []
        summary = summarize_dir(out, skipped=skipped)
        for where, why in skipped:
            log.warning("summary: skipped %s: %s", where, why)
        write_summary(out, summary, min_past=planned.min_past, skipped=skipped, models=options.models)
        c = counts.total
        if options.trajectories is None:
            log.info("counterfactual: %d steps done, %d skipped (already done), %d failed; summary in %s",
                     c.done, c.done_before, c.failed, layout.summary_md)
        markdown = {q: markdown_table(summary, q) for q in QUERY_TABLES}
        report = {"steps": len(planned.steps), "min_past": planned.min_past, "counts": dict(c.__dict__),
                  "summary": summary, "skipped": skipped, "markdown": markdown}
        return Outcome(lines=[markdown["decision"]] if options.table else [], exit_code=c.exit_code, value=report)


COUNTERFACTUAL = CounterfactualStudy()


def counterfactual_report(outcome: Outcome) -> dict[str, Any]:
    """The report a composing study reads from the stage's outcome: ``{"counts", "summary", "skipped",
    "markdown": {query: table}, "steps", "min_past"}``."""
    return outcome.value
