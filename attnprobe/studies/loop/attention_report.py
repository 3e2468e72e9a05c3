"""attention.md and the tables of the app's Study page, from attention.json (:mod:`.attention` writes it).

Kept apart from the computation so that readers of a finished study (``study interference`` rewriting
study.md, the app) import no capture stage.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from attnprobe.io.urls import redact
from attnprobe.results.formatting import format_ci
from attnprobe.studies.loop.layout import ATTENTION_JSON, ATTENTION_MD, StudyLayout  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

HEADING = "## Attention per setting"
QUERIES = ("decision", "reasoning")
QUERY_LABELS = {"decision": "decision token (the last token before each recorded call's reply)",
                "reasoning": "reasoning start (the first token of each reasoning reply)"}
CATEGORIES = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "placeholder", "refined",
              "current_step")
SHARES_MIN_PAST = 5  # seed 002 E.5: "using only reasoning steps with at least five past turns"
FILTERS = ("first_call", "action_only", "too_few_past", "not_captured")


def max_past_turns(config: dict) -> int | None:
    """The most past turns any call of a study can have, from its config (study.json ``config``): IRCoT's
    ``max_turns`` calls and the final call (both forms) reach ``max_turns`` past turns, seed 002's
    ``max_turns`` calls ``max_turns - 1``; None when the config does not say."""
    turns = config.get("max_turns")
    if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
        return None
    return turns - 1 + int(config.get("scaffold") == "ircot" and config.get("final_call", True) is not False)


def default_shares_min_past(config: dict) -> int:
    """The share tables' default past-turn filter: seed 002 E.5's five (:data:`SHARES_MIN_PAST`), or the most
    past turns the study's turn limit allows when that is fewer (:func:`max_past_turns`): with IRCoT's default
    ``--max-turns 4`` no call has five past turns, so a filter of five left every share table empty (issue 37);
    four keeps the calls with the longest history the scaffold can build."""
    most = max_past_turns(config)
    return SHARES_MIN_PAST if most is None else max(1, min(SHARES_MIN_PAST, most))


def _pct(d: dict) -> str:
    return format_ci(d["mean"], (d["lo"], d["hi"]), pct=True, signed=False, unit="")


def share_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """One row per setting of attention.json at ``query``: calls used / captured / recorded (used: those the
    filter keeps, :func:`call_filter`), questions, tokens per call and each category's share as
    "x.x [lo, hi]" (%), "n/a" where the setting has no kept call (attention.md's table and the app's Study
    page)."""
    rows = []
    for s, d in doc["settings"].items():
        sh = d[query].get("shares")
        tok = d["tokens_per_call"]
        rows.append({"setting": s,
                     "calls used / captured / recorded": f"{d[query].get('calls', '?')} / {d['captured_calls']} / "
                                                         f"{d['recorded_calls']}",
                     "questions": d[query]["questions"], "tokens per call": "n/a" if tok is None else f"{tok:.0f}",
                     **{c.replace("_", " "): _pct(sh[c]) if sh else "n/a" for c in CATEGORIES}})
    return rows


def relative_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """Per setting the per-token share relative to uniform (:func:`relative_share`; 1 = the category's
    length's worth) as "x.xx [lo, hi]", and the mean tokens the query sees."""
    rows = []
    for s, d in doc["settings"].items():
        rel, vis = d[query].get("relative"), d[query].get("visible_tokens")
        rows.append({"setting": s, "tokens seen": "n/a" if vis is None else f"{vis:.0f}",
                     **{c.replace("_", " "): format_ci(rel[c]["mean"], (rel[c]["lo"], rel[c]["hi"]), signed=False,
                                                       digits=2) if rel else "n/a" for c in CATEGORIES}})
    return rows


def _paired(doc: dict, query: str, key: str, fmt, unpaired: bool) -> list[dict[str, Any]]:
    """One row per non-baseline setting from its ``paired[query][key]`` difference, each cell ``fmt(cell)``."""
    rows = []
    for s, d in doc["settings"].items():
        p = (d.get("paired") or {}).get(query)
        if p is None:
            continue
        diff = p.get(key)
        extra = ({"unpaired setting / baseline": f"{p['unpaired']['setting']} / {p['unpaired']['baseline']}"}
                 if unpaired else {})
        rows.append({"setting": s, "pairs (questions)": f"{p['pairs']} ({p['questions']})", **extra,
                     **{c.replace("_", " "): fmt(diff[c]) if diff else "n/a" for c in CATEGORIES}})
    return rows


def paired_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """Per non-baseline setting the paired share difference with the baseline (pp, :func:`paired_difference`)."""
    return _paired(doc, query, "difference", lambda c: format_ci(c["mean"], (c["lo"], c["hi"]), pct=True), True)


def relative_paired_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """Per non-baseline setting the paired difference of per-token shares relative to uniform with the
    baseline (:func:`paired_difference`'s ``relative_difference``), beside the raw one (issue 37)."""
    return _paired(doc, query, "relative_difference",
                   lambda c: format_ci(c["mean"], (c["lo"], c["hi"]), digits=2), False)


def filtered_empty(doc: dict, query: str) -> bool:
    """Whether the past-turn filter kept no call of any setting at ``query``: every cell of the share,
    per-token and paired tables is n/a, so the per-step table is the one with numbers and comes first."""
    return not any(d[query].get("shares") for d in doc["settings"].values())


def step_rows(doc: dict, query: str) -> list[dict[str, Any]]:
    """Per setting and step (past turns) the mean share (%) over that step's calls, first calls included."""
    return [{"setting": s, "step": int(k), "calls": v["calls"],
             **{c.replace("_", " "): f"{100 * v['shares'][c]:.1f}" for c in CATEGORIES}}
            for s, d in doc["settings"].items() for k, v in d[query].get("by_step", {}).items()]


def left_out_text(doc: dict, query: str) -> str:
    """One line per query: how many calls each filter left out, per setting."""
    parts = []
    for s, d in doc["settings"].items():
        lo = d[query].get("left_out") or {}
        parts.append(f"{s}: " + ", ".join(f"{lo.get(k, 0)} {k.replace('_', ' ')}" for k in FILTERS
                                          if k != "action_only" or query == "reasoning"))
    return "; ".join(parts)


def _table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    head = list(rows[0])
    return ["| " + " | ".join(head) + " |", "|---" * len(head) + "|",
            *("| " + " | ".join(str(v) for v in r.values()) + " |" for r in rows), ""]


def models_label(doc: dict) -> str | None:
    """"capture model X, agent model Y" when attention.json says the capture model is not the agent's
    (:mod:`attnprobe.studies.loop.capture_model`), else None."""
    cap = doc.get("capture") or {}
    c, a = cap.get("capture_model"), cap.get("agent_model")
    return f"capture model {c}, agent model {a}" if c and a and c != a else None


def markdown(doc: dict) -> str:
    """attention.md: the caveats, then per query the filtered shares, the per-token shares, the paired
    differences with the baseline (raw and per-token) and the per-step table, which comes first when the
    filter kept no call (:func:`filtered_empty`); then the counterfactuals per setting. Its title names
    structured actions when the study used them. A capture
    model other than the agent's is named with the agent's in every heading and table caption."""
    from attnprobe.results.caveats import markdown as caveat_lines

    mp = doc.get("min_past", SHARES_MIN_PAST)
    label = models_label(doc)
    tag = f" ({label})" if label else ""
    cap = doc["capture"]
    who = (f"**{label[0].upper()}{label[1:]}**: the attention below is the capture model's reading of the "
           "agent's contexts, not the agent's own." if label else
           f"Capture model {cap.get('capture_model') or cap['model']} (the agent's: "
           f"{cap.get('agent_model') or ', '.join(doc['study_models']) or '?'}).")
    from attnprobe.results.caveats import structured_title

    lines = [f"{HEADING} (attnprobe study attention){structured_title(bool(doc.get('structured_actions')))}", "",
             *caveat_lines(doc.get("caveats") or []),
             f"{who} "
             f"Calls used: those with at least {mp} past turns (seed 002 E.5: \"using only reasoning steps with at "
             f"least five past turns\"; --shares-min-past; the default is five, or the most past turns the study's "
             f"turn limit allows when fewer{_most(doc)}), a call's step being its number of past turns in the "
             "agent's run; first calls (0 past turns, past shares 0 by construction) and, at the reasoning start, "
             "tool-call-only replies (no reasoning start) are left out. Shares (%): per question the mean over "
             "its calls, then the mean over questions; brackets: 95% bootstrap CI over questions "
             f"({doc['bootstrap']['resamples']} resamples; none for one question). Settings send contexts of "
             "different lengths, so compare them with the per-token shares (share / (category tokens / tokens "
             "the query sees): 1 = its length's worth) and the paired differences (same question and step as "
             f"the baseline, {doc['baseline']}; pp, paired bootstrap over questions).", ""]
    for q in QUERIES:
        lines += [f"### {QUERY_LABELS[q].capitalize()}{tag}", "", f"Left out: {left_out_text(doc, q)}.", ""]
        steps = [f"Per step (past turns; every call with this query, first calls included; mean share %){tag}:", "",
                 *_table(step_rows(doc, q))]
        empty = filtered_empty(doc, q)
        if empty:  # the one table with numbers first (issue 37)
            lines += [f"No call has {mp} or more past turns at this query: the filtered tables after the per-step "
                      "table are empty (n/a).", "", *steps]
        lines += [f"Attention share (%){tag}:", ""]
        lines += _table(share_rows(doc, q))
        lines += [f"Per-token share relative to uniform (1 = the category's length's worth){tag}:", ""]
        lines += _table(relative_rows(doc, q))
        lines += [f"Paired difference with {doc['baseline']} (setting - baseline, pp, same question and step){tag}:",
                  ""]
        lines += _table(paired_rows(doc, q))
        lines += [f"Paired difference of per-token shares relative to uniform with {doc['baseline']} (setting - "
                  f"baseline, same question and step){tag}:", ""]
        lines += _table(relative_paired_rows(doc, q))
        if not empty:
            lines += steps
    lines += [f"### Counterfactuals at the baseline's steps ({doc['baseline']}){tag}", "",
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
    return redact("\n".join(lines).rstrip("\n") + "\n")  # a refiner URL's credentials are never written


def _most(doc: dict) -> str:
    most = doc.get("max_past_turns")
    return f"; this study's calls have at most {most}" if isinstance(most, int) else ""


def results_stamp(stamps: dict[str, str]) -> str:
    """One setting's results as one digest: its ``{question id: result stamp}`` (study.json's ``results``).
    attention.json records it per setting it used; study.md keeps the attention section while they agree."""
    return hashlib.sha256(json.dumps(stamps, sort_keys=True).encode()).hexdigest()[:20]


def results_stamps(results: dict[str, dict[str, str]]) -> dict[str, str]:
    """Per setting the :func:`results_stamp` of study.json's ``results``: what attention.json must record to
    be current (study.md and the app's Study page both check it, :func:`stale_reason`)."""
    return {redact(s): results_stamp(v) for s, v in results.items()}  # keyed as study.json names the settings


def stale_reason(doc: Any, current: dict[str, str]) -> str | None:
    """The one staleness rule of a parsed attention.json: why it no longer matches the study's results
    ``current`` (:func:`results_stamps`), or None when it does: a setting whose results changed since it was
    computed, or no stamp (an older attnprobe)."""
    made = doc.get("results_stamps") if isinstance(doc, dict) else None
    if not isinstance(made, dict) or not made:
        return f"{ATTENTION_JSON} records no stamp of the results it used"
    changed = [s for s, v in made.items() if current.get(s) != v]
    return f"the results of {changed[0]} changed since it ran" if changed else None


def dropped_line(why: str, out: Path | str) -> str:
    """The line study.md and the app show instead of a stale attention section."""
    return (f"Dropped: {why}; run 'attnprobe study attention {out}' again for the attention of the current "
            "results.")


def stale_attention(out: Path, current: dict[str, str]) -> str | None:
    """Why OUT/attention.json no longer matches the study's results (None: it does; :func:`stale_reason`),
    or why it cannot be read."""
    from attnprobe.errors import AttnprobeError

    layout = StudyLayout(Path(out))
    try:
        doc = layout.read_attention()
        if doc is None:
            raise AttnprobeError(f"{layout.attention_json}: file not found")
    except AttnprobeError as exc:
        return f"{ATTENTION_JSON} unreadable ({exc})"
    return stale_reason(doc, current)


def with_attention(study_md: str, out: Path, current: dict[str, str] | None = None) -> str:
    """study.md's behaviour tables followed by OUT/attention.md when the attention side has been run (an
    older attention section is replaced), so one report shows behaviour and attention per setting.
    ``current``: the study's :func:`results_stamp` per setting; an attention section computed from other
    results is dropped, and a line says so (run ``attnprobe study attention`` again)."""
    head = redact(study_md.split("\n" + HEADING, 1)[0].rstrip("\n") + "\n")  # no URL's credentials in study.md
    path = StudyLayout(Path(out)).attention_md
    if path.is_symlink():  # a received folder's link to some other file: never copied into study.md
        log.warning("%s: is a symlink; not followed (study.md gets no attention section)", path)
        return head
    if not path.is_file():
        return head
    if current is not None and (why := stale_attention(out, current)):
        return head + f"\n{HEADING}\n\n{redact(dropped_line(why, out))}\n"
    return head + "\n" + redact(path.read_text(encoding="utf-8"))
