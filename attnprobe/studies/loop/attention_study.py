"""``attnprobe study attention`` as a study: the attention side of an interference study folder.

:class:`AttentionStudy` (run by :func:`attnprobe.execution.study.run_study`): the plan reads the study, its
recorded calls and the baseline's histories and refuses what cannot run before any model loads; the groups
capture every recorded call (one :class:`~attnprobe.capture.job.CaptureJob` per setting), then run each
setting's policy through the counterfactual stage's one door on the baseline's histories (a
:func:`~attnprobe.execution.study.part` each, on the same executor); ``finish`` writes attention.json,
attention.md and the attention section of study.md. The numbers: :mod:`attnprobe.studies.loop.attention`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnprobe.agents.context import Setting, parse_settings
from attnprobe.agents.policies import default_min_past
from attnprobe.capture.job import CaptureJob, CaptureOptions
from attnprobe.counterfactual.job import StepChoice
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.steps import choose_steps
from attnprobe.counterfactual.study import COUNTERFACTUAL, CounterfactualOptions
from attnprobe.errors import AttnprobeError
from attnprobe.execution.study import Counts, Outcome, Plan, StudyBase, part, run_study
from attnprobe.io import atomic_write_text, finite_json
from attnprobe.io.options import non_negative_int, option, same_as
from attnprobe.results.caveats import attention_caveats
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.attention import (
    CATEGORIES,
    DEFAULT_CAPTURE,
    QUERIES,
    call_record,
    counterfactual_spec,
    current_results,
    histories,
    paired_difference,
    read_study,
    recorded_calls,
    setting_attention,
)
from attnprobe.studies.loop.attention_report import (
    SHARES_MIN_PAST,
    default_shares_min_past,
    markdown,
    max_past_turns,
    results_stamp,
    with_attention,
)
from attnprobe.studies.loop.in_loop import log_capture_prefill
from attnprobe.studies.loop.layout import StudyLayout
from attnprobe.studies.loop.study import InterferenceOptions

log = logging.getLogger(__name__)


SHARES_MIN_PAST_HELP = (
    "the share tables use calls with at least N past turns in the agent's run (default 5: seed 002 E.5, 'using only "
    "reasoning steps with at least five past turns'; fewer when the study's turn limit allows fewer: 4 for ircot's "
    "--max-turns 4); first calls and, at the reasoning start, tool-call-only replies are always left out (0 keeps "
    "first calls); the per-step table shows every step")


@dataclass(frozen=True)
class AttentionOptions:
    """What the attention side is made with. ``model``: what the executor loads (``spec``, ``backend``,
    ``dtype``: recorded and compared on resume); ``counterfactual``: the counterfactual stage's options
    (its steps run into ``OUT/<setting>/counterfactual``), None skips that part (said so in the report);
    ``min_past``: the counterfactual steps' (default per policy family); ``shares_min_past``: the share
    tables' filter (None: :func:`~attnprobe.studies.loop.attention_report.default_shares_min_past`, seed 002
    E.5's five or the most past turns the turn limit allows); ``only``: these settings of the study
    (default all; the counterfactuals still run on the baseline's histories); ``models``: the
    :class:`~attnprobe.studies.loop.capture_model.CaptureChoice` (capture and agent model names, recorded
    and shown in every output; None: names not known)."""

    out: Path = option(flag="OUT", help="the study folder (--out of 'attnprobe study interference')")
    model: Any = None
    capture: CaptureOptions = DEFAULT_CAPTURE
    counterfactual: RunOptions | None = None
    min_past: int | None = option(
        None, flag="--min-past", type=non_negative_int,
        help="counterfactual steps with at least this many past turns (default per policy, as 'attnprobe "
             "counterfactual': K+1 for mask:K and mask-obs:K, 2 for IRCoT, 1 for refiners)")
    shares_min_past: int | None = option(None, flag="--shares-min-past", type=non_negative_int, metavar="N",
                                         help=SHARES_MIN_PAST_HELP)
    force: bool = False
    n_boot: int = same_as(InterferenceOptions, "n_boot")
    only: list[Setting | str] | None = option(None, flag="--only-setting", action="append", metavar="SETTING",
                                    help="only this setting of the study (repeatable; default: every setting)")
    models: Any = None


@dataclass
class _Planned:
    settings: list[str]
    baseline: str
    study: dict
    jobs: dict[str, CaptureJob]
    skipped: dict[str, list[str]]
    cf: dict[str, dict]  # per setting: the counterfactual's status, or its report once its part ran
    ran: dict[str, int]  # per setting whose counterfactual part runs: its min_past
    shares_min_past: int  # the share tables' filter


class AttentionStudy(StudyBase):
    """``attnprobe study attention`` (see the module docstring)."""

    name = "study attention"
    folder = "study folder"
    Options, Layout = AttentionOptions, StudyLayout

    def plan(self, options: AttentionOptions, layout: StudyLayout) -> Plan:
        o, out = options, layout.folder
        study = read_study(out)
        settings, baseline = study["settings"], study["baseline"]
        shares = o.shares_min_past if o.shares_min_past is not None else default_shares_min_past(study["config"])
        if o.only:
            only = [s.spec for s in parse_settings(o.only)]  # the study's files name its settings by their specs
            unknown = [s for s in only if s not in settings]
            if unknown:
                raise AttnprobeError(f"--only-setting {unknown[0]!r} is not a setting of {out} ({', '.join(settings)})")
            settings = [s for s in settings if s in only]
        layout.check(list(dict.fromkeys([*settings, baseline])))  # no symlink out of the folder
        skipped: dict[str, list[str]] = {}  # per setting: the records the schema refused (one line each)
        jobs = {s: CaptureJob(layout.capture_dir(s), recorded_calls(out, s, skipped.setdefault(s, [])), o.capture,
                              model=o.model.spec, backend=o.model.backend, dtype=o.model.dtype, force=o.force)
                for s in settings}
        base_hist = histories(out, baseline, skipped.setdefault(baseline, []))
        cf: dict[str, dict] = {}
        ran: dict[str, int] = {}
        parts = []
        for s in settings:
            spec, why = counterfactual_spec(s, baseline)
            if spec is None:
                if s != baseline:
                    cf[s] = {"status": f"not run: {why}"}
                continue
            if o.counterfactual is None:
                cf[s] = {"status": "not run: no counterfactual stage given"}
                continue
            mp = o.min_past if o.min_past is not None else default_min_past([spec])
            cf[s] = {"steps": 0, "min_past": mp}  # no step qualifies: nothing run, no folder, no model loaded
            if any(choose_steps(t, min_past=mp) for t in base_hist):
                ran[s] = mp
                parts.append(part(COUNTERFACTUAL, CounterfactualOptions(
                    layout.counterfactual_dir(s), trajectories=base_hist, choice=StepChoice((spec,), mp),
                    run=o.counterfactual, force=o.force, model=_model_record(o.model), table=False,
                    models=o.models.label if o.models is not None and o.models.differs else None), name=s))

        def capture(s: str, job: CaptureJob):
            def step(ex):  # the setting's captures, then its line: calls captured in the loop, tokens prefilled now
                if job.trajectories:
                    yield job
                log_capture_prefill(s, job)

            return step

        captures = [capture(s, j) for s, j in jobs.items()]

        def conflicts() -> list[str]:  # under the lock, before any model loads
            return [c for j in jobs.values() for c in j.conflicts()]

        return Plan([captures, parts], conflicts=None if o.force else conflicts, results="captures made",
                    data=_Planned(settings, baseline, study, jobs, skipped, cf, ran, shares))

    def finish(self, options: AttentionOptions, layout: StudyLayout, counts: Counts) -> Outcome:
        o, out, p = options, layout.folder, counts.plan.data
        cf = dict(p.cf)
        for s, mp in p.ran.items():
            rep = counts.parts[s].value
            rep["status"] = "ran" if rep.get("steps") else f"no eligible step (none with >= {mp} past turns)"
            cf[s] = rep
        for rep in cf.values():
            if "status" not in rep:
                rep["status"] = f"no eligible step (none with >= {rep['min_past']} past turns)"
        doc = attention_document(out, p.settings, p.baseline, p.jobs, cf, model=o.model, n_boot=o.n_boot,
                                 min_past=p.shares_min_past, models=o.models, skipped=p.skipped)
        current = {s: results_stamp(current_results(out, s)) for s in p.study["settings"]}  # what was used
        doc["results_stamps"] = {s: current[s] for s in dict.fromkeys([*p.settings, p.baseline])}
        atomic_write_text(layout.attention_json, json.dumps(finite_json(doc), indent=1, ensure_ascii=False))
        atomic_write_text(layout.attention_md, markdown(doc))
        study_md = layout.study_md
        if study_md.is_symlink():
            log.warning("%s: is a symlink; not followed (the attention section is in %s)", study_md,
                        layout.attention_md.name)
        elif study_md.is_file():
            atomic_write_text(study_md, with_attention(study_md.read_text(encoding="utf-8"), out, current))
        c = counts.jobs.get("capture")
        captured = {"done_before": c.done_before, "done": c.done, "failed": c.failed} if c else \
            {"done_before": 0, "done": 0, "failed": 0}
        cf_failed = sum(d.get("counterfactual", {}).get("counts", {}).get("failed", 0)
                        for d in doc["settings"].values())
        return Outcome(lines=[layout.attention_md.read_text(encoding="utf-8")],
                       notes=[f"study attention: {captured['done']} calls captured, {captured['done_before']} "
                              f"already done, {captured['failed']} failed; {cf_failed} counterfactual steps failed "
                              f"-> {layout.attention_md}"],
                       exit_code=1 if captured["failed"] or cf_failed else 0, value=(captured, doc))


ATTENTION = AttentionStudy()


def run_attention(executor, out: Path, **options: Any) -> tuple[dict, dict]:
    """:data:`ATTENTION` through the one driver on an executor the caller holds (Python callers, tests):
    (the capture counts, the attention document). ``options``: :class:`AttentionOptions`' fields."""
    outcome = run_study(ATTENTION, AttentionOptions(Path(out), **options), lambda: contextlib.nullcontext(executor))
    return outcome.value


def _model_record(model) -> dict:
    """The model as the counterfactual folder's settings record compares it (``spec``, ``backend``,
    ``dtype``: what ``attnprobe counterfactual`` records for its --model options)."""
    return {"spec": model.spec, "backend": model.backend, "dtype": model.dtype}


def _captured(job: CaptureJob) -> list[CaptureResult]:
    job = replace(job)  # a fresh job: its resume states are read anew, after the run
    return [CaptureResult.load(job.folder(it.data)) for it in job.items() if job.done(it)]


def attention_document(out: Path, settings: list[str], baseline: str, jobs: dict[str, CaptureJob],
                       cf: dict[str, dict], *, model, n_boot: int, min_past: int = SHARES_MIN_PAST,
                       models=None, skipped: dict[str, list[str]] | None = None) -> dict:
    """attention.json: per setting the capture counts, shares and per-token shares (filtered, and per
    step), the paired difference with the baseline, the counterfactual report, and ``skipped``: the
    records (calls, or the baseline's histories) the schema refused, one error line each."""
    per: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    layout = StudyLayout(out)
    for s in settings:
        results = _captured(jobs[s])
        records[s] = [call_record(r) for r in results]
        per[s] = {"recorded_calls": len(jobs[s].trajectories), "captured_calls": len(results),
                  "capture_folder": str(jobs[s].out.relative_to(out)),
                  **setting_attention(results, n_boot=n_boot, min_past=min_past, records=records[s])}
        if (skipped or {}).get(s):
            per[s]["skipped"] = skipped[s]
        if s in cf:
            per[s]["counterfactual"] = {**cf[s], "folder": layout.counterfactual_dir(s).relative_to(out).as_posix()}
    if baseline not in records:  # --policy without the baseline: its captures of its current calls, if made
        some = next(iter(jobs.values()))
        base = replace(some, out=layout.capture_dir(baseline), trajectories=recorded_calls(out, baseline))
        records[baseline] = [call_record(r) for r in _captured(base)] if base.out.is_dir() else []
    for s in settings:
        if s != baseline:
            per[s]["paired"] = {q: paired_difference(records[s], records[baseline], q, min_past=min_past,
                                                     n_boot=n_boot) for q in QUERIES}
    names = {} if models is None else {"capture_model": models.capture_model, "agent_model": models.agent_model}
    study = read_study(out)
    doc = {"baseline": baseline, "settings": per, "categories": list(CATEGORIES), "queries": list(QUERIES),
           "min_past": min_past, "max_past_turns": max_past_turns(study["config"]),
           "step": "past turns in the agent's run (meta.step - 1)",
           "capture": {**jobs[settings[0]].settings, "model": model.spec, **names},
           "study_models": study["models"],
           "structured_actions": bool(study["config"].get("structured_actions")),
           **({"invalid_actions": study["invalid_actions"]} if study.get("invalid_actions") else {}),
           **({"observations": study["observations"]} if study.get("observations") else {}),
           "bootstrap": {"resamples": n_boot, "seed": 0, "level": 0.95, "over": "questions",
                         "paired": "questions resampled with their (question, step) pairs"}}
    doc["caveats"] = attention_caveats(doc)
    return doc
