"""The counterfactual stage run in this process through its one door (:data:`COUNTERFACTUAL` on
:func:`attnprobe.execution.study.run_study`), as the tests of the stage call it."""

from __future__ import annotations

import contextlib
from pathlib import Path

from attnprobe.counterfactual.job import StepChoice
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.study import COUNTERFACTUAL, CounterfactualOptions
from attnprobe.execution.local import LocalExecutor
from attnprobe.execution.study import run_study


def run_counterfactuals(model, trajectories, policies, out, *, opts: RunOptions | None = None, min_past: int = 5,
                        turns=None, max_steps=None, include_actions: bool = False, batch_size: int = 1,
                        force: bool = False) -> dict:
    """Every policy (specs or policy objects) at the chosen steps of ``trajectories`` into ``out`` with the
    loaded ``model``; the executor's counts."""
    options = CounterfactualOptions(Path(out), trajectories=list(trajectories),
                                    choice=StepChoice(tuple(policies), min_past, include_actions, turns, max_steps),
                                    run=opts or RunOptions(progress=False), batch_size=batch_size, force=force,
                                    table=False)
    return run_study(COUNTERFACTUAL, options, lambda: LocalExecutor(lambda: model, progress=False)).value["counts"]


def run_on(executor, out, *, files=(), trajectories=None, policies=("mask:5",), opts: RunOptions | None = None,
           choice_min_past: int | None = None, **kw) -> dict:
    """The stage on an executor the caller holds (a fake one that runs nothing, in bookkeeping tests): its
    report (``counts``, ``summary``, ...)."""
    options = CounterfactualOptions(Path(out), files=files, trajectories=trajectories, choice=StepChoice(tuple(policies), choice_min_past),
                                    run=opts or RunOptions(progress=False), table=False, **kw)
    return run_study(COUNTERFACTUAL, options, lambda: contextlib.nullcontext(executor)).value
