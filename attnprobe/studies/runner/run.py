"""One question through the agents (:func:`run_one`), the run's summary and its checks; the run over a
JSONL of questions is :mod:`attnprobe.studies.runner.job` (resumable, on any executor).

The files of ``out = X.jsonl`` are :class:`~attnprobe.studies.runner.layout.RunnerLayout`'s: the calls
(``X.jsonl``), one line per finished run, the summary (its ``caveats`` from
:func:`attnprobe.results.caveats.runner_caveats`) and, under a context policy, each search worker's full
history (nothing masked or refined) as one trajectory, ``<run-id>/history-<worker>``, which the worker's
recorded calls link to (``meta.history``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from attnprobe.agents.answers import exact_match
from attnprobe.agents.context import NO_SETTING
from attnprobe.agents.recorder import Recorder, drop_records
from attnprobe.agents.search import SearchBackend
from attnprobe.agents.tools import ToolBox
from attnprobe.errors import AttnprobeError
from attnprobe.io import append_jsonl, ensure_writable_file, located_error, read_jsonl, read_records
from attnprobe.studies.runner.config import RunSettings
from attnprobe.studies.runner.layout import RunnerLayout
from attnprobe.studies.runner.manager import Manager
from attnprobe.studies.runner.worker import WORKER_TOOLS

log = logging.getLogger(__name__)


same_inputs = RunnerLayout.same_inputs  # the done rule's content stamp (kept importable from here)


def history_record(history, *, run_id: str, question: dict, worker: int, task: str, model: str | None) -> dict:
    """A search worker's full history (every observation as the tool returned it) as one trajectory; its
    recorded calls point here (``meta.history.id``) and name, per message sent, the message it came from."""
    return {"id": history.id, "task": task, "model": model, "framing": "trace", "tools": WORKER_TOOLS,
            "messages": history.full, "labels": {},
            "meta": {"runner": "nis-agent", "kind": "full-history", "run_id": run_id, "agent": "search_worker",
                     "worker": worker, "question_id": question["id"], "context_policy": history.setting.spec,
                     "steps": history.steps, "refined": {str(i): t for i, t in sorted(history.refined.items())},
                     "refiner_calls": history.refiner_calls}}


def run_one(chat, search: SearchBackend, question: dict, settings: RunSettings, out: Path, run_id: str,
            replay: list[dict] | None = None, note=None) -> dict:
    rec = Recorder(chat, out, run_id=run_id, task=question["question"], settings=settings.to_dict(),
                   replay=replay, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, note=note)
    toolbox = ToolBox(search, top_k=settings.top_k, page_chars=settings.page_chars)
    t0 = time.perf_counter()
    outcome = Manager(rec, toolbox, settings).run(question["question"])
    rec.finish()
    seconds = time.perf_counter() - t0
    totals = rec.totals()
    if outcome.histories:  # a resumed question's histories are written again: drop what an earlier try wrote
        hpath = RunnerLayout(out).history
        drop_records(hpath, {r.get("id") for r in read_records(hpath, torn_tail="skip", missing_ok=True)
                             if (r.get("meta") or {}).get("run_id") == run_id})
        for k, (task, history) in enumerate(outcome.histories, 1):
            append_jsonl(hpath, history_record(history, run_id=run_id, question=question, worker=k, task=task,
                                               model=getattr(chat, "name", None)))
    if outcome.cut_off:
        log.warning("%s: the answer %r was read from a reply cut at the token limit (%d new tokens); "
                    "raise --max-new-tokens", run_id, outcome.answer[:60], settings.max_new_tokens)
    acted = sum((w.get("context") or {}).get("acted_calls", 0) for w in outcome.worker_reports)
    return {
        "run_id": run_id, "question_id": question["id"], "question": question["question"],
        "gold": question.get("answers") or None, "answer": outcome.answer,
        "correct": exact_match(outcome.answer, question.get("answers")),
        "settings": settings.to_dict(), "model": getattr(chat, "name", None), "seconds": round(seconds, 2),
        "input_tokens": totals["input_tokens"], "output_tokens": totals["output_tokens"], "calls": totals["calls"],
        "per_agent": totals["per_agent"], "replayed_calls": rec.replayed, "manager_steps": outcome.steps,
        "delegations": outcome.delegations, "manager_parse_failures": outcome.parse_failures,
        "forced_answer": outcome.forced, **({"answer_cut_off": True} if outcome.cut_off else {}),
        **({"policy_acted_calls": acted} if settings.context_policy.active else {}), "validation": outcome.validation, "workers": outcome.worker_reports,
    }


def summarize(results: list[dict]) -> dict:
    n = len(results)
    scored = [r for r in results if r.get("correct") is not None]
    mean = (lambda key: round(sum(r[key] for r in results) / n, 1)) if n else (lambda key: 0.0)
    agents: dict[str, dict[str, float]] = {}
    for r in results:
        for a, u in r["per_agent"].items():
            d = agents.setdefault(a, {"calls": 0, "input_tokens": 0, "output_tokens": 0})
            for k in d:
                d[k] += u[k]
    return {
        "runs": n, "scored": len(scored),
        "accuracy": round(sum(bool(r["correct"]) for r in scored) / len(scored), 4) if scored else None,
        "correct": sum(bool(r["correct"]) for r in scored),
        "mean_input_tokens": mean("input_tokens"), "mean_output_tokens": mean("output_tokens"),
        "mean_total_tokens": round(mean("input_tokens") + mean("output_tokens"), 1),
        "mean_calls": mean("calls"), "mean_seconds": mean("seconds"),
        "total_seconds": round(sum(r["seconds"] for r in results), 1),
        "total_input_tokens": sum(r["input_tokens"] for r in results),
        "total_output_tokens": sum(r["output_tokens"] for r in results),
        "total_calls": sum(r["calls"] for r in results),
        "filter": filter_counts(results), "validation": validation_counts(results),
        "answers_cut_off": sum(bool(r.get("answer_cut_off")) for r in results),
        "policy_acted_calls": sum(r.get("policy_acted_calls", 0) for r in results),
        "per_agent_mean": {a: {k: round(v / n, 1) for k, v in d.items()} for a, d in sorted(agents.items())} if n else {},
    }


def filter_counts(results: list[dict]) -> dict[str, int]:
    """Filter decisions (no / sites / keep / unparseable), rewrites, replaced and 'unable' observations."""
    out = {"calls": 0, "no": 0, "sites": 0, "keep": 0, "unparseable": 0, "rewrites": 0, "replaced": 0, "unable": 0}
    for r in results:
        for w in r.get("workers", []):
            out["calls"] += w.get("filter_calls", 0)
            for k, v in (w.get("filter_decisions") or {}).items():
                out[k] = out.get(k, 0) + v
            for k in ("rewrites", "replaced", "unable"):
                out[k] += w.get(k, 0)
    return out


def validation_counts(results: list[dict]) -> dict[str, int]:
    """Validations run, accepted and failed, and how many failures extended the manager's budget."""
    vs = [r["validation"] for r in results if r.get("validation")]
    return {"run": len(vs), "accepted": sum(bool(v.get("accepted")) for v in vs),
            "failed": sum(not v.get("accepted") for v in vs),
            "extended": sum(bool(v.get("extra_steps")) for v in vs)}


