"""Caveats computed from a study's own records: what its numbers cannot show, said where they are read.

Pure functions over study.json (:func:`study_caveats`), attention.json (:func:`attention_caveats`) and the
runner's results (:func:`runner_caveats`); each returns one sentence per caveat that holds (empty when none
does). study.md, attention.md, the runner's summary and the app's Study page print them (docs/loop.md,
"Caveats"; definitions in docs/methods.md, "Caveats"):

- **retrieved nothing** (:func:`retrieved_nothing`): a setting other than the baseline none of whose recorded
  calls held an observation (:func:`has_observation`; decided from ART 0 only where no call is at hand).
  No context policy had anything to act on, whether no retrieval ran or every retrieval returned nothing;
  with greedy decoding its calls are the baseline's, so its row equals the baseline's by construction (with
  sampling, it differs only by the draw);
- **few questions** (:func:`few_questions`): a table whose CIs are over fewer than :data:`MIN_QUESTIONS`
  questions (a percentile bootstrap over 3 questions has at most 10 distinct means);
- **injected system text** (:func:`injected_system`): calls sent without a system message whose chat
  template wrote a default one (SmolLM2, Qwen): attention.md's ``system`` is that text and the first token;
- **past-turn filter** (:func:`past_turn_filter`): captured calls left out of the share tables by
  ``--shares-min-past`` (seed 002 E.5), first calls included;
- **grammar not applied** (:func:`grammar_not_applied`): replies recorded as structured (``--structured-actions``)
  that do not parse as the action grammar the backend was sent (:func:`structured_replies`);
- **invalid actions** (:func:`invalid_actions`): recorded replies that were not a valid action of the scaffold
  (study.json ``invalid_actions``, counted per setting from the recorded calls by
  :mod:`attnprobe.studies.loop.validity`); attention.md carries study.json's count;
- **skipped records** (:func:`skipped_records`): recorded calls or histories ``study attention`` could not
  read as trajectories (an older study's bad tool call), named by their first error line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MIN_QUESTIONS = 10  # below this, a bootstrap CI over questions is not informative (docs/methods.md)


def _span(values: Iterable[int]) -> str:
    v = sorted(set(values))
    return str(v[0]) if len(v) == 1 else f"{v[0]} to {v[-1]}"


# Tool results that carry nothing a policy treats as retrieved text: an empty search (the seed002 browser's
# "No results for 'q'.", studies/loop/pool.py) and a failed call ("Error..."; masking never archives errors).
_EMPTY_RESULTS = ("No results for ", "Error")
# What a policy leaves of a message it edited away: its placeholder text is not a passage.
_EDITED_AWAY = ("placeholder", "removed")


def _observation_text(msg: Mapping) -> str:
    text = msg.get("content")
    if not isinstance(text, str):  # OpenAI text parts
        text = "".join(p.get("text", "") for p in text or [] if isinstance(p, Mapping))
    if msg.get("role") == "tool":
        return text.strip()
    spans = [a for a in msg.get("annotations") or [] if isinstance(a, Mapping) and a.get("role") == "observation"]
    inner = "".join(text[int(a.get("start", 0)):int(a.get("end", 0))] for a in spans)
    return inner.replace("<information>", "").replace("</information>", "").strip()  # IRCoT's document block


def has_observation(call: Mapping) -> bool:
    """Whether a recorded call held a retrieved passage: a sent message (all but the recorded reply, the
    last) that is a tool result or an ``observation``-labelled span (IRCoT's ``<information>`` block) with
    text that is not an empty search or an error. Whatever a policy edited: a message the policy replaced
    by a placeholder or removed (``meta.history.changes`` of its full-history message ``source[k]``) is no
    passage, and a change alone is no observation (masking an empty ``<information></information>`` adds
    placeholder text, it retrieves nothing)."""
    hist = (call.get("meta") or {}).get("history") or {}
    sent = (call.get("messages") or [])[:-1]
    source = hist.get("source") if isinstance(hist, Mapping) else None
    changes = (hist.get("changes") if isinstance(hist, Mapping) else None) or {}
    if not isinstance(source, list) or len(source) != len(sent) or not isinstance(changes, Mapping):
        source = [None] * len(sent)
    return any(isinstance(m, Mapping) and changes.get(str(i)) not in _EDITED_AWAY
               and (t := _observation_text(m)) and not t.startswith(_EMPTY_RESULTS)
               for m, i in zip(sent, source))


def observations_with_passage(histories: Iterable[Mapping]) -> dict[str, int]:
    """Over one setting's full histories (what the agent retrieved, before any policy edited it), ``{"with_passage":
    N, "observations": M}``: M observations (tool results: IRCoT's documents, seed 002's browser results), N of
    them holding a passage (text that is not an empty search or an error). study.json's ``observations``; study.md
    and scripts/demo_loop.sh print the fraction (issue 37: a demo whose queries never hit says so)."""
    texts = [_observation_text(m) for h in histories if isinstance(h, Mapping)
             for m in h.get("messages") or [] if isinstance(m, Mapping) and m.get("role") == "tool"]
    return {"with_passage": sum(bool(t) and not t.startswith(_EMPTY_RESULTS) for t in texts), "observations": len(texts)}


def empty_observations(observations: Mapping | None, baseline: str) -> list[str]:
    """The caveat for the baseline (and a ``none`` setting), which :func:`retrieved_nothing` leaves out: it
    searched, but none of its observations held a passage (study.json ``observations``), so its past-observation
    attention is attention to empty result markup (an empty ``<information></information>`` block)."""
    out = []
    for s, o in (observations or {}).items() if isinstance(observations, Mapping) else ():
        n, m = (o or {}).get("with_passage", 0), (o or {}).get("observations", 0)
        if (s == baseline or s == "none") and m and not n:
            out.append(f"setting {s} retrieved no passage: none of its {m} observation{'' if m == 1 else 's'} held "
                       "one (empty results), so its past-observation attention is attention to empty result markup, "
                       "not to retrieved text")
    return out


def passage_line(observations: Mapping | None) -> list[str]:
    """study.md's line: per setting the observations that held a passage, of those retrieved."""
    if not isinstance(observations, Mapping) or not observations:
        return []
    parts = []
    for s, o in observations.items():
        n, m = (o or {}).get("with_passage", 0), (o or {}).get("observations", 0)
        parts.append(f"{s} {n} of {m}" + (f" ({100 * n / m:.0f}%)" if m else ""))
    return [f"Observations that held a passage (of those retrieved, before any policy edited them): {', '.join(parts)}.",
            ""]


