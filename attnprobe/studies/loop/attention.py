"""The attention side of an interference study, on the same runs: ``attnprobe study attention OUT``.

Two parts, both resumable, run on one executor (local or Ray, chosen once by the CLI):

- **capture** of every recorded call of every setting (``OUT/<setting>/calls.jsonl``, exactly as sent,
  reply included) into ``OUT/<setting>/capture/``, with :class:`attnprobe.capture.job.CaptureJob`: the
  folder format ``attnprobe capture`` writes, so the app and ``attnprobe report`` read it as is;
- **counterfactuals** at the baseline's recorded steps: for every other setting that is one context
  policy, that policy applied after the fact to the baseline's full histories
  (``OUT/<baseline>/history/*.jsonl``, which hold tool calls in both scaffolds) into
  ``OUT/<setting>/counterfactual/``: where the baseline agent's attention would have gone under the
  policy, beside what the agent under the policy did. Steps: the counterfactual command's default
  ``--min-past`` per policy family (:func:`attnprobe.agents.policies.default_min_past`). The
  counterfactual stage is another study (the architecture keeps ``attnprobe.counterfactual`` and
  ``attnprobe.studies`` independent), so the caller hands it in as ``counterfactual``.

Numbers per setting (docs/methods.md, "Attention per setting"): per recorded call, the attention share of
each :data:`CATEGORIES` at two queries of the reply (:data:`QUERIES`), under the seed-002 token convention
(:func:`attnprobe.results.analysis.token_owners`; the categories of
:func:`attnprobe.results.analysis.step_breakdown`, with the observations the call saw as placeholders or
refined text split out by the call's ``meta.history``); per question the mean over its calls, per setting
the mean over questions with a percentile bootstrap CI over questions (:func:`attnprobe.stats.bootstrap_mean_ci`).

Writes ``OUT/attention.json`` and ``OUT/attention.md`` atomically and appends the section to
``OUT/study.md`` (:func:`with_attention`; ``study interference`` keeps it when it rewrites study.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.agents.policies import default_min_past, parse_policy
from attnprobe.capture.job import CaptureJob, CaptureOptions
from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text, finite_json, hold_dir_lock, load_json
from attnprobe.results.analysis import R, token_owners
from attnprobe.results.formatting import format_ci
from attnprobe.results.result import CaptureResult
from attnprobe.stats import bootstrap_mean_ci
from attnprobe.studies.loop.job import read_result, setting_dir
from attnprobe.trajectory.schema import Trajectory, load_trajectories

log = logging.getLogger(__name__)

CAPTURE_DIR, COUNTERFACTUAL_DIR = "capture", "counterfactual"
ATTENTION_JSON, ATTENTION_MD = "attention.json", "attention.md"
HEADING = "## Attention per setting"
QUERIES = ("decision", "reasoning")
QUERY_LABELS = {"decision": "decision token (the last token of each recorded call)",
                "reasoning": "reasoning start (the first token of each call's reply)"}
CATEGORIES = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "placeholder", "refined",
              "current_step")
DEFAULT_CAPTURE = CaptureOptions(queries="reasoning+decision")

# (out folder, baseline history trajectories, policy spec, min_past) -> the counterfactual run's report
# (attnprobe.counterfactual.job.run_on_executor bound to an executor): {"steps", "min_past", ...}.
CounterfactualRunner = Callable[[Path, list[Trajectory], str, int], dict]


# ------------------------------------------------------------------ the study folder
def read_study(out: Path) -> dict:
    """``OUT/study.json``'s settings and baseline; a folder that is not a study is one clear error."""
    path = Path(out) / "study.json"
    if not path.is_file():
        raise AttnprobeError(f"{out}: not an interference study folder (no study.json); make one with "
                             f"'attnprobe study interference QUESTIONS --out {out}'")
    study = load_json(path)
    settings = study.get("settings") if isinstance(study, dict) else None
    settings = list(settings) if isinstance(settings, dict) else settings  # per-setting summaries, in order
    if not isinstance(settings, list) or not settings or not all(isinstance(s, str) for s in settings):
        raise AttnprobeError(f"{path}: field 'settings': expected the settings (a non-empty object or list)")
    baseline = study.get("baseline") or settings[0]
    if baseline not in settings:
        raise AttnprobeError(f"{path}: field 'baseline': {baseline!r} is not one of the settings")
    return {"settings": settings, "baseline": baseline, "models": study.get("models") or []}


