"""``study interference`` run through the one driver on an executor the test holds (a scripted chat's),
with the arguments the tests name: (the executor's counts, the study record)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from attnprobe.execution.study import run_study
from attnprobe.studies.loop.study import INTERFERENCE, InterferenceOptions


def run_interference(executor, out, questions, settings, config, *, baseline=None, force=False, n_boot=2000,
                     model=None, batch_size=1) -> tuple[dict, dict]:
    options = InterferenceOptions(Path(out), list(settings), config, questions=list(questions), baseline=baseline,
                                  force=force, n_boot=n_boot, model=model, batch_size=batch_size)
    outcome = run_study(INTERFERENCE, options, lambda: contextlib.nullcontext(executor))
    return dict(outcome.counts.total.__dict__), outcome.value
