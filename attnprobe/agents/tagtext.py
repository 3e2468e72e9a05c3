"""Tag text and rounds: the one pair of conversions between what a tag-format agent sees and what the context
policies act on, shared by the IRCoT loop (:mod:`attnprobe.studies.loop.agents`) and the counterfactuals.

- *Rounds form* (what :mod:`attnprobe.agents.policies` acts on): an assistant turn that ran a query has
  ``content`` (its text without the ``<search>`` span), one ``search`` tool call and ``tag_text`` (its text as
  written); the documents are a ``tool`` message (``content``: the text inside ``<information>``;
  ``tag_wrap``: any text around the block in the message the agent saw).
- *Tag text* (what the agent sees): assistant turns as their text, documents as user messages
  ``<information>...</information>``, every span labelled by ``annotations``
  (:mod:`attnprobe.trajectory.tags`: queries ``tool_call``/self, documents ``observation``/external, tags
  included; the rest of an assistant turn stays reasoning).

:func:`as_tags` maps rounds to tag text and :func:`tag_rounds` back, message for message (index ``i`` of one
is index ``i`` of the other), so a policy's ``source``/``changes`` hold for the tag text unchanged
(:func:`apply_policy`). ``as_tags(tag_rounds(m)) == m`` for tag text written by :func:`as_tags` or imported
by ``attnprobe import --format tags``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace

from attnprobe.agents.policies import Counterfactual, Policy
from attnprobe.trajectory.schema import Trajectory, message_text
from attnprobe.trajectory.tags import INFO_CLOSE, INFO_OPEN, SEARCH_CLOSE, SEARCH_OPEN, TagSpan, first_query, scan


def _search_annotations(text: str) -> list[dict]:
    """The ``<search>`` spans of an agent's own text as annotations. Only queries: text the agent wrote
    itself is never an observation, whatever tags it holds."""
    spans, _ = scan(text, searches=True, information=False)
    return [s.annotation() for s in spans]


def _with(msg: dict, anns: list[dict]) -> dict:
    if anns:
        msg["annotations"] = anns
    return msg


def annotate_reply(msg: dict) -> dict:
    """An assistant reply of a tag-format agent with its ``<search>`` spans labelled (a copy)."""
    out = {k: v for k, v in msg.items() if k != "annotations"}
    return _with(out, _search_annotations(message_text(msg.get("content"))))


def unlabelled(messages: Sequence[dict]) -> list[dict]:
    """Copies of ``messages`` without ``annotations``: what a chat model is sent (labels are attnprobe's)."""
    return [{k: copy.deepcopy(v) for k, v in m.items() if k != "annotations"} for m in messages]


def as_tags(messages: Sequence[dict]) -> tuple[list[dict], list[int]]:
    """The IRCoT scaffold's history (rounds form) as the model is sent it, labelled: assistant turns as their
    tag text (without the ``<search>`` span when a policy removed the query; a turn with nothing left is not
    sent), observations as ``<information>`` user messages. Returns the messages and, for each, the index of
    the message of ``messages`` it renders. Annotations never reach the model (chat backends send the text
    only); they label the recorded call."""
    out, kept = [], []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            text = m.get("tag_text") if m.get("tool_calls") else message_text(m.get("content"))
            if not text:
                continue
            anns = m.get("annotations") if not m.get("tool_calls") and m.get("annotations") else \
                _search_annotations(text)
            out.append(_with({"role": "assistant", "content": text}, copy.deepcopy(anns)))
        elif m["role"] == "tool":
            before, after = m.get("tag_wrap") or ("", "")
            block = f"{INFO_OPEN}{message_text(m.get('content'))}{INFO_CLOSE}"
            ann = {"start": len(before), "end": len(before) + len(block), "role": "observation",
                   "author": "external"}
            out.append({"role": "user", "content": before + block + after, "annotations": [ann]})
        else:
            out.append(_with({"role": m["role"], "content": m.get("content")},
                             copy.deepcopy(m.get("annotations") or [])))
        kept.append(i)
    return out, kept


def _spans(msg: dict, kind: str) -> list[TagSpan]:
    """The annotated spans of ``kind`` in a tag-text message (read from its annotations and its text)."""
    text = message_text(msg.get("content"))
    o, c = (SEARCH_OPEN, SEARCH_CLOSE) if kind == "search" else (INFO_OPEN, INFO_CLOSE)
    role = "tool_call" if kind == "search" else "observation"
    return [TagSpan(kind, a["start"], a["end"]) for a in msg.get("annotations") or []
            if a.get("role") == role and text.startswith(o, a["start"]) and text.endswith(c, 0, a["end"])]


def is_tag_text(messages: Sequence[dict]) -> bool:
    """Whether ``messages`` are tag text: no tool calls or tool messages, and some span labelled as a query
    (assistant) or as documents (user)."""
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return False
    return any(_spans(m, "search") if m["role"] == "assistant" else _spans(m, "information")
               for m in messages if m["role"] in ("assistant", "user"))


def tag_rounds(messages: Sequence[dict]) -> list[dict]:
    """Tag text back to rounds form, one message for one. An assistant turn whose first query is not empty
    (the one the agent ran) becomes a turn with a ``search`` call, unless it also holds documents (a whole
    Search-R1 rollout in one message stays a message). A user message right after such a turn whose only
    labelled span is one ``<information>`` block becomes its ``tool`` message. Everything else is left as it
    is (invalid turns, their feedback, the task)."""
    out: list[dict] = []
    calls = 0
    for m in messages:
        text = message_text(m.get("content"))
        if m["role"] == "assistant" and not _spans(m, "information"):
            spans = _spans(m, "search")
            q = first_query(text, spans)
            if q is not None:
                calls += 1
                thought, pos = [], 0
                for s in spans:
                    thought.append(text[pos:s.start])
                    pos = s.end
                thought.append(text[pos:])
                call = {"id": f"call{calls}", "type": "function",
                        "function": {"name": "search",
                                     "arguments": json.dumps({"query": q.inner(text).strip()}, ensure_ascii=False)}}
                out.append({"role": "assistant", "content": "".join(thought).strip(), "tool_calls": [call],
                            "tag_text": text})
                continue
        if m["role"] == "user" and out and out[-1].get("tool_calls"):
            docs = _spans(m, "information")
            if len(docs) == 1 and len(m.get("annotations") or []) == 1:
                d = docs[0]
                out.append({"role": "tool", "tool_call_id": out[-1]["tool_calls"][0]["id"], "name": "search",
                            "content": d.inner(text), "tag_wrap": [text[:d.start], text[d.end:]]})
                continue
        out.append(copy.deepcopy(dict(m)))
    return out


def apply_policy(policy: Policy, messages: Sequence[dict]) -> Counterfactual:
    """``policy(messages)``, on what the agent saw. Tag text (:func:`is_tag_text`) goes to rounds form
    (:func:`tag_rounds`), through the policy and back (:func:`as_tags`, labelled); ``source`` and
    ``changes`` index the tag-text messages (the conversion is one message for one), and a turn the policy
    left empty, which :func:`as_tags` does not send, is ``removed``. Anything else: the policy as it is."""
    if not is_tag_text(messages):
        return policy(messages)
    cf = policy(tag_rounds(messages))
    sent, kept = as_tags(cf.messages)
    changes = dict(cf.changes)
    keep = set(kept)
    for k, src in enumerate(cf.source):
        if k not in keep:
            changes[src] = "removed"
    return Counterfactual(sent, [cf.source[k] for k in kept], changes, cf.policy, cf.details)


def agent_view(trajectory: Trajectory) -> Trajectory:
    """The trajectory as its agent saw it: an IRCoT loop's full history (rounds form; assistant turns carry
    ``tag_text``) as labelled tag text (:func:`as_tags`); anything else unchanged. Counterfactuals run on
    this, so an IRCoT step is captured and edited in the text the agent was sent, not in a tool-role
    re-encoding of it."""
    if not any(m["role"] == "assistant" and m.get("tag_text") for m in trajectory.messages):
        return trajectory
    sent, _ = as_tags(trajectory.messages)
    return replace(trajectory, messages=sent, meta={**trajectory.meta, "view": "tag text"})
