"""The attention side of an interference study, on the same runs: ``attnprobe study attention OUT``.

Two parts, both resumable, run on one executor (local or Ray, chosen once by the CLI):

- **capture** of every recorded call of every setting (``OUT/<setting>/calls.jsonl``, exactly as sent,
  reply included) into ``OUT/<setting>/capture/``, with :class:`attnprobe.capture.job.CaptureJob`: the
  folder format ``attnprobe capture`` writes, so the app and ``attnprobe report`` read it as is;
- **counterfactuals** at the baseline's recorded steps: for every other setting that is one context
  policy, that policy applied after the fact to the baseline's full histories
  (``OUT/<baseline>/history/*.jsonl``; IRCoT histories are read as the tag text the agent saw) into
  ``OUT/<setting>/counterfactual/``: where the baseline agent's attention would have gone under the
  policy, beside what the agent under the policy did. Steps: the counterfactual command's default
  ``--min-past`` per policy family (:func:`attnprobe.agents.policies.default_min_past`), through the
  counterfactual stage (:func:`attnprobe.counterfactual.job.run_on_executor`, a layer below the studies),
  which writes the folder's summary.md / summary.json (naming both models when the capture model is not
  the agent's).

Numbers per setting (docs/methods.md, "Attention per setting"): per recorded call, the attention share of
each :data:`CATEGORIES` at two queries (:data:`QUERIES`): the **decision** (the last token before the reply,
where the model decided: :func:`attnprobe.render.rendering.decision_point`, the position ``attnprobe
counterfactual`` uses too) and the **reasoning start** (the reply's first token, replies of kind reasoning
only), under the seed-002 token convention (:func:`attnprobe.results.analysis.token_owners`; the categories of
:func:`attnprobe.results.analysis.step_breakdown`, with the observations the call saw as placeholders or
refined text split out by the call's ``meta.history``). A call's **step** is its number of past turns in the
agent's run; the tables use the calls with at least ``shares_min_past`` past turns (by default seed 002 E.5's
five, or fewer when the study's turn limit allows fewer: :func:`default_shares_min_past`; :func:`call_filter`
counts what each filter left out), beside a per-step table of every call. Per
question the mean over its calls, per setting the mean over questions with a percentile bootstrap CI over
questions (:func:`attnprobe.stats.bootstrap_mean_ci`); the same for the **per-token share** relative to
uniform (:func:`relative_share`), and per non-baseline setting the **paired difference** with the baseline
at the same (question, step) (:func:`paired_difference`).

Only the calls and histories of the study's current results are used (:func:`current_results`: the
results study.json summarised, still on disk with the same input stamp, and only their calls with that
stamp), never a question dropped from the study, a deleted result or an earlier run's calls.

Writes ``OUT/attention.json`` (with ``results_stamps``: per setting the stamp of the results it used)
and ``OUT/attention.md`` atomically and appends the section to ``OUT/study.md`` (:func:`with_attention`;
``study interference`` keeps it when it rewrites study.md while the results are the same, and replaces it
by a one-line note when they changed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.agents.policies import default_min_past, parse_policy
from attnprobe.capture.job import CaptureJob, CaptureOptions
from attnprobe.counterfactual.job import run_on_executor
from attnprobe.counterfactual.run import RunOptions
from attnprobe.errors import AttnprobeError, TrajectoryError
from attnprobe.io import atomic_write_text, finite_json, hold_dir_lock
from attnprobe.results.caveats import attention_caveats
from attnprobe.results.result import CaptureResult
from attnprobe.stats import bootstrap_mean_ci
from attnprobe.studies.loop.attention_report import (
    CATEGORIES,
    FILTERS,
    QUERIES,
    SHARES_MIN_PAST,
    default_shares_min_past,
    markdown,
    max_past_turns,
    results_stamp,
    with_attention,
)
from attnprobe.studies.loop.call_shares import (  # noqa: F401  (re-exported: the per-call numbers)
    LOOP_ROLES,
    _query_masks,
    call_record,
    call_shares,
    call_step,
    injected_system_tokens,
    relative_share,
)
from attnprobe.studies.loop.in_loop import log_capture_prefill
from attnprobe.studies.loop.layout import CALLS, HISTORY, StudyLayout
from attnprobe.trajectory.schema import Trajectory

log = logging.getLogger(__name__)

DEFAULT_CAPTURE = CaptureOptions(queries="reasoning+decision")


# ------------------------------------------------------------------ the study folder
def read_study(out: Path) -> dict:
    """``OUT/study.json``'s settings (in order), baseline, models and result stamps
    (:meth:`StudyLayout.read_study`, with the stamps ``study attention`` needs); a folder that is not a
    study is one clear error."""
    study = StudyLayout(Path(out)).read_study(stamps=True)
    settings = list(study["settings"])
    config = study.get("config") if isinstance(study.get("config"), dict) else {}
    return {"settings": settings, "baseline": study["baseline"], "models": study.get("models") or [],
            "results": {s: dict(study["results"].get(s) or {}) for s in settings}, "config": config,
            "invalid_actions": study.get("invalid_actions"), "observations": study.get("observations")}


def current_results(out: Path, setting: str) -> dict[str, str]:
    """``{question id: stamp}`` of the setting's results that study.json summarised and that are still on
    disk with that stamp (:meth:`StudyLayout.current_results`), in study order."""
    return StudyLayout(Path(out)).current_results(setting, read_study(out))


def _trajectories(out: Path, setting: str, part: str, skipped: list[str] | None = None) -> list[Trajectory]:
    """The setting's stamped records of its current results (:meth:`StudyLayout.stamped`) as trajectories. A
    record the trajectory schema refuses (a study of an older attnprobe kept a served model's bad tool call
    as it came) is skipped, not fatal: its one error line (file, line, field) is logged and appended to
    ``skipped``, and the rest of the study goes on."""
    layout = StudyLayout(Path(out))
    trajs = []
    for path, line, rec in layout.stamped(setting, current_results(out, setting), part):
        try:
            traj = Trajectory.from_dict(rec, path=str(path), line=line)
        except TrajectoryError as exc:
            log.warning("study attention: skipped %s", exc)
            if skipped is not None:
                skipped.append(str(exc))
            continue
        traj.origin = f"{path}, line {line}"
        trajs.append(traj)
    return trajs


def recorded_calls(out: Path, setting: str, skipped: list[str] | None = None) -> list[Trajectory]:
    """The setting's recorded calls of its current results (:func:`current_results`), in question order:
    never a call of a question no longer in the study, of a deleted result, or of an earlier run; one
    the schema refuses is skipped and named in ``skipped`` (:func:`_trajectories`)."""
    return _trajectories(out, setting, CALLS, skipped)


def histories(out: Path, setting: str, skipped: list[str] | None = None) -> list[Trajectory]:
    """The setting's full histories of its current results (:func:`current_results`; an item interrupted
    after its history was written has no result), in question order; unreadable ones as in
    :func:`recorded_calls`."""
    return _trajectories(out, setting, HISTORY, skipped)


def counterfactual_spec(setting: str, baseline: str) -> tuple[str | None, str | None]:
    """(policy spec, None) for a setting the counterfactual stage runs, else (None, why not)."""
    if setting == baseline:
        return None, "baseline"
    if setting == "none":
        return None, "no context policy"
    if "+" in setting:
        return None, "a composed setting (the counterfactual stage takes one policy per run)"
    parse_policy(setting)
    return setting, None


# ------------------------------------------------------------------ filters and means
def call_filter(record: dict, query: str, min_past: int) -> str | None:
    """Why a call is left out at ``query`` (None: kept), the first that applies: ``first_call`` (step 0,
    whose past shares are 0 by construction), ``action_only`` (a tool-call-only reply has no reasoning
    start: ``reasoning`` only), ``too_few_past`` (fewer than ``min_past`` past turns, seed 002 E.5),
    ``not_captured`` (no such query in the capture)."""
    if record["step"] == 0 and min_past >= 1:
        return "first_call"
    if query == "reasoning" and record["kind"] != "reasoning":
        return "action_only"
    if record["step"] < min_past:
        return "too_few_past"
    if query not in record["queries"]:
        return "not_captured"
    return None


def _ci(values: np.ndarray, n_boot: int) -> dict:
    """Mean and 95% percentile bootstrap CI over the first axis (questions), per category; a category's
    NaN entries (no token of it) are left out of its own mean."""
    out = {}
    for i, c in enumerate(CATEGORIES):
        v = values[:, i][np.isfinite(values[:, i])]
        if len(v) == 0:
            out[c] = {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "questions": 0}
            continue
        lo, hi = bootstrap_mean_ci(v, n_boot=n_boot, seed=0) if len(v) >= 2 else (np.nan, np.nan)
        out[c] = {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi), "questions": int(len(v))}
    return out


def _per_question(records: list[dict], query: str, field: str) -> dict[str, np.ndarray]:
    """Per question the mean over its calls of ``field`` (shares / relative), categories in order; NaN
    (a category with no token) is left out of its question's mean."""
    by_q: dict[str, list[list[float]]] = {}
    for r in records:
        by_q.setdefault(r["question"], []).append([r["queries"][query][field][c] for c in CATEGORIES])
    return {q: _nanmean(v) for q, v in by_q.items()}