def recorded_calls(out: Path, setting: str) -> list[Trajectory]:
    """The setting's recorded calls, as ``study interference`` gathered them (none yet: [])."""
    path = setting_dir(out, setting) / "calls.jsonl"
    return load_trajectories(path) if path.is_file() else []


def histories(out: Path, setting: str) -> list[Trajectory]:
    """The setting's full histories of finished questions (those with a result: an item interrupted after
    its history was written has none), in file-name order."""
    folder = setting_dir(out, setting)
    return [t for p in sorted((folder / "history").glob("*.jsonl"))
            if read_result(folder / "results" / f"{p.stem}.json") is not None for t in load_trajectories(p)]


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


# ------------------------------------------------------------------ the numbers of one recorded call
def call_shares(result: CaptureResult) -> dict[str, dict[str, float]]:
    """Per query of the reply (:data:`QUERIES`, those captured), the attention share of every
    :data:`CATEGORIES`; they sum to the row's mass (1 up to float32 storage).

    Every token is owned by one message under the seed-002 convention (:func:`token_owners`); tokens of a
    message the call saw as a placeholder or as refined text (``meta.history.changes`` of its full-history
    source) count as ``placeholder`` / ``refined``; the others as in
    :func:`attnprobe.results.analysis.step_breakdown`: system, task, past reasoning / tool calls /
    observations (turns before the query's), and the current step (the query's own turn)."""
    turn, role = token_owners(result)
    msg, _ = token_owners(replace(result, segments=[replace(s, turn=s.message_index) for s in result.segments]))
    reply = max(s.message_index for s in result.segments)
    hist = (result.meta.get("trajectory_meta") or {}).get("history") or {}
    source, changes = hist.get("source") or [], hist.get("changes") or {}
    status = np.full(len(msg), "", dtype=object)
    if len(source) == reply:  # one source per message sent (the reply is the last message)
        per_msg = np.asarray([changes.get(str(src), "") for src in source] + [""], dtype=object)
        status = np.where((msg >= 0) & (msg < len(source)), per_msg[np.clip(msg, 0, len(source))], "")
    rows = np.asarray(result.token_attention, dtype=np.float64)
    out: dict[str, dict[str, float]] = {}
    for k, q in enumerate(result.queries):
        name = "decision" if q.kind == "decision" else \
            "reasoning" if q.kind in ("reasoning", "action") and q.message_index == reply else None
        if name is None:
            continue
        row, t = rows[k], q.turn
        ph, rf = status == "placeholder", status == "refined"
        other = ~(ph | rf)
        past, now = other & (turn < t), other & (turn >= t)
        out[name] = {
            "system": float(row[other & (role == R["system"])].sum()),
            "task": float(row[other & (role == R["task"])].sum()),
            "past_reasoning": float(row[past & (role == R["reasoning"])].sum()),
            "past_tool_call": float(row[past & (role == R["tool_call"])].sum()),
            "past_observation": float(row[past & (role == R["observation"])].sum()),
            "placeholder": float(row[ph].sum()), "refined": float(row[rf].sum()),
            "current_step": float(row[now & np.isin(role, [R["reasoning"], R["tool_call"], R["observation"],
                                                            R["template"]])].sum()),
        }
    return out


def _ci(values: np.ndarray, n_boot: int) -> dict:
    """Mean and 95% percentile bootstrap CI over the first axis (questions), per category."""
    mean = values.mean(axis=0)
    if len(values) >= 2:
        lo, hi = bootstrap_mean_ci(values, n_boot=n_boot, seed=0)
    else:
        lo = hi = np.full(values.shape[1:], np.nan)
    return {c: {"mean": float(mean[i]), "lo": float(lo[i]), "hi": float(hi[i])} for i, c in enumerate(CATEGORIES)}


