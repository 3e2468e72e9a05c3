"""Summaries of counterfactual runs across steps and trajectories, with confidence intervals.

Per policy and query (decision / reasoning start): the mean share of attention on the tokens the
counterfactual context no longer holds (removed mass), on the messages the policy changed (mass on
changed messages; markers and a refiner's kept sentences included), where that mass goes (mean change per destination group), tokens saved, and seed 002's check
"removed observations held little attention" (section 5.3.1: "supporting masking of observations the
model largely stops reading") as the mean attention mass on the removed observation content. For
refiners, the original mass on refined messages split into the sentences the refiner dropped and
those it kept (``refined_split``, :mod:`attnprobe.counterfactual.refined`). Next action, when run:
the change rate of the next action over all steps (an unparseable reply on both sides counts as
unchanged), the change rate of the action
read against the trajectory's own tools over the steps parseable on both sides with that count
(:mod:`attnprobe.counterfactual.actions`), and the mean difference (counterfactual - original) of
the recorded step's teacher-forced log-probability. Means carry percentile bootstrap intervals over
steps (:func:`attnprobe.stats.bootstrap_mean_ci`); steps of one trajectory are not
independent, so with few trajectories read the intervals as descriptive.

A record that cannot be summarised (:func:`attnprobe.counterfactual.records.record_problem`) is
skipped and listed with its reason in ``skipped``; it never stops the summary.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnprobe.counterfactual.analysis import GROUPS, QUERY_NAMES
from attnprobe.counterfactual.layout import CounterfactualLayout, iter_record_files
from attnprobe.counterfactual.records import record_problem
from attnprobe.counterfactual.refined import PARTS
from attnprobe.results.formatting import format_ci
from attnprobe.stats import STUDY_RESAMPLES, bootstrap_mean_ci, wilson_ci

log = logging.getLogger(__name__)


def _mean_ci(values: list[float], n_boot: int) -> dict:
    x = np.asarray(values, dtype=np.float64)
    if not len(x):
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    lo, hi = bootstrap_mean_ci(x, n_boot=n_boot)
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": int(len(x))}


def _usable(records: Iterable, skipped: list | None) -> list[dict]:
    """Records (dicts, or ``(where, dict)`` pairs) that :func:`record_problem` accepts; the rest go
    to ``skipped`` as ``(where, reason)``."""
    out = []
    for k, item in enumerate(records):
        where, r = (str(item[0]), item[1]) if isinstance(item, tuple) and len(item) == 2 else (f"record {k}", item)
        problem = record_problem(r)
        if problem:
            log.warning("skipping counterfactual record %s: %s", where, problem)
            if skipped is not None:
                skipped.append((where, problem))
            continue
        out.append(r)
    return out


def _action_stats(recs: list[dict]) -> dict | None:
    acts = [r["action"] for r in recs if isinstance(r.get("action"), dict)]
    if not acts:
        return None
    k, kc, n = sum(bool(a.get("changed")) for a in acts), sum(bool(a.get("call_changed")) for a in acts), len(acts)
    kt = sum(a["original"]["text"] != a["counterfactual"]["text"] for a in acts)
    return {"n": n, "changed": k, "rate": k / n, "ci": wilson_ci(k, n),
            "call_changed": kc, "call_rate": kc / n, "call_ci": wilson_ci(kc, n),
            "text_changed": kt, "text_rate": kt / n, "text_ci": wilson_ci(kt, n),
            "unparseable": sum(a[c]["decision"] == "unparseable" for a in acts for c in ("original", "counterfactual"))}


def _own_action_stats(recs: list[dict]) -> dict | None:
    from attnprobe.counterfactual.actions import change_rate

    blocks = [r["action"]["own"] for r in recs if isinstance(r.get("action"), dict)
              and isinstance(r["action"].get("own"), dict)]
    return change_rate(blocks) if blocks else None


def _logprob_stats(recs: list[dict], n_boot: int) -> dict | None:
    lps = [r["logprob"] for r in recs if isinstance(r.get("logprob"), dict)]
    if not lps:
        return None
    diff = {k: [lp["counterfactual"][k] - lp["original"][k] for lp in lps] for k in ("sum", "mean")}
    return {"n": len(lps), "diff_sum": _mean_ci(diff["sum"], n_boot), "diff_mean": _mean_ci(diff["mean"], n_boot),
            "original_mean": _mean_ci([lp["original"]["mean"] for lp in lps], n_boot)}


def _refined_split_stats(qs: list[dict], n_boot: int) -> dict | None:
    splits = [x["refined_split"] for x in qs if isinstance(x.get("refined_split"), dict)
              and x["refined_split"].get("split_messages")]
    if not splits:
        return None
    return {p: _mean_ci([float(sp[p]) for sp in splits], n_boot) for p in PARTS}


def _changed_mass(x: dict) -> float:
    """Mass on changed messages; a record written before issue 26 holds it under ``removed_mass``."""
    return float(x["changed_message_mass"] if "changed_message_mass" in x else x["removed_mass"])


def summarize(records: Iterable, *, n_boot: int = STUDY_RESAMPLES, skipped: list | None = None) -> dict:
    """``{policy: {"steps", "trajectories", "steps_changed", "tokens_saved", "tokens_saved_share",
    "action" (own-tool action, over all steps), "action_own" (own tools, over steps parseable on both sides), "logprob",
    per query: {"removed_mass", "changed_message_mass", "removed_observation_mass", "removed_share_of_observations",
    "redistribution": {group: ci}, "original", "counterfactual", "refined_split", "conservation_error"}}}``.

    ``records``: dicts or ``(where, dict)`` pairs; malformed ones are appended to ``skipped`` as
    ``(where, reason)`` and left out. ``conservation_error`` checks normalisation only: both rows sum
    to 1, so redistribution sums to the mass on changed messages by identity. Records written before
    issue 26 (no ``changed_message_mass``: their ``removed_mass`` was the changed messages' mass) count
    in ``changed_message_mass`` and not in ``removed_mass`` (``removed_mass_missing`` counts them)."""
    by_policy: dict[str, list[dict]] = {}
    for r in _usable(records, skipped):
        by_policy.setdefault(r["policy"], []).append(r)
    out = {}
    for policy, recs in sorted(by_policy.items()):
        exact = [r.get("decision_exact") for r in recs]
        s: dict = {"steps": len(recs), "trajectories": len({r["trajectory_id"] for r in recs}),
                   "steps_changed": sum(bool(r.get("changed")) for r in recs),
                   "tokens_saved": _mean_ci([r["tokens"]["saved"] for r in recs], n_boot),
                   "tokens_saved_share": _mean_ci([r["tokens"]["saved_share"] for r in recs], n_boot),
                   "decision_exact": all(isinstance(e, dict) and e.get("original") and e.get("counterfactual")
                                         for e in exact)}
        for key, value in (("action", _action_stats(recs)), ("action_own", _own_action_stats(recs)),
                           ("logprob", _logprob_stats(recs, n_boot))):
            if value is not None:
                s[key] = value
        for q in QUERY_NAMES:
            qs = [r["queries"][q] for r in recs]
            new = [x for x in qs if "changed_message_mass" in x]
            share_obs = [x["removed_observation_mass"] / x["original"]["past_observation"] for x in new
                         if x["original"]["past_observation"] > 0 and x["removed_observation_mass"] > 0]
            s[q] = {
                "removed_mass": _mean_ci([x["removed_mass"] for x in new], n_boot),
                "changed_message_mass": _mean_ci([_changed_mass(x) for x in qs], n_boot),
                "removed_mass_missing": len(qs) - len(new),
                "removed_observation_mass": _mean_ci([x["removed_observation_mass"] for x in new], n_boot),
                "removed_share_of_observations": _mean_ci(share_obs, n_boot),
                "redistribution": {g: _mean_ci([x["redistribution"][g] for x in qs], n_boot) for g in GROUPS},
                "original": {g: _mean_ci([x["original"][g] for x in qs], n_boot) for g in GROUPS},
                "counterfactual": {g: _mean_ci([x["counterfactual"][g] for x in qs], n_boot) for g in GROUPS},
                "conservation_error": float(max((abs(sum(x["redistribution"].values()) - _changed_mass(x))
                                                 for x in qs), default=0.0)),
            }
            split = _refined_split_stats(qs, n_boot)
            if split is not None:
                s[q]["refined_split"] = split
        out[policy] = s
    return out


def summarize_dir(root: str | Path, *, skipped: list | None = None, **kw) -> dict:
    """:func:`summarize` over every step record under ``root``; unreadable or malformed ones (and
    symlinked step folders) are appended to ``skipped`` as ``(path, reason)``."""
    items = []
    for path, record, problem in iter_record_files(root):
        if record is None:
            log.warning("skipping counterfactual record %s: %s", path, problem)
            if skipped is not None:
                skipped.append((str(path), problem))
            continue
        items.append((str(path), record))
    return summarize(items, skipped=skipped, **kw)


def _ci(d: dict) -> str:
    """A share as percent with its interval, e.g. ``4.1 [2.0, 6.3]``."""
    if not d.get("n"):
        return "n/a"
    return format_ci(d["mean"], (d["lo"], d["hi"]), pct=True, signed=False, unit="")


TABLE_HEAD = ("policy", "steps", "removed mass %", "mass on changed messages %", "removed obs. mass %",
             "where it went (pp)", "action changed",
              "reply changed", "tokens saved",
             "action changed, own tools (parseable both / steps; both changed, both same, one-sided, neither)",
              "Δ log p recorded step (per token)", "refined: dropped / kept again %")


def table_rows(summary: dict, query: str = "decision") -> list[tuple[str, ...]]:
    """One row per policy (columns :data:`TABLE_HEAD`): removed mass, mass on changed messages, where the
    latter went (largest changes),
    action change (own-tool action, over all steps), reply text change, tokens saved, the own-tool action
    change over the steps parseable on both sides, the recorded step's log-probability change, and the
    refined messages' dropped / kept-again mass. Shared by the markdown table and the HTML report."""
    rows = []
    for policy, s in summary.items():
        q = s[query]
        red = sorted(((g, v["mean"]) for g, v in q["redistribution"].items() if abs(v["mean"]) >= 0.005),
                     key=lambda kv: -abs(kv[1]))
        where = ", ".join(f"{g} {100 * v:+.1f}" for g, v in red[:4]) or "-"
        if "action" in s:
            a = s["action"]
            act = f"{a['changed']}/{a['n']} ({100 * a['rate']:.0f}% [{100 * a['ci'][0]:.0f}, {100 * a['ci'][1]:.0f}])"
            txt = f"{a['text_changed']}/{a['n']}"
        else:
            act = txt = "not run"
        tok = s["tokens_saved"]
        saved = f"{tok['mean']:.0f} ({100 * s['tokens_saved_share']['mean']:.0f}%)"
        rows.append((policy, str(s["steps"]), _ci(q["removed_mass"]), _ci(q["changed_message_mass"]),
                     _ci(q["removed_observation_mass"]), where, act,
                     txt, saved, _own_cell(s.get("action_own")), _logprob_cell(s.get("logprob")),
                     _split_cell(q.get("refined_split"))))
    return rows


def _own_cell(a: dict | None) -> str:
    if a is None:
        return "not run"
    cells = _own_cells(a)
    if not a["parseable_both"]:
        return f"0 parseable of {a['steps']}{cells}"
    return (f"{a['changed']}/{a['parseable_both']} of {a['steps']} ({100 * a['rate']:.0f}% "
            f"[{100 * a['ci'][0]:.0f}, {100 * a['ci'][1]:.0f}]){cells}")


def _own_cells(a: dict) -> str:
    """The both-changed / both-same / one-sided counts (issue 26 item 9); empty for a summary written
    before they existed."""
    if "one_sided" not in a:
        return ""
    return (f"; both changed {a['both_changed']}, both same {a['both_same']}, one-sided {a['one_sided']} "
            f"(original only {a['one_sided_original']}, counterfactual only {a['one_sided_counterfactual']}), "
            f"neither {a['neither']}")


def _logprob_cell(lp: dict | None) -> str:
    if lp is None:
        return "not run"
    d = lp["diff_mean"]
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] (n = {d['n']})"