def kept_records(records: list[dict], query: str, min_past: int) -> tuple[list[dict], dict[str, int]]:
    """The calls kept at ``query`` and how many each filter left out (:func:`call_filter`)."""
    left = dict.fromkeys(FILTERS, 0)
    kept = []
    for r in records:
        why = call_filter(r, query, min_past)
        if why is None:
            kept.append(r)
        else:
            left[why] += 1
    return kept, left


def by_step(records: list[dict], query: str) -> dict[str, dict]:
    """Per step (past turns) the mean share of every category over the calls of that step that have the
    query (reasoning replies only for ``reasoning``), first calls included: the table beside the filter."""
    steps: dict[int, list[dict]] = {}
    for r in records:
        if query in r["queries"] and (query != "reasoning" or r["kind"] == "reasoning"):
            steps.setdefault(r["step"], []).append(r)
    return {str(k): {"calls": len(v), "questions": len({r["question"] for r in v}),
                     "shares": {c: float(np.mean([r["queries"][query]["shares"][c] for r in v])) for c in CATEGORIES}}
            for k, v in sorted(steps.items())}


def setting_attention(results: list[CaptureResult], *, n_boot: int = 2000, min_past: int = 5,
                      records: list[dict] | None = None) -> dict:
    """A setting's shares at each query over the calls the filter keeps (:func:`call_filter`, at least
    ``min_past`` past turns): per question the mean over its kept calls, then the mean over questions with
    a bootstrap CI over questions; the same for the per-token share relative to uniform; the counts each
    filter left out; the per-step table; the mean tokens per call (context length)."""
    records = [call_record(r) for r in results] if records is None else records
    out: dict[str, Any] = {"questions": len({r["question"] for r in records}), "calls": len(records),
                           "tokens_per_call": float(np.mean([len(r.input_ids) for r in results])) if results else None,
                           "min_past": min_past}
    for q in QUERIES:
        kept, left = kept_records(records, q, min_past)
        d: dict[str, Any] = {"calls": len(kept), "questions": len({r["question"] for r in kept}), "left_out": left,
                             "by_step": by_step(records, q)}
        if kept:
            d["shares"] = _ci(np.asarray(list(_per_question(kept, q, "shares").values())), n_boot)
            d["relative"] = _ci(np.asarray(list(_per_question(kept, q, "relative").values())), n_boot)
            d["tokens"] = {c: float(np.mean([r["queries"][q]["tokens"][c] for r in kept])) for c in CATEGORIES}
            d["visible_tokens"] = float(np.mean([r["queries"][q]["visible"] for r in kept]))
        out[q] = d
    per_question: dict[str, dict] = {}
    for q in QUERIES:
        for qid, v in _per_question(kept_records(records, q, min_past)[0], q, "shares").items():
            per_question.setdefault(qid, {})[q] = {c: float(v[i]) for i, c in enumerate(CATEGORIES)}
    out["per_question"] = dict(sorted(per_question.items()))
    inj = [r.get("injected_system", 0) for r in records if r.get("injected_system", 0)]
    out["injected_system"] = {"calls": len(inj), "min_tokens": min(inj, default=0), "max_tokens": max(inj, default=0)}
    return out