def token_table(rows: dict[str, dict]) -> str:
    """The paper's Table 3 shape (average tokens per query) plus accuracy and time."""
    w = max([14, *(len(n) for n in rows)])
    head = f"{'setting':<{w}} {'acc':>9} {'input':>9} {'output':>8} {'total':>9} {'calls':>6} {'s/run':>7}"
    lines = [head, "-" * len(head)]
    for name, s in rows.items():
        acc = "n/a" if s["accuracy"] is None else f"{s['correct']}/{s['scored']}"
        lines.append(f"{name:<{w}} {acc:>9} {s['mean_input_tokens']:>9.1f} {s['mean_output_tokens']:>8.1f} "
                     f"{s['mean_total_tokens']:>9.1f} {s['mean_calls']:>6.1f} {s['mean_seconds']:>7.1f}")
    return "\n".join(lines)


def warn_summary(settings: RunSettings, summary: dict, questions: list[dict]) -> None:
    """The warnings a run's numbers need, logged and added to the summary's ``caveats`` (so the file says
    them too): no gold answers (accuracy null), a policy that changed no call's context (its runs equal the
    run without it by construction), answers read from cut-off replies."""
    notes = summary.setdefault("caveats", [])
    if summary["runs"] and not summary["scored"]:
        notes.append("no question has a gold answer (fields: golden_answers, answers, answer, ...): accuracy is null")
    if summary["runs"] and settings.context_policy.active and not summary["policy_acted_calls"]:
        notes.append(f"the context policy {settings.context_policy} acted on no call (nothing to mask or refine): "
                     "these runs equal runs without it")
    if summary["answers_cut_off"]:
        notes.append(f"{summary['answers_cut_off']} of {summary['runs']} answers were read from replies cut at the "
                     f"token limit ({settings.max_new_tokens}); raise --max-new-tokens")
    for note in notes:
        log.warning("run %s: %s", settings.name, note)


