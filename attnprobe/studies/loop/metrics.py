"""Per-setting numbers of the interference study, with bootstrap CIs and paired tests.

Definitions (quoted in docs/methods.md, "Policies in the loop"):

- accuracy / EM: the share of scored questions answered correctly (seed 004 §3.1: EM "is a percentage that
  represents the proportion of correctly answered questions out of all questions"); a question with no
  answer counts as wrong;
- ART: retrievals per question (seed 004 §3.1: "the average number of retrievals required per question");
- tool calls per question (seed 002 §4, "tool calls per query");
- Len.: average context length (seed 004 §3.1, "the average context length (Len.) in multi-turn
  generations"): per question the mean prompt tokens over its model calls, then the mean over questions;
- rolling input tokens: per question the sum of prompt tokens over all its calls (seed 002 §5.1: "Rolling
  input tokens sum context lengths across all turns"); output tokens likewise;
- AIT: seconds per question (seed 004 §3.1, "the average inference time per question (AIT)"): the question's
  own time, per call its share of a batched call (:func:`attnprobe.studies.loop.rollout.rollout`).

CIs: percentile bootstrap over questions (``n_boot`` resamples, fixed ``seed``). Settings are compared with
the baseline on the same questions: fixed (baseline wrong, setting right), broken (the reverse), the exact
McNemar test (two-sided binomial test of fixed vs broken at p = 1/2) and a paired-bootstrap CI of the
accuracy difference.
"""

from __future__ import annotations

import numpy as np

MEASURES = (  # (key in the summary, result field, label)
    ("art", "retrievals", "ART"),
    ("tool_calls", "tool_calls", "tool calls"),
    ("context_tokens", "context_tokens", "Len. (tokens)"),
    ("input_tokens", "input_tokens", "rolling input tokens"),
    ("output_tokens", "output_tokens", "output tokens"),
    ("seconds", "seconds", "AIT (s)"),
)


def bootstrap_ci(values, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of ``values`` (resampling items); None for fewer than 2."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def mcnemar_exact(fixed: int, broken: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of ``fixed`` of ``fixed + broken`` at 1/2 (1.0 if none)."""
    n = fixed + broken
    if n == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(fixed, n, 0.5).pvalue)


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def summarize_setting(results: list[dict], *, n_boot: int = 2000, seed: int = 0) -> dict:
    scored = [r for r in results if r.get("correct") is not None]
    acc = [1.0 if r["correct"] else 0.0 for r in scored]
    out = {"questions": len(results), "scored": len(scored), "correct": int(sum(acc)),
           "accuracy": _mean(acc), "accuracy_ci": bootstrap_ci(acc, n_boot=n_boot, seed=seed),
           "no_answer": sum(bool(r.get("no_answer")) for r in results),
           "model_calls": _mean([r["model_calls"] for r in results]),
           "refiner_calls": _mean([r.get("refiner_calls", 0) for r in results]),
           "context_chars": _mean([r["context_chars"] for r in results])}
    for key, fieldname, _ in MEASURES:
        vals = [r[fieldname] for r in results]
        out[key] = _mean(vals)
        out[f"{key}_ci"] = bootstrap_ci(vals, n_boot=n_boot, seed=seed)
    return out


def paired(base: dict[str, dict], other: dict[str, dict], *, n_boot: int = 2000, seed: int = 0) -> dict:
    """``other`` against ``base`` on the questions both scored (dicts question id -> result)."""
    ids = [q for q in base if q in other and base[q].get("correct") is not None
           and other[q].get("correct") is not None]
    fixed = [q for q in ids if not base[q]["correct"] and other[q]["correct"]]
    broken = [q for q in ids if base[q]["correct"] and not other[q]["correct"]]
    diff = [float(other[q]["correct"]) - float(base[q]["correct"]) for q in ids]
    return {"questions": len(ids), "fixed": fixed, "broken": broken,
            "accuracy_diff": _mean(diff), "accuracy_diff_ci": bootstrap_ci(diff, n_boot=n_boot, seed=seed),
            "mcnemar_p": mcnemar_exact(len(fixed), len(broken))}


