"""The IBIS commands as one study (:class:`IbisStudy`, run by :func:`attnprobe.execution.study.run_study`):
``ibis run`` (behaviour), ``ibis capture`` (attention) and ``ibis all`` (both, item group by item group,
then the aggregate and the report) are its ``stages``. The stages' steps are
:mod:`attnprobe.studies.ibis.pipeline`'s (each yields its job and records its counts in run.json after it);
``ibis all`` runs on an executor pair: behaviour jobs need a chat, capture jobs the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from attnprobe.execution.counts import RunCounts
from attnprobe.execution.study import Counts, Outcome, Plan
from attnprobe.studies.ibis.pipeline import (
    IbisOptions,
    all_steps,
    behaviour_steps,
    capture_line,
    capture_steps,
    run_line,
    select_items,
    target,
)


def _quiet(line: str) -> None:
    return None


@dataclass(frozen=True)
class IbisRun:
    """One IBIS command: its options (:class:`IbisOptions`), the ``stages`` it runs (``("run",)``,
    ``("capture",)`` or ``("run", "capture")`` for ``ibis all``), ``report`` (``ibis all``'s report options:
    :class:`~attnprobe.studies.ibis.options.ReportOptions`) and ``say`` (the count lines as they come)."""

    ibis: IbisOptions = field(default_factory=IbisOptions)
    stages: tuple[str, ...] = ("run", "capture")
    report: object | None = None
    say: Callable[[str], None] = _quiet

    @property
    def force(self) -> bool:
        return self.ibis.force


class IbisStudy:
    """See the module docstring. The plan reads and refuses the items and the model folder before any model
    loads; the driver locks the model folder."""

    name = "ibis"
    folder = "IBIS model folder"
    Options = IbisRun

    def layout(self, options: IbisRun):
        return target(options.ibis).layout

    def plan(self, options: IbisRun, layout) -> Plan:
        o, items, where = options.ibis, select_items(options.ibis), target(options.ibis)

        def step(ex):
            if options.stages == ("run",):
                return behaviour_steps(o, where, items, ex)
            if options.stages == ("capture",):
                return capture_steps(o, where, items, ex)
            return all_steps(o, where, items, getattr(ex, "chat_executor", ex), getattr(ex, "model_executor", ex),
                             say=options.say)

        return Plan([[step]], data=where)

    def finish(self, options: IbisRun, layout, counts: Counts) -> Outcome:
        where, value = counts.plan.data, counts.returned[0] if counts.returned else RunCounts()
        if options.stages == ("run",):
            return Outcome(notes=[run_line(value, where)], exit_code=value.exit_code)
        if options.stages == ("capture",):
            return Outcome(notes=[capture_line(value, where)], exit_code=value.exit_code)
        lines, notes = [], []
        if options.report is not None:
            from attnprobe.studies.ibis.report import markdown_report, write_report

            r = options.report
            m = write_report(where.folder, n_boot=r.bootstrap, seed=r.seed, n_perm=r.permutations,
                             plotlyjs=True if r.plotlyjs == "inline" else "cdn")
            lines, notes = [markdown_report(m)], [f"ibis report -> {where.layout.report_html}"]
        return Outcome(lines=lines, notes=notes, exit_code=value)


IBIS = IbisStudy()