def check_output(out: str | Path, *, resume: bool = True, overwrite: bool = False) -> Path:
    """Refuse an output that cannot be used, before any model is loaded: a folder, a read-only place, or
    (only with ``resume=False``) records already there without ``overwrite``. (The lock is taken by the caller.)"""
    out = ensure_writable_file(Path(out), "output file (--out)")
    if ((out.exists() and out.stat().st_size) or RunnerLayout(out).results.exists()) and not (resume or overwrite):
        raise AttnprobeError(f"{out} already has records: resume it (the default) or use --force to start again")
    return out


def _settings_diff(old, new: dict) -> str:
    """The settings that differ, as ``key: OLD there, NEW now`` (a key a record lacks has its default)."""
    if not isinstance(old, dict):
        return f"settings {old!r} there"
    defaults = {**RunSettings().to_dict(), "extra": {}, "context_policy": NO_SETTING.spec, "structured_actions": False}
    full_old, full_new = {**defaults, **old}, {**defaults, **new}
    keys = [k for k in dict.fromkeys([*full_new, *full_old]) if full_old.get(k) != full_new.get(k)]
    if "context_policy" in keys and "context_rules" in keys:  # follows from the policy: the policy says it
        keys.remove("context_rules")
    if not keys:  # the same values, but a key recorded or not: a run made by another version of the runner
        return "recorded by another version of the runner: " + ", ".join(sorted(set(old) ^ set(new)))
    return "; ".join(f"{k}: {full_old.get(k)!r} there, {full_new.get(k)!r} now" for k in keys)


def check_resume(out: Path, settings: RunSettings) -> None:
    """Refuse to resume ``out`` with settings other than those its runs were made with (a context policy
    included), naming the file, line and the settings that differ. Called before any model is loaded."""
    want = settings.to_dict()
    layout = RunnerLayout(out)
    for path, what in ((layout.results, "run"), (layout.calls, "call")):
        for lineno, r in read_jsonl(path, torn_tail="skip", missing_ok=True, error=located_error(AttnprobeError)):
            meta = r.get("meta") if what == "call" and isinstance(r, dict) else None
            if what == "call" and not (isinstance(meta, dict) and "settings" in meta):
                continue  # not a call of this runner
            got = meta["settings"] if meta is not None else r.get("settings") if isinstance(r, dict) else None
            if got != want:
                name = (r.get("id") if what == "call" else r.get("run_id")) if isinstance(r, dict) else None
                raise located_error(AttnprobeError)(
                    f"{what} {name} was made with other settings ({_settings_diff(got, want)}); resume with "
                    "the same options, use --force to redo or another --out", path, lineno)


def changed_runs(done: dict[str, dict], questions: list[dict], name: str) -> set[str]:
    """The run ids of finished runs whose question changed since (:func:`same_inputs`)."""
    return {f"{name}-{q['id']}" for q in questions
            if f"{name}-{q['id']}" in done and not same_inputs(done[f"{name}-{q['id']}"], q)}
