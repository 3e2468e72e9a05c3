"""The numbers of one captured call of an interference study: per query, the attention share of every
category (:data:`attnprobe.studies.loop.attention_report.CATEGORIES`), the tokens each holds and the per-token
share relative to uniform.

One breakdown per call everywhere (issue 37): attention.md's tables (:mod:`.attention`, which averages these
records) and the app's Study page bar of a call (``attnprobe_app.views.study``) both read
:func:`call_shares`, so the page cannot show another split of the same call and query. Apart from
:mod:`.attention` so that the app imports no capture stage to draw it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnprobe.render.segments import ROLES
from attnprobe.results.analysis import R, category_masks, token_owners
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.attention_report import CATEGORIES

LOOP_ROLES = (*ROLES, "placeholder", "refined")  # a call's tokens shown as a placeholder or refined: their own roles


def _query_masks(result: CaptureResult) -> tuple[int, str | None, dict[str, tuple[int, dict[str, np.ndarray]]]]:
    """(reply message index, the reply's kind, {query name: (row index, category -> token mask)}).

    The reply's kind is that of its first own segment: ``reasoning`` when it opens with text, ``action``
    when it is only tool calls (seed 002 E.2-E.3 query reasoning starts only), None without own tokens."""
    turn, role = token_owners(result)
    msg, _ = token_owners(replace(result, segments=[replace(s, turn=s.message_index) for s in result.segments]))
    reply = max(s.message_index for s in result.segments)
    own = [s for s in result.segments if s.message_index == reply and s.author == "self"
           and s.role in ("reasoning", "tool_call")]
    if own:  # a Search-R1 sequence holds every reply in one message: the call's reply is its last turn's
        own = [s for s in own if s.turn == max(o.turn for o in own)]
    kind = None if not own else "reasoning" if min(own, key=lambda s: s.start).role == "reasoning" else "action"
    hist = (result.meta.get("trajectory_meta") or {}).get("history") or {}
    source, changes = hist.get("source") or [], hist.get("changes") or {}
    status = np.full(len(msg), "", dtype=object)
    if len(source) == reply:  # one source per message sent (the reply is the last message)
        per_msg = np.asarray([changes.get(str(src), "") for src in source] + [""], dtype=object)
        status = np.where((msg >= 0) & (msg < len(source)), per_msg[np.clip(msg, 0, len(source))], "")
    role = np.select([status == "placeholder", status == "refined"], [LOOP_ROLES.index("placeholder"),
                                                                     LOOP_ROLES.index("refined")], role)
    out: dict[str, tuple[int, dict[str, np.ndarray]]] = {}
    for k, q in enumerate(result.queries):
        name = "decision" if q.kind == "decision" else \
            "reasoning" if q.kind == "reasoning" and q.message_index == reply else None
        if name is None or (name == "decision" and name in out):
            continue  # the reasoning start: the reply's last (one per turn in a Search-R1 sequence)
        out[name] = (k, category_masks(turn, role, q.turn, LOOP_ROLES, own=("placeholder", "refined")))
    return reply, kind, out


def call_shares(result: CaptureResult) -> dict[str, dict[str, float]]:
    """Per query of the reply (:data:`QUERIES`, those captured), the attention share of every
    :data:`CATEGORIES`; they sum to the row's mass (1 up to float32 storage). ``reasoning`` only for a
    reply of kind reasoning (a tool-call-only reply has no reasoning start, seed 002 E.2-E.3).

    Every token is owned by one message under the seed-002 convention (:func:`token_owners`); tokens of a
    message the call saw as a placeholder or as refined text (``meta.history.changes`` of its full-history
    source) count as ``placeholder`` / ``refined``; the others as in
    :func:`attnprobe.results.analysis.step_breakdown`: system, task, past reasoning / tool calls /
    observations (turns before the query's), and the current step (the query's own turn)."""
    return {q: r["shares"] for q, r in call_record(result)["queries"].items()}


def call_step(result: CaptureResult) -> int:
    """The call's step: its number of past turns in the agent's run (``meta.step`` - 1: every earlier call
    is one past turn, whatever the policy left of it in the context), else the reply's turn in the
    context sent."""
    meta = result.meta.get("trajectory_meta") or {}
    step = meta.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 1:
        return step - 1
    reply = max(s.message_index for s in result.segments)
    return max([s.turn for s in result.segments if s.message_index == reply] or [0])


def call_record(result: CaptureResult) -> dict:
    """One captured call: question, step (:func:`call_step`), the reply's kind and per query its shares,
    the tokens of each category the query sees (positions up to its own) and the per-token share
    relative to uniform: share_c / (tokens_c / tokens visible), 1 = the category gets its length's worth
    (NaN for a category with no token)."""
    meta = result.meta.get("trajectory_meta") or {}
    _, kind, masks = _query_masks(result)
    rows = np.asarray(result.token_attention, dtype=np.float64)
    queries = {}
    for name, (k, cats) in masks.items():
        pos = result.queries[k].position
        seen = np.arange(len(rows[k])) <= pos
        shares = {c: float(rows[k][m].sum()) for c, m in cats.items()}
        tokens = {c: int((m & seen).sum()) for c, m in cats.items()}
        queries[name] = {"shares": shares, "tokens": tokens, "visible": int(pos + 1),
                         "relative": {c: relative_share(shares[c], tokens[c], pos + 1) for c in CATEGORIES}}
    return {"question": str(meta.get("question_id") or result.trajectory_id), "step": call_step(result),
            "kind": kind, "queries": queries, "injected_system": injected_system_tokens(result)}


def injected_system_tokens(result: CaptureResult) -> int:
    """Tokens of template text counted as system in a call sent without a system message: the default
    system text the chat template injects (SmolLM2, Qwen) and the first token; 0 when a system message was
    sent or the template wrote nothing but the first token (:func:`token_owners`)."""
    if any(s.role == "system" for s in result.segments):
        return 0
    _, role = token_owners(result)
    k = int((role == R["system"]).sum())
    return k if k > 1 else 0


def relative_share(share: float, tokens: int, visible: int) -> float:
    """A category's share over its uniform share (tokens / tokens visible to the query): 1 = attention in
    proportion to length, 3 = three times its length's worth; NaN for a category with no token."""
    return float(share / (tokens / visible)) if tokens > 0 and visible > 0 else float("nan")