def setting_attention(results: list[CaptureResult], *, n_boot: int = 2000) -> dict:
    """A setting's shares: per question the mean over its captured calls, then the mean over questions
    with a bootstrap CI over questions; also the mean tokens per call (context length)."""
    by_q: dict[str, list[CaptureResult]] = {}
    for r in results:
        qid = str((r.meta.get("trajectory_meta") or {}).get("question_id") or r.trajectory_id)
        by_q.setdefault(qid, []).append(r)
    out: dict[str, Any] = {"questions": len(by_q), "calls": len(results),
                           "tokens_per_call": float(np.mean([len(r.input_ids) for r in results])) if results else None}
    shares = {qid: [call_shares(r) for r in rs] for qid, rs in by_q.items()}
    for q in QUERIES:
        per_q = [np.mean([[s[q][c] for c in CATEGORIES] for s in ss if q in s], axis=0)
                 for ss in shares.values() if any(q in s for s in ss)]
        out[q] = {"questions": len(per_q), **({"shares": _ci(np.asarray(per_q), n_boot)} if per_q else {})}
    out["per_question"] = {qid: {q: {c: float(np.mean([s[q][c] for s in ss if q in s])) for c in CATEGORIES}
                                 for q in QUERIES if any(q in s for s in ss)} for qid, ss in shares.items()}
    return out


# ------------------------------------------------------------------ the run
def _capture_jobs(out: Path, settings: list[str], model, capture: CaptureOptions, force: bool) -> dict[str, CaptureJob]:
    jobs = {}
    for s in settings:
        trajs = recorded_calls(out, s)
        jobs[s] = CaptureJob(setting_dir(out, s) / CAPTURE_DIR, trajs, capture, model=model.spec,
                             backend=model.backend, dtype=model.dtype, force=force)
    conflicts = [c for j in jobs.values() for c in ([] if force else j.conflicts())]
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise AttnprobeError(f"{out} holds captures made with other settings: {conflicts[0]}{more}; "
                             "use --force to replace them")
    return jobs


def run_attention(executor, out: Path, *, model, capture: CaptureOptions = DEFAULT_CAPTURE,
                  counterfactual: CounterfactualRunner | None = None, min_past: int | None = None,
                  force: bool = False, n_boot: int = 2000, only: list[str] | None = None) -> tuple[dict, dict]:
    """Capture every recorded call, run the counterfactuals, write attention.json / attention.md and the
    section of study.md; returns (counts summed over the capture jobs, the attention document).
    ``model``: what the executor loads (``spec``, ``backend``, ``dtype``: recorded and compared on resume);
    ``counterfactual``: None skips that part (said so in the report); ``only``: these settings of the study
    (default all; the counterfactuals still run on the baseline's histories)."""
    out = Path(out)
    study = read_study(out)
    settings, baseline = study["settings"], study["baseline"]
    if only:
        unknown = [s for s in only if s not in settings]
        if unknown:
            raise AttnprobeError(f"--policy {unknown[0]!r} is not a setting of {out} ({', '.join(settings)})")
        settings = [s for s in settings if s in only]
    with hold_dir_lock(out, "study folder"):
        jobs = _capture_jobs(out, settings, model, capture, force)  # refused before any model loads
        counts = {"done_before": 0, "done": 0, "failed": 0}
        for job in jobs.values():
            if job.trajectories:
                for k, v in executor.run(job).items():
                    counts[k] += v
        cf: dict[str, dict] = {}
        base_hist = histories(out, baseline)
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
            rep = counterfactual(setting_dir(out, s) / COUNTERFACTUAL_DIR, base_hist, spec, mp)
            rep["status"] = "ran" if rep.get("steps") else f"no eligible step (none with >= {mp} past turns)"
            cf[s] = rep
        doc = attention_document(out, settings, baseline, jobs, cf, model=model, n_boot=n_boot)
        atomic_write_text(out / ATTENTION_JSON, json.dumps(finite_json(doc), indent=1, ensure_ascii=False))
        atomic_write_text(out / ATTENTION_MD, markdown(doc))
        study_md = out / "study.md"
        if study_md.is_file():
            atomic_write_text(study_md, with_attention(study_md.read_text(encoding="utf-8"), out))
    return counts, doc