def _split_cell(split: dict | None) -> str:
    if split is None:
        return "-"
    return f"{100 * split['dropped']['mean']:.1f} / {100 * split['kept_again']['mean']:.1f} (n = {split['dropped']['n']})"


def markdown_table(summary: dict, query: str = "decision") -> str:
    """:func:`table_rows` as a markdown table."""
    head = "| " + " | ".join(TABLE_HEAD) + " |\n|" + "---|" * len(TABLE_HEAD) + "\n"
    return head + "\n".join("| " + " | ".join(r) + " |" for r in table_rows(summary, query)) + "\n"


QUERY_TABLES = ("decision", "reasoning")


def summary_markdown(summary: dict, *, min_past: int | None = None, skipped: Iterable = (),
                     models: str | None = None) -> str:
    """summary.md: which steps, who read the attention when it is not the agent's model (``models``:
    "capture model X, agent model Y"), the records skipped, then one table per query."""
    skipped = list(skipped)
    notes = [f"Steps with >= {min_past} past turns.", ""] if min_past is not None else []
    notes += [f"{models[0].upper()}{models[1:]}: the attention is the capture model's reading of the agent's "
              "contexts, not the agent's own.", ""] if models else []
    notes += [f"Skipped {len(skipped)} unreadable step record(s): " + "; ".join(f"{w}: {r}" for w, r in skipped), ""] \
        if skipped else []
    return "\n".join(notes + [f"## query: {q}\n\n{markdown_table(summary, q)}" for q in QUERY_TABLES])



def write_summary(out: str | Path, summary: dict, *, min_past: int | None = None, skipped: Iterable = (),
                  models: str | None = None) -> None:
    """OUT/summary.json (the summary, strict JSON) and OUT/summary.md (:func:`summary_markdown`), atomically:
    the stage writes them, whichever command ran it (``attnprobe counterfactual``, ``study attention``)."""
    from attnprobe.io import atomic_write_text, finite_json

    layout = CounterfactualLayout(Path(out))
    atomic_write_text(layout.summary_json, json.dumps(finite_json(summary), indent=1, allow_nan=False))
    atomic_write_text(layout.summary_md, summary_markdown(summary, min_past=min_past, skipped=skipped, models=models))
