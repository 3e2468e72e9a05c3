"""The NIS-Agent runner with ``structured_actions``: manager and worker calls (the forced last ones too) go
through ``complete_batch`` as a ChatRequest carrying their action grammar ("nis-manager" / "nis-worker" with
the tools that call offers), and every such recorded call names it in its meta; without the setting nothing
changes (plain ``complete``, no meta key). A scripted backend answers; no model."""

from __future__ import annotations

import json

import attnprobe
from attnprobe.agents.tools import FINAL_ANSWER, MANAGER_TOOLS, WORKER_TOOLS
from attnprobe.generation.chat import ActionFormat, ChatReply, OneByOne
from attnprobe.generation.toolparse import parse_tool_calls
from attnprobe.studies.runner import RunSettings, SearchResult, run_questions

PAGE = SearchResult("Holmium", "https://w.org/Holmium", "Holmium is named after Holmia, Latin for Stockholm.")
QUESTION = {"id": "h1", "question": "Which element is named after Holmia?", "answers": ["holmium"], "type": None}


class OneSearch:
    name = "fake"

    def search(self, query, k):
        return [PAGE]

    def fetch(self, url):
        return f"{PAGE.title}\n\n{PAGE.snippet}"


def call(name, **args):
    return json.dumps({"name": name, "arguments": args})


class Scripted(OneByOne):
    """Manager: delegate once, then answer; worker: search, then (given one step) is forced to answer.
    Keeps every request that came through ``complete_batch`` and every plain ``complete``."""

    kind, name, tokenizer = "fake", "scripted", None

    def __init__(self):
        self.requests, self.plain = [], 0
        self.turns = {"manager": [call("search_worker", task="Holmia element"), call("final_answer", answer="holmium")],
                      "worker": [call("web_search", query="holmia"), call("final_answer", answer="holmium")]}

    def _reply(self, messages, tools):
        who = "manager" if messages[0]["content"].startswith("You are the manager") else "worker"
        text = self.turns[who].pop(0) if len(self.turns[who]) > 1 else self.turns[who][0]
        _, calls = parse_tool_calls(text, [t["function"]["name"] for t in tools or []])
        return ChatReply(content="", tool_calls=[c.to_openai(f"c{i}") for i, c in enumerate(calls)], raw_text=text)

    def complete(self, messages, tools=None, *, max_new_tokens=256, temperature=0.0):
        self.plain += 1
        return self._reply(messages, tools)

    def complete_batch(self, requests):
        self.requests += list(requests)
        return [self._reply(r.messages, r.tools) for r in requests]


def run(tmp_path, structured: bool):
    s = RunSettings.preset("baseline", manager_steps=2, worker_steps=1)
    if structured:
        s.structured_actions = True
    chat = Scripted()
    run_questions(chat, [QUESTION], s, tmp_path / "r.jsonl", search=OneSearch())
    return chat, attnprobe.load_trajectories(tmp_path / "r.jsonl")


def test_structured_runner_calls_carry_their_action_grammar(tmp_path):
    chat, trajs = run(tmp_path, True)
    assert chat.plain == 0
    manager, worker, forced = (ActionFormat(s, json.dumps(t), max_new_tokens=RunSettings().max_new_tokens) for s, t in (
        ("nis-manager", MANAGER_TOOLS), ("nis-worker", WORKER_TOOLS), ("nis-worker", [FINAL_ANSWER])))
    # manager delegates; worker searches, runs out of its one step and is forced; manager answers
    assert [r.actions for r in chat.requests] == [manager, worker, forced, manager]
    assert all(r.max_new_tokens == RunSettings().max_new_tokens and r.temperature == 0.0 for r in chat.requests)
    assert [(t.id.split("/")[1], t.meta.get("structured_actions")) for t in trajs] == [
        ("manager-1", "nis-manager"), ("search_worker-1", "nis-worker"), ("search_worker-2", "nis-worker"),
        ("manager-2", "nis-manager")]
    # one builder (agents/recorder.py: call_record), the runner's key order kept: the file is byte-identical to before
    first = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert list(first) == ["id", "task", "model", "framing", "tools", "messages", "labels", "meta"]
    assert list(first["meta"]) == ["runner", "run_id", "agent", "call_index", "settings", "usage", "finish_reason",
                                   "raw_text", "parsed_tool_calls", "step", "structured_actions", "follows_grammar"]


def test_free_decoding_is_unchanged(tmp_path):
    chat, trajs = run(tmp_path, False)
    assert chat.requests == [] and chat.plain == 4
    assert all("structured_actions" not in t.meta for t in trajs)
