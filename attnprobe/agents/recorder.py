"""Record every model call as a trajectory (DESIGN section 3), appended atomically, with replay for --resume.

A recorded call holds exactly the messages that were sent plus the assistant reply appended. Its id
is ``<run-id>/<agent>-<n>``; ``meta`` links it to the run (run_id, agent, call_index, settings, usage).

Resume: the calls of an unfinished run are replayed in order. While the agent sends exactly the
messages of the next recorded call, the recorded reply is returned without calling the model and
nothing is written; at the first difference the stale remainder is dropped (atomic rewrite) and
the run continues live. Finished calls are therefore neither lost nor duplicated.
"""

from __future__ import annotations

import copy
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from attnprobe.generation.chat import ActionFormat, ChatReply, ChatRequest
from attnprobe.generation.grammars import follows_grammar
from attnprobe.io import append_jsonl, rewrite_jsonl

# Seed 000, C.3: "For non-reasoning models, we limit the output token size to 4096" (per model call).
RUNNER_MAX_NEW_TOKENS = 4096


def drop_records(path: Path, ids: set[str]) -> None:
    """Drop the records with these ids; safe while Ray replicas append to the same file (:func:`rewrite_jsonl`)."""
    if ids:
        rewrite_jsonl(path, lambda r: not (isinstance(r, dict) and r.get("id") in ids))


def call_note(label: str, output_tokens: int, seconds: float) -> str:
    """A finished model call as the progress bar shows it: "call 3 (manager): 48 tok in 2.1 s, 22.9 tok/s"."""
    rate = f"{output_tokens / seconds:.1f} tok/s" if seconds > 0 else "- tok/s"
    return f"{label}: {output_tokens} tok in {seconds:.1f} s, {rate}"



def call_record(call_id: str, task: str, model: str | None, messages: list[dict], reply: ChatReply, meta: dict, *,
                tools: list[dict] | None = None, actions: ActionFormat | None = None, after_usage: dict | None = None,
                extra: dict | None = None) -> dict:
    """One recorded model call, the form every agent here writes (the runner's ``Recorder`` and the loop
    study's scaffolds): a trajectory of framing ``trace`` whose ``messages`` are what was sent plus the reply,
    ``meta`` the caller's fields (who called, in which run) followed by the call's ``usage``, ``finish_reason``
    and ``raw_text``. With ``actions`` (structured decoding), ``meta.structured_actions`` is the grammar's
    scaffold name (``ircot``, ``seed002``, ``nis-manager``, ...; calls recorded by the loop study before issue 39
    hold ``true``, read as they are: nothing decides on the value) and ``meta.follows_grammar`` whether the raw
    reply parses as an action of it.

    ``after_usage`` (meta fields right after ``usage``: the loop's ``context_chars``) and ``extra`` (after
    ``raw_text``: the runner's ``parsed_tool_calls``, ...) keep each writer's key order, so files written before
    and after this builder are the same byte for byte (the loop adds its ``tools`` last itself, for the same reason)."""
    record: dict[str, Any] = {"id": call_id, "task": task, "model": model, "framing": "trace"}
    if tools is not None:
        record["tools"] = tools
    record.update({"messages": messages, "labels": {}, "meta": {
        **meta, "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
        **(after_usage or {}), "finish_reason": reply.finish_reason, "raw_text": reply.raw_text, **(extra or {})}})
    if actions is not None:
        record["meta"]["structured_actions"] = actions.scaffold
        record["meta"]["follows_grammar"] = follows_grammar(actions, reply.raw_text or reply.content or "")
    return record


