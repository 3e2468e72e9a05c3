"""Seed 002's attention evidence and masking counterfactuals in one folder.

For a set of trajectories: capture every reasoning step (``OUT/captures``), compute the headline shares
and decay curves (:mod:`attnprobe.results.analysis`, the seed-002 convention), run the masking
counterfactuals (``OUT/counterfactual``, default ``mask:5``), and write ``OUT/study.json`` and
``OUT/study.md`` with the seed's numbers beside the measured ones (paths: :class:`.layout.MaskingLayout`). The steps are planned (bad policies,
no qualifying step, bad trajectories refused) before the capture stage loads any model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnprobe.capture.job import CAPTURE, CaptureFilesOptions, CaptureOptions
from attnprobe.counterfactual.job import StepChoice
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.study import COUNTERFACTUAL, CounterfactualOptions
from attnprobe.execution.counts import RunCounts
from attnprobe.execution.study import Counts, Outcome, Plan, StudyBase, part
from attnprobe.studies.masking.layout import MaskingLayout

# Seed 002, section 5.3.1: (label, headline key, the seed's value)
SEED002 = (
    ("past reasoning share of per-step attention", "past_reasoning_share", 0.537),
    ("past observation share of per-step attention", "past_observation_share", 0.256),
    ("observation attention within the newest 10% of past turns", "recent10_observation_share", 0.65),
    ("observation attention by the midpoint (newest half)", "midpoint_observation_share", 0.80),
    ("reasoning attention by the midpoint (newest half)", "midpoint_reasoning_share", 0.68),
)


@dataclass(frozen=True)
class MaskingOptions:
    """Everything the study is made with. ``capture``: the capture stage's options (the study always
    captures the reasoning starts, no q/k, no truncation: :meth:`capture_options`); ``model``: the
    :class:`~attnprobe.capture.models.ModelSpec` of the capture resume check; ``model_record``: the
    model as the counterfactual settings record compares it."""

    trajectories: Sequence[Path]
    out: Path
    model: Any
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    choice: StepChoice = field(default_factory=StepChoice)
    counterfactual: RunOptions = field(default_factory=RunOptions)
    model_record: dict | None = None
    batch_size: int = 1
    force: bool = False
    progress: bool = True
    quiet: bool = False

    def capture_options(self) -> CaptureOptions:
        return replace(self.capture, queries="reasoning", save_qk_layers=[], truncate=False)


def study_markdown(head: dict, summary: dict) -> str:
    """The study's tables: seed 002's numbers beside ours, then the counterfactual summary."""
    from attnprobe.counterfactual.summary import markdown_table

    def pct(v):
        return "n/a" if v is None or v != v else f"{100 * v:.1f}%"

    lines = ["# Seed 002 masking study", "",
             f"Steps: {head.get('steps', 0)} reasoning steps with >= {head.get('min_past', 5)} past turns.", "",
             "| measure | seed 002 | measured |", "|---|---|---|"]
    lines += [f"| {label} | {pct(seed)} | {pct(head.get(key))} |" for label, key, seed in SEED002]
    lines += ["", "## Counterfactuals (decision position)", "", markdown_table(summary, "decision"),
              "## Counterfactuals (reasoning start)", "", markdown_table(summary, "reasoning")]
    return "\n".join(lines)


def _decay_record(curves: dict) -> dict:
    return {k: (v.tolist() if hasattr(v, "tolist") else
                {r: x.tolist() for r, x in v.items()} if isinstance(v, dict) else v)
            for k, v in curves.items()}


class MaskingStudy(StudyBase):
    """``attnprobe study masking`` as a :class:`~attnprobe.execution.study.Study`: two parts on one
    executor, each with its own folder, lock and resume (the capture study into ``OUT/captures``, then the
    counterfactual stage into ``OUT/counterfactual``), then ``study.json`` and ``study.md``. The plan refuses
    bad policies, steps and trajectories before the capture part loads any model."""

    name = "study masking"
    folder = "study folder"
    Options, Layout = MaskingOptions, MaskingLayout

    def plan(self, options: MaskingOptions, layout: MaskingLayout) -> Plan:
        o, files = options, [Path(p) for p in options.trajectories]
        o.choice.plan(files)  # refused now, not after the capture part
        capture = CaptureFilesOptions(files, layout.captures_dir, o.capture_options(), o.model, force=o.force,
                                      progress=o.progress)
        cf = CounterfactualOptions(layout.counterfactual_dir, files, choice=o.choice, run=o.counterfactual,
                                   batch_size=o.batch_size, force=o.force, model=o.model_record, table=False)
        return Plan([[part(CAPTURE, capture)], [part(COUNTERFACTUAL, cf)]])

    def finish(self, options: MaskingOptions, layout: MaskingLayout, counts: Counts) -> Outcome:
        from attnprobe.io import atomic_write_text, finite_json
        from attnprobe.results.analysis import decay_curves, headline
        from attnprobe.results.report import find_results
        from attnprobe.results.result import CaptureResult

        results = [CaptureResult.load(p) for p in find_results(layout.captures_dir)]
        head, curves = headline(results), decay_curves(results)
        report = counts.parts[COUNTERFACTUAL.name].value
        summary = report["summary"]
        study = {"headline": head, "seed002": {key: seed for _, key, seed in SEED002},
                 "decay": _decay_record(curves), "counterfactual": summary}
        atomic_write_text(layout.study_json, json.dumps(finite_json(study), indent=1, default=float))
        md = study_markdown(head, summary)
        atomic_write_text(layout.study_md, md)
        captured, steps = counts.jobs.get("capture", RunCounts()), counts.jobs.get("counterfactual", RunCounts())
        return Outcome(lines=([] if options.quiet else [report["markdown"]["decision"]]) + [md],
                       notes=[captured.line("study masking: capture", done="captured", to=layout.captures_dir),
                              steps.line("study masking: counterfactual", done="steps done",
                                         to=layout.counterfactual_dir)],
                       exit_code=max(captured.exit_code, steps.exit_code), value=study)


MASKING = MaskingStudy()
