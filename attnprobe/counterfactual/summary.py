"""Summaries of counterfactual runs across steps and trajectories, with confidence intervals.

Per policy and query (decision / reasoning start): the mean share of attention the removed spans
held, where that mass goes (mean change per destination group), the action-change rate (Wilson
interval), tokens saved, and seed 002's check "removed observations held little attention"
(section 5.3.1: "supporting masking of observations the model largely stops reading") as the mean
attention mass on the removed observation content. Means carry percentile bootstrap intervals over
steps (:func:`attnprobe.stats.bootstrap_mean_ci`); steps of one trajectory are not
independent, so with few trajectories read the intervals as descriptive.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnprobe.counterfactual.analysis import GROUPS, QUERY_NAMES
from attnprobe.counterfactual.store import iter_records
from attnprobe.results.formatting import format_ci
from attnprobe.stats import bootstrap_mean_ci, wilson_ci


def _mean_ci(values: list[float], n_boot: int) -> dict:
    x = np.asarray(values, dtype=np.float64)
    if not len(x):
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    lo, hi = bootstrap_mean_ci(x, n_boot=n_boot)
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": int(len(x))}


def summarize(records: Iterable[dict], *, n_boot: int = 2000) -> dict:
    """``{policy: {"steps", "trajectories", "tokens_saved", "tokens_saved_share", "action", per query:
    {"removed_mass", "removed_observation_mass", "removed_share_of_observations", "redistribution":
    {group: ci}, "conservation_error"}}}``."""
    by_policy: dict[str, list[dict]] = {}
    for r in records:
        by_policy.setdefault(r["policy"], []).append(r)
    out = {}
    for policy, recs in sorted(by_policy.items()):
        s: dict = {"steps": len(recs), "trajectories": len({r["trajectory_id"] for r in recs}),
                   "steps_changed": sum(bool(r["changed"]) for r in recs),
                   "tokens_saved": _mean_ci([r["tokens"]["saved"] for r in recs], n_boot),
                   "tokens_saved_share": _mean_ci([r["tokens"]["saved_share"] for r in recs], n_boot),
                   "decision_exact": all(r["decision_exact"]["original"] and r["decision_exact"]["counterfactual"]
                                         for r in recs)}
        acts = [r["action"] for r in recs if "action" in r]
        if acts:
            k, kc, n = sum(a["changed"] for a in acts), sum(a["call_changed"] for a in acts), len(acts)
            kt = sum(a["original"]["text"] != a["counterfactual"]["text"] for a in acts)
            s["action"] = {"n": n, "changed": k, "rate": k / n, "ci": wilson_ci(k, n),
                           "call_changed": kc, "call_rate": kc / n, "call_ci": wilson_ci(kc, n),
                           "text_changed": kt, "text_rate": kt / n, "text_ci": wilson_ci(kt, n),
                           "unparseable": sum(a[c]["decision"] == "unparseable" for a in acts
                                              for c in ("original", "counterfactual"))}
        for q in QUERY_NAMES:
            qs = [r["queries"][q] for r in recs]
            share_obs = [x["removed_observation_mass"] / x["original"]["past_observation"] for x in qs
                         if x["original"]["past_observation"] > 0 and x["removed_observation_mass"] > 0]
            s[q] = {
                "removed_mass": _mean_ci([x["removed_mass"] for x in qs], n_boot),
                "removed_observation_mass": _mean_ci([x["removed_observation_mass"] for x in qs], n_boot),
                "removed_share_of_observations": _mean_ci(share_obs, n_boot),
                "redistribution": {g: _mean_ci([x["redistribution"][g] for x in qs], n_boot) for g in GROUPS},
                "original": {g: _mean_ci([x["original"][g] for x in qs], n_boot) for g in GROUPS},
                "counterfactual": {g: _mean_ci([x["counterfactual"][g] for x in qs], n_boot) for g in GROUPS},
                "conservation_error": float(max((abs(sum(x["redistribution"].values()) - x["removed_mass"])
                                                 for x in qs), default=0.0)),
            }
        out[policy] = s
    return out


def summarize_dir(root: str | Path, **kw) -> dict:
    return summarize(iter_records(root), **kw)


def _ci(d: dict) -> str:
    """A share as percent with its interval, e.g. ``4.1 [2.0, 6.3]``."""
    if not d.get("n"):
        return "n/a"
    return format_ci(d["mean"], (d["lo"], d["hi"]), pct=True, signed=False, unit="")


TABLE_HEAD = ("policy", "steps", "removed mass %", "removed obs. mass %", "where it went (pp)", "action changed",
              "reply changed", "tokens saved")


def table_rows(summary: dict, query: str = "decision") -> list[tuple[str, ...]]:
    """One row per policy (columns :data:`TABLE_HEAD`): removed mass, where it went (largest changes),
    action change (IBIS decision), reply text change, tokens saved. Shared by the markdown table and
    the HTML report."""
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
        rows.append((policy, str(s["steps"]), _ci(q["removed_mass"]), _ci(q["removed_observation_mass"]), where, act,
                     txt, saved))
    return rows


def markdown_table(summary: dict, query: str = "decision") -> str:
    """:func:`table_rows` as a markdown table."""
    head = "| " + " | ".join(TABLE_HEAD) + " |\n|" + "---|" * len(TABLE_HEAD) + "\n"
    return head + "\n".join("| " + " | ".join(r) + " |" for r in table_rows(summary, query)) + "\n"