def observed_calls(calls: Iterable[Mapping]) -> tuple[int, int]:
    """(calls with an observation, calls) over one setting's recorded calls (its calls.jsonl)."""
    calls = [c for c in calls if isinstance(c, Mapping)]
    return sum(map(has_observation, calls)), len(calls)


def retrieved_nothing(settings: Mapping[str, Mapping], baseline: str, *, temperature: float | None = None,
                      calls: Mapping[str, Iterable[Mapping]] | None = None) -> list[str]:
    """One caveat per setting (not the baseline, not ``none``) with finished questions whose recorded calls
    (``calls``: setting -> its calls.jsonl records) held no observation (:func:`has_observation`); a setting
    without recorded calls is decided from ART 0 (mean retrievals per question, study.json
    ``settings[S].art``). The text keeps the retrieval count (ART x questions). ``temperature``: the
    study's (config); with sampling (> 0) the row equals the baseline's only in distribution."""
    out = []
    for s, m in settings.items():
        n_q = m.get("questions") or 0
        if s == baseline or s == "none" or not n_q:
            continue
        art = m.get("art")
        retrievals = f"{round(art * n_q)} retrieval{'' if round(art * n_q) == 1 else 's'}" if _num(art) else \
            "retrievals unknown"
        seen, n_calls = observed_calls((calls or {}).get(s) or [])
        if n_calls:
            if seen:
                continue
            # the policy may still have edited the empty observations (a placeholder for an empty block): its row
            # is not the baseline's by construction, but nothing it changed was retrieved text (issue 37)
            out.append(f"setting {s} retrieved nothing: no observation held a passage (none in any of its {n_calls} "
                       f"recorded calls; {retrievals} over {n_q} questions); whatever differs from the baseline "
                       "comes from what the policy wrote in place of empty observations, not from retrieved text")
            continue
        elif _num(art) and art == 0:
            why = f"{retrievals} over {n_q} questions"
        else:
            continue
        same = ("its row equals the baseline by construction" if not temperature else
                f"its row differs from the baseline only by sampling (temperature {temperature:g})")
        out.append(f"setting {s} retrieved nothing: no policy acted ({why}); {same}")
    return out


