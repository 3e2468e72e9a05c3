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
  counterfactual stage (:data:`attnprobe.counterfactual.study.COUNTERFACTUAL`, a layer below the studies),
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

import logging
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.agents.policies import parse_policy
from attnprobe.capture.job import CaptureOptions
from attnprobe.errors import TrajectoryError
from attnprobe.results.result import CaptureResult
from attnprobe.stats import STUDY_RESAMPLES, bootstrap_mean_ci
from attnprobe.studies.loop.attention_report import (
    CATEGORIES,
    FILTERS,
    QUERIES,
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


def setting_attention(results: list[CaptureResult], *, n_boot: int = STUDY_RESAMPLES, min_past: int = 5,
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
                      n_boot: int = STUDY_RESAMPLES) -> dict:
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
