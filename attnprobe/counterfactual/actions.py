"""The next action at a counterfactual step, read against the trajectory's own tools, and a continuous measure.

The IBIS classes (web_search / visit_page / answer) miss the tools a trajectory really has (``find_in_page``
in the shipped one; seed 002's search / open / find; seed 004's tags), and a weak model rarely writes a
parseable call at all. So:

- :func:`classify_action` names the action by the trajectory's own vocabulary (:func:`tool_vocabulary`:
  the tools it declares and the calls in its history) or by seed 004's tag format ("LLMs are instructed
  to encapsulate their search queries, retrieved documents, and final answer between specially
  designated tokens", §2, after Jin et al. 2025: ``<search>...</search>``, ``<answer>...</answer>``).
  Only a call or a tag counts: prose that mentions a tool is not an action.
- :func:`change_rate` reports how often the action changed over the steps parseable on **both** sides,
  with that count beside it (a step unparseable on either side says nothing about a change).
- :func:`recorded_logprob` is the teacher-forced log-probability of the step's **recorded** message
  under a context: defined for every step, even when the model never writes a parseable call. The
  counterfactual minus the original says whether the policy made the action the agent really took
  more or less likely.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from attnprobe.generation.toolparse import parse_tool_calls
from attnprobe.results.analysis import END_MARKER

TAGS = ("search", "answer")
UNPARSEABLE = "unparseable"


def tool_vocabulary(tools: Iterable[Mapping] | None = None, messages: Iterable[Mapping] = ()) -> list[str]:
    """Tool names a trajectory knows: its declared ``tools`` (OpenAI ``{"function": {"name"}}`` or
    ``{"name"}``) and every call in its ``messages``; sorted."""
    names = set()
    for t in tools or []:
        if isinstance(t, Mapping):
            fn = t.get("function") if isinstance(t.get("function"), Mapping) else t
            if isinstance(fn.get("name"), str):
                names.add(fn["name"])
    for m in messages:
        for c in (m.get("tool_calls") or []) if isinstance(m, Mapping) else []:
            name = (c.get("function") or {}).get("name") if isinstance(c, Mapping) else None
            if isinstance(name, str):
                names.add(name)
    return sorted(names)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {"raw": raw}
    return raw if raw is not None else {}


def classify_action(text: str, tool_calls: Sequence[Mapping] | None, vocabulary: Sequence[str]) -> dict:
    """``{"action", "kind", "arguments"}`` of one reply. ``kind``: ``call`` (a structured call, or a call
    written in the text in any syntax :func:`attnprobe.generation.toolparse.parse_tool_calls` reads, to a
    tool of ``vocabulary``), ``tag`` (the first ``<search>`` / ``<answer>`` tag; action ``<search>``),
    ``unknown_tool`` (a structured call to a tool not in the vocabulary; still an action, named
    ``?name``) or ``unparseable``. The first structured call wins, then calls in the text, then tags."""
    known = set(vocabulary)
    for c in tool_calls or []:
        fn = (c.get("function") or c) if isinstance(c, Mapping) else {}
        name = fn.get("name")
        if isinstance(name, str) and name:
            args = _args(fn.get("arguments"))
            if name in known:
                return {"action": name, "kind": "call", "arguments": args}
            return {"action": f"?{name}", "kind": "unknown_tool", "arguments": args}
    if known and text:
        _, calls = parse_tool_calls(text, sorted(known))
        if calls:
            return {"action": calls[0].name, "kind": "call", "arguments": calls[0].arguments}
    tag = _first_tag(text or "")
    if tag:
        return {"action": f"<{tag[0]}>", "kind": "tag", "arguments": {tag[0]: tag[1].strip()}}
    return {"action": UNPARSEABLE, "kind": UNPARSEABLE, "arguments": {}}


def _first_tag(text: str) -> tuple[str, str] | None:
    """The first closed ``<search>``/``<answer>`` span, (tag, text inside), as the regex
    ``<(search|answer)>(.*?)</\\1>`` (DOTALL) finds it, in linear time: a tag's first open closes iff its
    closing tag occurs after it, and when it does not, no later open of that tag closes either."""
    best = None
    for tag in TAGS:
        o, c = f"<{tag}>", f"</{tag}>"
        start = text.find(o)
        if start >= 0 and text.rfind(c) >= start + len(o) and (best is None or start < best[1]):
            best = (tag, start)
    if best is None:
        return None
    tag, start = best
    inner = start + len(tag) + 2
    return tag, text[inner:text.find(f"</{tag}>", inner)]


def classify_stored(action: Mapping, vocabulary: Sequence[str]) -> dict:
    """:func:`classify_action` on a stored next action (``counterfactual.run.next_action``'s dict:
    ``text`` and the first structured ``call`` as ``{"name", "arguments"}``)."""
    call = action.get("call")
    calls = [{"function": {"name": call.get("name"), "arguments": call.get("arguments")}}] if call else None
    return classify_action(str(action.get("text") or ""), calls, vocabulary)


def compare_actions(original: Mapping, counterfactual: Mapping, vocabulary: Sequence[str]) -> dict:
    """The block a step record stores as ``record["action"]["own"]``: both classifications, whether
    both are parseable, and (only then) whether the action (``changed``) or the action with its
    arguments (``call_changed``) differs; None when not parseable on both sides."""
    o, c = classify_stored(original, vocabulary), classify_stored(counterfactual, vocabulary)
    both = o["kind"] != UNPARSEABLE and c["kind"] != UNPARSEABLE
    return {"vocabulary": list(vocabulary), "original": o, "counterfactual": c, "parseable_both": both,
            "changed": (o["action"] != c["action"]) if both else None,
            "call_changed": (o["action"], o["arguments"]) != (c["action"], c["arguments"]) if both else None}


def change_rate(blocks: Iterable[Mapping]) -> dict:
    """Over :func:`compare_actions` blocks: ``{"steps", "parseable_both", "changed", "rate", "ci"}``;
    the rate and its Wilson interval are over the steps parseable on both sides only (NaN when none).

    Every step is also counted in one of five cells (issue 26 item 9; they sum to ``steps``):
    ``both_changed`` and ``both_same`` (parseable on both sides), ``one_sided_original`` (parseable in the
    original only: the policy broke the action), ``one_sided_counterfactual`` (in the counterfactual only)
    and ``neither``. ``one_sided`` is the sum of the two one-sided cells; ``rate_any_side`` = (both_changed
    + one_sided) / (steps parseable on at least one side), with its Wilson interval: a one-sided step counts
    as a change there."""
    from attnprobe.stats import wilson_ci

    blocks = list(blocks)
    both = [b for b in blocks if b.get("parseable_both")]
    k = sum(bool(b.get("changed")) for b in both)
    n = len(both)

    def parseable(b: Mapping, side: str) -> bool:
        return (b.get(side) or {}).get("kind", UNPARSEABLE) != UNPARSEABLE

    rest = [b for b in blocks if not b.get("parseable_both")]
    only_o = sum(parseable(b, "original") and not parseable(b, "counterfactual") for b in rest)
    only_c = sum(parseable(b, "counterfactual") and not parseable(b, "original") for b in rest)
    any_side = n + only_o + only_c
    return {"steps": len(blocks), "parseable_both": n, "changed": k,
            "rate": k / n if n else float("nan"), "ci": wilson_ci(k, n),
            "both_changed": k, "both_same": n - k, "one_sided_original": only_o,
            "one_sided_counterfactual": only_c, "one_sided": only_o + only_c,
            "neither": len(rest) - only_o - only_c, "parseable_any_side": any_side,
            "rate_any_side": (k + only_o + only_c) / any_side if any_side else float("nan"),
            "ci_any_side": wilson_ci(k + only_o + only_c, any_side)}


# ------------------------------------------------------------------ teacher-forced log-probability
def step_span(model, messages_prefix: Sequence[dict], step_message: dict, tools=None, *, rendering: str = "auto",
              max_tokens: int | None = None):
    """(rendered prefix + step, first token of the step's continuation, end). The continuation starts
    right after the prefix rendered with the generation prompt when that is a token prefix of the full
    rendering (else at the step's first own token, as the counterfactual's decision query does) and
    runs to the step message's closing end-of-turn marker (excluded; the call's closing syntax
    included)."""
    from attnprobe.capture.api import prepare
    from attnprobe.errors import AttnprobeError
    from attnprobe.trajectory.schema import Trajectory

    k = len(messages_prefix)
    full = Trajectory(id="recorded-logprob", messages=[*messages_prefix, step_message], tools=tools)
    r = prepare(model, full, rendering=rendering, max_tokens=max_tokens)
    pre = prepare(model, replace(full, messages=list(messages_prefix)), rendering=r.rendering, max_tokens=max_tokens)
    own = [s for s in r.segments if s.message_index == k and s.role != "template"]
    if not own:
        raise AttnprobeError(f"message {k}: the step message has no tokens of its own to score")
    n = len(pre.input_ids)
    exact = n <= own[0].start and np.array_equal(r.input_ids[:n], pre.input_ids)
    start = n if exact else own[0].start
    end = max(s.end for s in own)
    # The call's closing syntax (e.g. "</tool_call>") is template text after the last own part: the
    # continuation runs up to the end-of-turn marker.
    while end < len(r.input_ids) and not END_MARKER.match(r.text[int(r.offsets[end][0]):int(r.offsets[end][1])]):
        end += 1
    return r, int(start), int(end), bool(exact)


def recorded_logprob(model, messages_prefix: Sequence[dict], step_message: dict, tools=None, *,
                     rendering: str = "auto", max_tokens: int | None = None) -> dict:
    """Teacher-forced log p of the recorded step message given the prefix (the decision's context):
    ``{"sum", "mean", "tokens", "exact"}`` over the continuation tokens of :func:`step_span`, from one
    forward pass of the transformers model (float64 log-softmax of its logits). ``exact``: the
    continuation starts right after the generation prompt. Refused for a model that is not a torch
    module (vLLM)."""
    import torch

    from attnprobe.errors import AttnprobeError

    if not isinstance(model.model, torch.nn.Module):
        raise AttnprobeError("the recorded-action log-probability runs in process: use the transformers backend")
    r, start, end, exact = step_span(model, messages_prefix, step_message, tools, rendering=rendering,
                                     max_tokens=max_tokens)
    if start < 1 or end <= start:
        raise AttnprobeError("the step message has no continuation tokens after the prefix")
    dev = next(model.model.parameters()).device
    ids = torch.as_tensor(np.asarray(r.input_ids[:end], dtype=np.int64), device=dev)[None]
    with torch.inference_mode():
        logits = model.model(ids).logits[0, start - 1:end - 1].double()
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, start:end, None])[:, 0].cpu().numpy()
    return {"sum": float(logp.sum()), "mean": float(logp.mean()), "tokens": int(end - start), "exact": exact}


def logprob_block(original: Mapping, counterfactual: Mapping) -> dict:
    """The block a step record stores as ``record["logprob"]``: both :func:`recorded_logprob` results
    and their differences (counterfactual - original) of the sum and the per-token mean."""
    return {"original": dict(original), "counterfactual": dict(counterfactual),
            "diff_sum": counterfactual["sum"] - original["sum"], "diff_mean": counterfactual["mean"] - original["mean"]}