def _groups(results: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in results:
        out.setdefault(r.get("type") or "untyped", []).append(r)
    return out


def summarize(by_setting: dict[str, list[dict]], baseline: str, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Every setting's summary, its paired comparison with ``baseline`` and, per question, each setting's
    outcome and which settings fixed or broke it."""
    settings = {s: summarize_setting(rs, n_boot=n_boot, seed=seed) for s, rs in by_setting.items()}
    by_q = {s: {r["question_id"]: r for r in rs} for s, rs in by_setting.items()}
    comparisons = {s: paired(by_q[baseline], by_q[s], n_boot=n_boot, seed=seed)
                   for s in by_setting if s != baseline and baseline in by_q}
    questions: dict[str, dict] = {}
    for s, rs in by_setting.items():
        for r in rs:
            q = questions.setdefault(r["question_id"], {"question": r["question"], "type": r.get("type"),
                                                        "correct": {}, "answer": {}, "fixed_by": [], "broken_by": []})
            q["correct"][s], q["answer"][s] = r.get("correct"), r.get("answer")
    for s, c in comparisons.items():
        for qid in c["fixed"]:
            questions[qid]["fixed_by"].append(s)
        for qid in c["broken"]:
            questions[qid]["broken_by"].append(s)
    by_type = {s: {t: {"questions": len(g), "accuracy": _mean([float(r["correct"]) for r in g
                                                                if r.get("correct") is not None]),
                       "art": _mean([r["retrievals"] for r in g])}
                   for t, g in _groups(rs).items()} for s, rs in by_setting.items()}
    return {"baseline": baseline, "settings": settings, "by_type": by_type, "paired": comparisons,
            "questions": questions,
            "bootstrap": {"resamples": n_boot, "seed": seed, "level": 0.95}}


def _fmt(v, ci=None, pct: bool = False, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    scale = 100.0 if pct else 1.0
    text = f"{v * scale:.{digits}f}"
    if ci is not None:
        text += f" [{ci[0] * scale:.{digits}f}, {ci[1] * scale:.{digits}f}]"
    return text


def in_loop_line(in_loop: dict | None) -> list[str]:
    """study.md's line for ``--capture-in-loop``: per setting the recorded calls whose attention was captured from
    the agent's own forward passes (the rest are left to ``study attention``); nothing when none was."""
    if not in_loop:
        return []
    parts = ", ".join(f"{s} {v['captured']} of {v['calls']}" for s, v in in_loop.items())
    return [f"Calls captured in the loop (attention from the agent's own forward passes; the rest are left to "
            f"'study attention'): {parts}.", ""]


def markdown(summary: dict, *, scaffold: str, scorer: str, model: str | None = None,
             caveats: list[str] | None = None, structured: bool = False, observations: dict | None = None,
             in_loop: dict | None = None) -> str:
    """Seed 004 Tables 1-2 / seed 002 Table 1 in one table (95% bootstrap CIs in brackets), then the paired
    comparisons and the per-question outcomes; ``caveats`` (:mod:`attnprobe.results.caveats`) above the table;
    ``structured``: run with --structured-actions, said in the title; ``observations``: per setting the
    observations that held a passage (study.json ``observations``), one line above the table; ``in_loop``: per
    setting the recorded calls captured in the loop (study.json ``captured_in_the_loop``), one line too."""
    from attnprobe.results.caveats import markdown as caveat_lines
    from attnprobe.results.caveats import passage_line, structured_title

    metric = "EM" if scorer == "em" else f"accuracy ({scorer})"
    lines = [f"# Interference study: scaffold {scaffold}" + (f", model {model}" if model else "")
             + structured_title(structured), "",
             f"Accuracy: {metric}. Brackets: 95% bootstrap CI over questions "
             f"({summary['bootstrap']['resamples']} resamples).", "", *caveat_lines(caveats or []),
             *passage_line(observations), *in_loop_line(in_loop),
             f"| setting | n | {metric} (%) | " + " | ".join(lbl for _, _, lbl in MEASURES) + " | no answer |",
             "|---" * (len(MEASURES) + 4) + "|"]
    for s, m in summary["settings"].items():
        acc = _fmt(m["accuracy"], m["accuracy_ci"], pct=True)
        cells = [_fmt(m[k], m[f"{k}_ci"], digits=2 if k == "art" else 1) for k, _, _ in MEASURES]
        lines.append(f"| {s} | {m['questions']} | {acc} | " + " | ".join(cells) + f" | {m['no_answer']} |")
    types = sorted({t for d in summary["by_type"].values() for t in d})
    if len(types) > 1:  # seed 004's layout: one EM / ART column per question type (its datasets)
        lines += ["", "## By question type (EM % / ART)", "", "| setting | " + " | ".join(types) + " |",
                  "|---" * (len(types) + 1) + "|"]
        for s, d in summary["by_type"].items():
            cells = [f"{_fmt(d[t]['accuracy'], pct=True)} / {_fmt(d[t]['art'], digits=2)}" if t in d else "–"
                     for t in types]
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
    if summary["paired"]:
        lines += ["", f"## Against {summary['baseline']} (same questions)", "",
                  "| setting | fixed | broken | diff (points) | McNemar exact p |", "|---|---|---|---|---|"]
        for s, c in summary["paired"].items():
            lines.append(f"| {s} | {len(c['fixed'])} | {len(c['broken'])} | "
                         f"{_fmt(c['accuracy_diff'], c['accuracy_diff_ci'], pct=True)} | {c['mcnemar_p']:.3g} |")
    settings = list(summary["settings"])
    lines += ["", "## Per question", "", "| question | type | " + " | ".join(settings) + " | fixed by | broken by |",
              "|---" * (len(settings) + 4) + "|"]
    mark = {True: "✓", False: "✗", None: "–"}
    for qid, q in summary["questions"].items():
        lines.append(f"| {qid} | {q['type'] or ''} | " + " | ".join(mark[q['correct'].get(s)] for s in settings)
                     + f" | {', '.join(q['fixed_by'])} | {', '.join(q['broken_by'])} |")
    return "\n".join(lines) + "\n"
