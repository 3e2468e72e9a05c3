"""A scripted chat model (the ChatBackend protocol) for the loop tests: deterministic replies, no model.

``ScriptedChat(script)``: ``script(messages, tools) -> str | (str, [tool calls])`` decides each reply from
what the model is sent, so a resumed run gets the same replies as an uninterrupted one. Every request is
kept in ``sent`` (deep copies) for the tests to compare with what the loop should have sent. Token counts
are whitespace words (input: over every message's content and call arguments; output: over the reply), so
context lengths have known values. ``requests``, ``batches`` and ``ended`` record what the batch driver
asked for (requests with their episode keys, batch sizes, finished episodes).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence

from attnprobe.generation.chat import ChatReply, ChatRequest, OneByOne


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
    accepts_token_prompts = True  # a Search-R1 stream's request: the script reads the messages that label it

    def __init__(self, script, *, fail_on_call: int | None = None, actions: bool = False, tokenizer=None):
        self.script = script
        self.tokenizer = tokenizer  # the Search-R1 stream tokenizes with it (None: the stream form refuses)
        self.sent: list[list[dict]] = []
        self.tools: list[list[dict] | None] = []
        self.fail_on_call = fail_on_call  # raise RuntimeError on this (1-based) call: an interrupted run
        self.requests: list[ChatRequest] = []  # every request of every batch, as received
        self.batches: list[int] = []  # the size of each complete_batch call
        self.ended: list[str] = []  # end_episode's arguments, in order
        self.actions = actions  # accept requests with an action grammar (and ignore it: the script decides)

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        self.requests.extend(copy.deepcopy(list(requests)))
        self.batches.append(len(requests))
        if self.actions:
            requests = [dataclasses.replace(r, actions=None) for r in requests]
        return super().complete_batch(requests)

    def end_episode(self, episode: str) -> None:
        self.ended.append(episode)

    def complete(self, messages, tools=None, *, max_new_tokens: int = 256, temperature: float = 0.0) -> ChatReply:
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


class ParsingChat(ScriptedChat):
    """A scripted chat whose script writes raw model text, parsed into calls as the in-process backends parse
    it (``TransformersChat.make_reply``: :func:`parse_tool_calls` over the offered tools, ``call<n>`` ids,
    the content the text before the first call); ``tokenizer`` is the one whose chat template the loop reads
    (seed002's parallel-call sentence)."""

    def __init__(self, script, tokenizer, **kwargs):
        super().__init__(script, **kwargs)
        self.tokenizer = tokenizer

    def complete(self, messages, tools=None, *, max_new_tokens: int = 256, temperature: float = 0.0) -> ChatReply:
        from attnprobe.generation.chat import tool_names
        from attnprobe.generation.toolparse import call_ids, parse_tool_calls

        reply = super().complete(messages, tools, max_new_tokens=max_new_tokens, temperature=temperature)
        content, calls = parse_tool_calls(reply.raw_text, tool_names(tools))
        reply.tool_calls = [c.to_openai(i) for c, i in zip(calls, call_ids(messages, len(calls)))]
        reply.content = content if calls else reply.raw_text.strip()
        reply.finish_reason = "tool_calls" if calls else "stop"
        return reply