def paired_difference(setting: list[dict], baseline: list[dict], query: str, *, min_past: int,
                      n_boot: int = 2000) -> dict:
    """Setting - baseline share at the same (question, step), over the calls both keep at ``query``: per
    question the mean difference over its paired steps, then the mean over questions with a paired
    percentile bootstrap CI (questions resampled, each with its pairs). ``pairs`` / ``questions``: how
    many entered; ``unpaired``: kept calls of either side without a partner (a question or step the other
    run did not reach). ``relative_difference``: the same for the per-token share relative to uniform
    (:func:`relative_share`), which corrects for the two contexts' lengths (issue 37); a pair where either
    side has no token of a category is left out of that category's mean."""
    a = {(r["question"], r["step"]): r for r in kept_records(setting, query, min_past)[0]}
    b = {(r["question"], r["step"]): r for r in kept_records(baseline, query, min_past)[0]}
    keys = sorted(set(a) & set(b))
    by_q: dict[str, list[list[float]]] = {}
    rel_q: dict[str, list[list[float]]] = {}
    for k in keys:
        sa, sb = a[k]["queries"][query]["shares"], b[k]["queries"][query]["shares"]
        by_q.setdefault(k[0], []).append([sa[c] - sb[c] for c in CATEGORIES])
        ra, rb = a[k]["queries"][query]["relative"], b[k]["queries"][query]["relative"]
        rel_q.setdefault(k[0], []).append([ra[c] - rb[c] for c in CATEGORIES])  # NaN: no token on a side
    out: dict[str, Any] = {"pairs": len(keys), "questions": len(by_q),
                           "unpaired": {"setting": len(set(a) - set(b)), "baseline": len(set(b) - set(a))}}
    if by_q:
        out["difference"] = _ci(np.asarray([np.mean(v, axis=0) for v in by_q.values()]), n_boot)
        out["relative_difference"] = _ci(np.asarray([_nanmean(v) for v in rel_q.values()]), n_boot)
    return out


