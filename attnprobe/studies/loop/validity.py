"""Which recorded replies were valid actions: the count behind the caveat "N of M replies were not valid
actions" (issue 37; :func:`attnprobe.results.caveats.invalid_actions`).

Decided from each recorded call alone (its reply and its ``meta``), with the parser the agent used for
that call, so a study's files say it whatever the agent did with the reply:

- IRCoT in Search-R1's stream (``meta.stream``): the reply (``meta.raw_text``) parsed by
  :func:`attnprobe.agents.searchr1.parse_action` (Search-R1's ``<(search|answer)>(.*?)</\\1>``): valid
  when it is a search or an answer, at the final rollout (``meta.final_call``) only an answer (a search
  there is not run);
- IRCoT in the multi-turn form: the reply's text parsed by
  :func:`attnprobe.generation.toolparse.parse_tags` (the prompt's and the invalid-action text's tags are
  no action): valid with a query or an answer, at the final call only an answer;
- seed 002: a reply with tool calls is valid when every call names one of the scaffold's tools and its
  arguments were a JSON object (no ``raw_arguments``); a reply without calls is the final answer, valid
  unless empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from attnprobe.agents import searchr1
from attnprobe.generation.chat import RAW_ARGUMENTS
from attnprobe.generation.toolparse import parse_tags
from attnprobe.studies.loop.pool import TOOLS
from attnprobe.studies.loop.prompts import IRCOT_INVALID, IRCOT_PROMPT

_TOOL_NAMES = {t["function"]["name"] for t in TOOLS}
EMPTY = "(empty reply)"


def _reply(call: Mapping) -> Mapping:
    msgs = call.get("messages") or []
    last = msgs[-1] if msgs else {}
    return last if isinstance(last, Mapping) else {}


def valid_action(call: Mapping) -> bool:
    """Whether one recorded call's reply was a valid action of its scaffold (the module's rules)."""
    meta = call.get("meta") if isinstance(call.get("meta"), Mapping) else {}
    final = bool(meta.get("final_call"))
    reply = _reply(call)
    raw = meta.get("raw_text") if isinstance(meta.get("raw_text"), str) else ""
    if str(meta.get("runner", "")).endswith("ircot"):
        if isinstance(meta.get("stream"), Mapping):
            action, _ = searchr1.parse_action(raw or _text(reply))
            return action == "answer" or (action == "search" and not final)
        act = parse_tags(_text(reply) or raw, (IRCOT_PROMPT, IRCOT_INVALID))
        return act.answer is not None or (bool(act.queries) and not final)
    calls = reply.get("tool_calls") or []
    if calls:
        return all(isinstance(c, Mapping) and RAW_ARGUMENTS not in c
                   and (c.get("function") or {}).get("name") in _TOOL_NAMES for c in calls)
    text = _text(reply).strip()
    return bool(text) and text != EMPTY


def _text(msg: Mapping) -> str:
    text = msg.get("content")
    if isinstance(text, str):
        return "" if text == EMPTY else text
    return "".join(p.get("text", "") for p in text or [] if isinstance(p, Mapping))


def invalid_actions(calls: Mapping[str, Iterable[Mapping]]) -> dict:
    """Over every setting's recorded calls (setting -> calls), ``{"replies": M, "invalid": N, "settings":
    {setting: [N_s, M_s]}}``: study.json's ``invalid_actions``, the caveat's numbers."""
    per = {}
    for s, cs in calls.items():
        ok = [valid_action(c) for c in cs if isinstance(c, Mapping)]
        per[s] = [ok.count(False), len(ok)]
    return {"replies": sum(m for _, m in per.values()), "invalid": sum(n for n, _ in per.values()), "settings": per}