def baseline_never_searched(settings: Mapping[str, Mapping], baseline: str) -> list[str]:
    """The caveat when the baseline setting finished questions with ART 0 (study.json ``settings[B].art``:
    mean retrievals per question): its agent never searched, so the study compares context policies over
    histories that hold no retrieval of the baseline's."""
    m = settings.get(baseline) or {}
    n_q, art = m.get("questions") or 0, m.get("art")
    if not n_q or not _num(art) or art != 0:
        return []
    return [f"the baseline {baseline} never searched (0 retrievals over {n_q} question{'' if n_q == 1 else 's'}): "
            "its agent answered without retrieving, so no setting's difference from it is a policy's effect on "
            "retrieved text"]


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def few_questions(ns: Iterable[int], *, threshold: int = MIN_QUESTIONS) -> list[str]:
    """The caveat when the smallest number of questions a CI is computed over (``ns``, one per row; rows
    with no question ignored) is below ``threshold``."""
    small = [n for n in ns if 0 < n < threshold]
    if not small:
        return []
    return [f"n = {_span(small)}: intervals are not informative (95% bootstrap CIs over fewer than {threshold} "
            "questions)"]


def structured_replies(calls: Iterable[Mapping]) -> dict[str, int]:
    """Over recorded calls, ``{"replies": M, "off_grammar": N}``: M replies recorded as structured and checked
    against their grammar (``meta.follows_grammar``), N of them that do not parse as an action of it."""
    checked = [m["follows_grammar"] for c in calls if isinstance(c, Mapping)
               and isinstance(m := c.get("meta"), Mapping) and isinstance(m.get("follows_grammar"), bool)]
    return {"replies": len(checked), "off_grammar": checked.count(False)}


def grammar_not_applied(counts: Mapping | None) -> list[str]:
    """The caveat when replies recorded as structured do not follow the grammar the backend was sent
    (study.json ``structured_replies``, :func:`structured_replies`)."""
    n, m = (counts or {}).get("off_grammar") or 0, (counts or {}).get("replies") or 0
    if not n:
        return []
    return [f"the server did not apply the grammar ({n} of {m} replies): --structured-actions is recorded, but "
            f"{n} of the {m} replies do not parse as the scaffold's action grammar (decoded freely, or cut at the "
            "token limit); these results are not those of constrained decoding"]


def invalid_actions(counts: Mapping | None) -> list[str]:
    """The caveat when recorded replies were not valid actions (study.json ``invalid_actions``: ``replies``
    M, ``invalid`` N, per setting ``[N_s, M_s]``): an invalid turn gets the scaffold's feedback (IRCoT) or
    cannot run (seed 002), so those steps show the model failing the format, not using what it retrieved."""
    if not isinstance(counts, Mapping):
        return []
    n, m = counts.get("invalid") or 0, counts.get("replies") or 0
    if not n or not m:
        return []
    per = counts.get("settings") if isinstance(counts.get("settings"), Mapping) else {}
    parts = ", ".join(f"{s} {v[0]} of {v[1]}" for s, v in per.items()
                      if isinstance(v, (list, tuple)) and len(v) == 2)
    return [f"{n} of {m} replies were not valid actions (no search or answer the scaffold could act on; at the final "
            f"call only an answer counts){': ' + parts if parts else ''}"]


def structured_title(structured: bool) -> str:
    """The words every title of a study run with ``--structured-actions`` carries (study.md, attention.md, the
    app's Study page): the agent's replies were constrained to the action grammar, so its behaviour is not the
    seeds' free decoding."""
    return ", structured actions (--structured-actions: constrained decoding, not the seeds' free decoding)" \
        if structured else ""


def study_caveats(study: Mapping, calls: Mapping[str, Iterable[Mapping]] | None = None) -> list[str]:
    """study.json's caveats: replies recorded as structured that do not follow the grammar, a baseline that
    never searched, settings that
    retrieved nothing (from ``calls``, setting -> its recorded calls, where given; else from ART), and too
    few questions for the CIs."""
    settings = study.get("settings") or {}
    if not isinstance(settings, Mapping):
        return []
    settings = {s: m for s, m in settings.items() if isinstance(m, Mapping)}  # a malformed entry says nothing
    config = study.get("config")
    temp = config.get("temperature") if isinstance(config, Mapping) else None
    counts = study.get("structured_replies")
    baseline = study.get("baseline") or next(iter(settings), "")
    return [*grammar_not_applied(counts if isinstance(counts, Mapping) else None),
            *invalid_actions(study.get("invalid_actions")),
            *baseline_never_searched(settings, baseline),
            *empty_observations(study.get("observations"), baseline),
            *retrieved_nothing(settings, baseline, temperature=temp, calls=calls),
            *few_questions(m.get("questions") or 0 for m in settings.values())]


