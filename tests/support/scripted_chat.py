"""A scripted chat model (the ChatBackend protocol) for the loop tests: deterministic replies, no model.

``ScriptedChat(script)``: ``script(messages, tools) -> str | (str, [tool calls])`` decides each reply from
what the model is sent, so a resumed run gets the same replies as an uninterrupted one. Every request is
kept in ``sent`` (deep copies) for the tests to compare with what the loop should have sent. Token counts
are whitespace words (input: over every message's content and call arguments; output: over the reply), so
context lengths have known values.
"""

from __future__ import annotations

import copy
import json

from attnprobe.generation.chat import ChatReply, OneByOne


def words(messages: list[dict]) -> int:
    n = 0
    for m in messages:
        n += len(str(m.get("content") or "").split())
        for c in m.get("tool_calls") or []:
            n += len(str(c["function"].get("arguments", "")).split())
    return n


def tool_call(cid: str, name: str, **args) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


class ScriptedChat(OneByOne):
    kind = "scripted"
    name = "scripted-chat"

    def __init__(self, script, *, fail_on_call: int | None = None):
        self.script = script
        self.sent: list[list[dict]] = []
        self.tools: list[list[dict] | None] = []
        self.fail_on_call = fail_on_call  # raise RuntimeError on this (1-based) call: an interrupted run

    def complete(self, messages, tools=None, *, max_tokens: int = 256, temperature: float = 0.0) -> ChatReply:
        if self.fail_on_call is not None and len(self.sent) + 1 == self.fail_on_call:
            self.fail_on_call = None
            raise RuntimeError("scripted interruption")
        self.sent.append(copy.deepcopy(messages))
        self.tools.append(copy.deepcopy(tools))
        out = self.script(messages, tools)
        text, calls = (out, []) if isinstance(out, str) else out
        return ChatReply(content=text, tool_calls=calls, raw_text=text, input_tokens=words(messages),
                         output_tokens=len(text.split()) + sum(len(c["function"]["arguments"].split()) for c in calls),
                         finish_reason="tool_calls" if calls else "stop")