def _nanmean(rows: list[list[float]]) -> np.ndarray:
    """Per category the mean of a question's pairs that have a value (NaN where none has)."""
    arr = np.asarray(rows, dtype=np.float64)
    n = np.isfinite(arr).sum(axis=0)
    return np.where(n > 0, np.nansum(arr, axis=0) / np.maximum(n, 1), np.nan)


# ------------------------------------------------------------------ the run
def _capture_jobs(out: Path, settings: list[str], model, capture: CaptureOptions, force: bool,
                  skipped: dict[str, list[str]]) -> dict[str, CaptureJob]:
    jobs = {}
    layout = StudyLayout(out)
    for s in settings:
        trajs = recorded_calls(out, s, skipped.setdefault(s, []))
        jobs[s] = CaptureJob(layout.capture_dir(s), trajs, capture, model=model.spec,
                             backend=model.backend, dtype=model.dtype, force=force)
    conflicts = [c for j in jobs.values() for c in ([] if force else j.conflicts())]
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise AttnprobeError(f"{out} holds captures made with other settings: {conflicts[0]}{more}; "
                             "use --force to redo or another --out")
    return jobs


def run_attention(executor, out: Path, *, model, capture: CaptureOptions = DEFAULT_CAPTURE,
                  counterfactual: RunOptions | None = None, min_past: int | None = None,
                  shares_min_past: int | None = None, force: bool = False, n_boot: int = 2000,
                  only: list[str] | None = None, models=None) -> tuple[dict, dict]:
    """Capture every recorded call, run the counterfactuals, write attention.json / attention.md and the
    section of study.md; returns (counts summed over the capture jobs, the attention document).
    ``model``: what the executor loads (``spec``, ``backend``, ``dtype``: recorded and compared on resume);
    ``counterfactual``: the counterfactual stage's options (capture settings; its steps run on ``executor``
    into ``OUT/<setting>/counterfactual``), None skips that part (said so in the report); ``min_past``: the counterfactual
    steps' (default per policy family); ``shares_min_past``: the share tables' filter (:func:`call_filter`;
    None: :func:`default_shares_min_past`, seed 002 E.5's five or the most past turns the turn limit allows); ``only``: these settings of the study (default all; the
    counterfactuals still run on the baseline's histories, the paired table reads the baseline's
    captures when they exist); ``models``: the :class:`~attnprobe.studies.loop.capture_model.CaptureChoice`
    (capture and agent model names, recorded and shown in every output; None: names not known)."""
    out = Path(out)
    layout = StudyLayout(out)
    study = read_study(out)
    settings, baseline = study["settings"], study["baseline"]
    if shares_min_past is None:
        shares_min_past = default_shares_min_past(study["config"])
    if only:
        unknown = [s for s in only if s not in settings]
        if unknown:
            raise AttnprobeError(f"--only-setting {unknown[0]!r} is not a setting of {out} ({', '.join(settings)})")
        settings = [s for s in settings if s in only]
    with hold_dir_lock(out, "study folder"):
        layout.check(list(dict.fromkeys([*settings, baseline])))  # no symlink out of the folder
        skipped: dict[str, list[str]] = {}  # per setting: the records the schema refused (one line each)
        jobs = _capture_jobs(out, settings, model, capture, force, skipped)  # refused before any model loads
        counts = {"done_before": 0, "done": 0, "failed": 0}
        for s, job in jobs.items():
            if job.trajectories:
                for k, v in executor.run(job).items():
                    counts[k] += v
            log_capture_prefill(s, job)  # calls captured in the loop, tokens prefilled now
        cf: dict[str, dict] = {}
        base_hist = histories(out, baseline, skipped.setdefault(baseline, []))
        for s in settings:
            spec, why = counterfactual_spec(s, baseline)
            if spec is None:
                if s != baseline:
                    cf[s] = {"status": f"not run: {why}"}
                continue
            if counterfactual is None:
                cf[s] = {"status": "not run: no counterfactual stage given"}
                continue
            mp = min_past if min_past is not None else default_min_past([spec])
            rep = run_on_executor(executor, layout.counterfactual_dir(s), base_hist, [spec],
                                  counterfactual, min_past=mp, force=force, model=_model_record(model),
                                  models=models.label if models is not None and models.differs else None)
            rep["status"] = "ran" if rep.get("steps") else f"no eligible step (none with >= {mp} past turns)"
            cf[s] = rep
        doc = attention_document(out, settings, baseline, jobs, cf, model=model, n_boot=n_boot,
                                 min_past=shares_min_past, models=models, skipped=skipped)
        current = {s: results_stamp(current_results(out, s)) for s in study["settings"]}  # what was used
        doc["results_stamps"] = {s: current[s] for s in dict.fromkeys([*settings, baseline])}
        atomic_write_text(layout.attention_json, json.dumps(finite_json(doc), indent=1, ensure_ascii=False))
        atomic_write_text(layout.attention_md, markdown(doc))
        study_md = layout.study_md
        if study_md.is_symlink():
            log.warning("%s: is a symlink; not followed (the attention section is in %s)", study_md,
                        layout.attention_md.name)
        elif study_md.is_file():
            atomic_write_text(study_md, with_attention(study_md.read_text(encoding="utf-8"), out, current))
    return counts, doc


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