def injected_system(doc: Mapping) -> list[str]:
    """The caveat when captured calls had no system message and the chat template wrote one (attention.json:
    per setting ``injected_system``: calls, and the fewest / most tokens of template text owned by system)."""
    calls, tokens = 0, []
    for d in (doc.get("settings") or {}).values():
        inj = d.get("injected_system") or {}
        if inj.get("calls"):
            calls += inj["calls"]
            tokens += [inj["min_tokens"], inj["max_tokens"]]
    if not calls:
        return []
    return [f"system includes the chat template's injected text ({_span(tokens)} tokens): {calls} captured calls "
            "sent no system message, so their system share is the template's default system text and the first "
            "token (the attention sink)"]


def past_turn_filter(doc: Mapping) -> list[str]:
    """The caveat when the share tables' past-turn filter (``--shares-min-past``, seed 002 E.5) left calls
    out: p = first calls + calls with too few past turns, at the decision token (where no other filter
    but a missing query applies), over every setting."""
    mp = doc.get("min_past")
    parts, p = [], 0
    for s, d in (doc.get("settings") or {}).items():
        lo = (d.get("decision") or {}).get("left_out") or {}
        k = int(lo.get("first_call", 0)) + int(lo.get("too_few_past", 0))
        if k:
            p += k
            parts.append(f"{s} {k} of {d.get('captured_calls', '?')}")
    if not p:
        return []
    return [f"{p} steps excluded by the past-turn filter (fewer than {mp} past turns, --shares-min-past; seed 002 "
            f"E.5): {', '.join(parts)}"]


def skipped_records(doc: Mapping) -> list[str]:
    """The caveat when ``study attention`` skipped recorded calls or histories the trajectory schema refused
    (attention.json: per setting ``skipped``, one error line each): how many, and the first one's line."""
    lines = [(s, e) for s, d in (doc.get("settings") or {}).items() if isinstance(d, Mapping)
             for e in d.get("skipped") or []]
    if not lines:
        return []
    first = lines[0][1] if len(lines[0][1]) <= 200 else lines[0][1][:197] + "..."
    return [f"{len(lines)} recorded record{'' if len(lines) == 1 else 's'} skipped (not a valid trajectory), "
            f"first of setting {lines[0][0]}: {first}"]


def attention_caveats(doc: Mapping) -> list[str]:
    """attention.json's caveats: a capture model other than the agent's, replies that were not valid actions
    (study.json's count, copied), skipped records, too few questions for the CIs, injected system text, calls
    left out by the past-turn filter."""
    out = []
    cap = doc.get("capture") or {}
    if cap.get("agent_model") and cap.get("capture_model") and cap["agent_model"] != cap["capture_model"]:
        out.append(f"capture model {cap['capture_model']}, agent model {cap['agent_model']}: the attention shown is "
                   "another model's reading of the agent's contexts, not the agent's own")
    ns = [d.get(q, {}).get("questions") or 0 for d in (doc.get("settings") or {}).values()
          for q in ("decision", "reasoning")]
    return [*out, *invalid_actions(doc.get("invalid_actions")),
            *empty_observations(doc.get("observations"), doc.get("baseline") or ""), *skipped_records(doc),
            *few_questions(ns),
            *injected_system(doc), *past_turn_filter(doc)]


def runner_caveats(results: Iterable[Mapping], context_policy: str) -> list[str]:
    """The runner's (``attnprobe run``) caveat: under a context policy, no search worker ran a search (the
    workers' ``searches``), so the policy acted on nothing."""
    results = list(results)
    if context_policy in ("", "none") or not results:
        return []
    searches = sum(int(w.get("searches") or 0) for r in results for w in r.get("workers") or [])
    if searches:
        return []
    return [f"setting {context_policy} retrieved nothing: no policy acted (no search worker ran a search in "
            f"{len(results)} run{'' if len(results) == 1 else 's'}); the policy changed nothing the agents saw"]


def markdown(caveats: list[str]) -> list[str]:
    """The caveats as a markdown block (no lines when there is none)."""
    if not caveats:
        return []
    return ["**Caveats** (computed from the data; docs/loop.md, \"Caveats\"):", "", *(f"- {c}" for c in caveats), ""]