class Recorder:
    """Makes model calls for one run and writes each as a trajectory line."""

    def __init__(self, chat, path: Path, *, run_id: str, task: str, settings: dict, model_name: str | None = None,
                 replay: list[dict] | None = None, max_new_tokens: int = RUNNER_MAX_NEW_TOKENS, temperature: float = 0.0,
                 note=None):
        self.chat = chat
        self.note = note  # progress callback: told which call is in flight
        self.path = Path(path)
        self.run_id = run_id
        self.task = task
        self.settings = settings
        self.model_name = model_name or getattr(chat, "name", None)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.replay = sorted(replay or [], key=lambda r: r["meta"]["call_index"])
        self.replayed = 0
        self.call_index = 0
        self.per_agent: Counter = Counter()
        self.last_call_id: str | None = None  # the id of the latest call (recorded or replayed)
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "input_tokens": 0,
                                                                      "output_tokens": 0})

    def _stop_replay(self) -> None:
        if self.replay:
            drop_records(self.path, {r["id"] for r in self.replay})
            self.replay = []

    def finish(self) -> None:
        self._stop_replay()

    def call(self, agent: str, messages: list[dict], tools: list[dict] | None, *, max_new_tokens: int | None = None,
             extra_meta: dict | None = None, actions: ActionFormat | None = None) -> ChatReply:
        """One model call, recorded (or replayed on resume). ``actions``: constrain the reply to that action
        grammar (``structured_actions``; sent as a :class:`ChatRequest` through ``complete_batch``, and the
        call's meta names it)."""
        self.call_index += 1
        self.per_agent[agent] += 1
        label = f"call {self.call_index} ({agent})"
        if self.note is not None:
            self.note(label)
        call_id = self.last_call_id = f"{self.run_id}/{agent}-{self.per_agent[agent]}"
        reply = None
        if self.replay:
            rec = self.replay[0]
            if rec["id"] == call_id and rec["messages"][:-1] == messages and (rec.get("tools") or None) == (
                    tools or None):
                self.replay.pop(0)
                self.replayed += 1
                last = rec["messages"][-1]
                u = rec["meta"].get("usage", {})
                reply = ChatReply(content=last.get("content") or "", tool_calls=last.get("tool_calls") or [],
                                  raw_text=rec["meta"].get("raw_text", last.get("content") or ""),
                                  input_tokens=int(u.get("input_tokens", 0)),
                                  output_tokens=int(u.get("output_tokens", 0)),
                                  finish_reason=rec["meta"].get("finish_reason", "stop"))
            else:
                self._stop_replay()
        if reply is None:
            t0 = time.perf_counter()
            if actions is None:
                reply = self.chat.complete(copy.deepcopy(messages), copy.deepcopy(tools) if tools else None,
                                           max_new_tokens=max_new_tokens or self.max_new_tokens, temperature=self.temperature)
            else:
                reply = self.chat.complete_batch([ChatRequest(
                    copy.deepcopy(messages), copy.deepcopy(tools) if tools else None,
                    max_new_tokens=max_new_tokens or self.max_new_tokens, temperature=self.temperature, actions=actions)])[0]
            if self.note is not None:  # per call, with its speed: a long wait is visibly generating
                self.note(call_note(label, reply.output_tokens, time.perf_counter() - t0))
            self._write(call_id, agent, messages, tools, reply, extra_meta or {}, actions)
        u = self.usage[agent]
        u["calls"] += 1
        u["input_tokens"] += reply.input_tokens
        u["output_tokens"] += reply.output_tokens
        return reply

    def _write(self, call_id, agent, messages, tools, reply: ChatReply, extra_meta: dict,
               actions: ActionFormat | None) -> None:
        msg: dict[str, Any] = reply.as_message()
        empty = not (msg.get("content") or "").strip() and not msg.get("tool_calls")
        if empty:  # the format needs some content; the raw reply stays in meta.raw_text
            msg["content"] = "(empty reply)"
        meta = {"runner": "nis-agent", "run_id": self.run_id, "agent": agent, "call_index": self.call_index,
                "settings": self.settings}
        extra = {"parsed_tool_calls": len(reply.tool_calls), **({"empty_reply": True} if empty else {}), **extra_meta}
        append_jsonl(self.path, call_record(call_id, self.task, self.model_name, copy.deepcopy(messages) + [msg], reply,
                                            meta, tools=tools, actions=actions, extra=extra))

    def count_tokens(self, text: str) -> int | None:
        """Tokens of ``text`` under the model's tokenizer (None for backends without one, e.g. a server)."""
        tok = getattr(self.chat, "tokenizer", None)
        if tok is None:
            return None
        return len(tok.encode(text, add_special_tokens=False))

    def totals(self) -> dict[str, Any]:
        per_agent = {a: dict(v) for a, v in self.usage.items()}
        return {"input_tokens": sum(v["input_tokens"] for v in per_agent.values()),
                "output_tokens": sum(v["output_tokens"] for v in per_agent.values()),
                "calls": sum(v["calls"] for v in per_agent.values()), "per_agent": per_agent}