def attention_document(out: Path, settings: list[str], baseline: str, jobs: dict[str, CaptureJob],
                       cf: dict[str, dict], *, model, n_boot: int) -> dict:
    """attention.json: per setting the capture counts and shares, and the counterfactual report."""
    per: dict[str, dict] = {}
    for s in settings:
        job = replace(jobs[s])  # a fresh job: its resume states are read anew, after the run
        results = [CaptureResult.load(job.folder(it.data)) for it in job.items() if job.done(it)]
        per[s] = {"recorded_calls": len(job.trajectories), "captured_calls": len(results),
                  "capture_folder": str(job.out.relative_to(out)), **setting_attention(results, n_boot=n_boot)}
        if s in cf:
            per[s]["counterfactual"] = {**cf[s], "folder": f"{setting_dir(out, s).name}/{COUNTERFACTUAL_DIR}"}
    return {"baseline": baseline, "settings": per, "categories": list(CATEGORIES), "queries": list(QUERIES),
            "capture": {**jobs[settings[0]].settings, "model": model.spec}, "study_models": read_study(out)["models"],
            "bootstrap": {"resamples": n_boot, "seed": 0, "level": 0.95, "over": "questions"}}


# ------------------------------------------------------------------ the report
def _pct(d: dict) -> str:
    return format_ci(d["mean"], (d["lo"], d["hi"]), pct=True, signed=False, unit="")


def share_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """One row per setting of attention.json at ``query``: calls captured / recorded, questions, tokens per
    call and each category's share as "x.x [lo, hi]" (%), "n/a" where the setting has no capture there
    (attention.md's table and the app's Study page)."""
    rows = []
    for s, d in doc["settings"].items():
        sh = d[query].get("shares")
        tok = d["tokens_per_call"]
        rows.append({"setting": s, "calls captured / recorded": f"{d['captured_calls']} / {d['recorded_calls']}",
                     "questions": d[query]["questions"], "tokens per call": "n/a" if tok is None else f"{tok:.0f}",
                     **{c.replace("_", " "): _pct(sh[c]) if sh else "n/a" for c in CATEGORIES}})
    return rows


def markdown(doc: dict) -> str:
    """attention.md: the shares per setting at both queries, then the counterfactuals per setting."""
    labels = [c.replace("_", " ") for c in CATEGORIES]
    lines = [f"{HEADING} (attnprobe study attention)", "",
             f"Capture model {doc['capture']['model']} (the study's: {', '.join(doc['study_models']) or '?'}). "
             "Shares (%): per question the mean over its recorded calls, then the mean over questions; brackets: "
             f"95% bootstrap CI over questions ({doc['bootstrap']['resamples']} resamples; none for one question). "
             "Settings send contexts of different lengths (tokens per call): a share over a shorter context is "
             "not comparable with one over a longer context as it stands.", ""]
    for q in QUERIES:
        lines += [f"### {QUERY_LABELS[q].capitalize()}", "",
                  "| setting | calls captured / recorded | questions | tokens per call | " + " | ".join(labels) + " |",
                  "|---" * (len(CATEGORIES) + 4) + "|"]
        lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in share_rows(doc, q)]
        lines.append("")
    lines += [f"### Counterfactuals at the baseline's steps ({doc['baseline']})", "",
              f"Each setting's policy applied after the fact to the full histories of {doc['baseline']} "
              "(attnprobe counterfactual; decision position): where the baseline agent's attention would have "
              "gone under the policy.", ""]
    for s, d in doc["settings"].items():
        rep = d.get("counterfactual")
        if rep is None:
            continue
        if rep["status"] != "ran":
            lines += [f"- **{s}**: {rep['status']}", ""]
            continue
        c = rep["counts"]
        lines += [f"**{s}**: {rep['steps']} steps with >= {rep['min_past']} past turns ({c['done']} run, "
                  f"{c['done_before']} already done, {c['failed']} failed) in {rep['folder']}/", "",
                  rep["markdown"]["decision"]]
    return "\n".join(lines).rstrip("\n") + "\n"


def with_attention(study_md: str, out: Path) -> str:
    """study.md's behaviour tables followed by OUT/attention.md when the attention side has been run (an
    older attention section is replaced), so one report shows behaviour and attention per setting."""
    head = study_md.split("\n" + HEADING, 1)[0].rstrip("\n") + "\n"
    path = Path(out) / ATTENTION_MD
    return head + "\n" + path.read_text(encoding="utf-8") if path.is_file() else head
