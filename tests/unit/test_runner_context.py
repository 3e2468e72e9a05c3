"""Context policies in the NIS-Agent runner (``attnprobe run --context-policy``): exactly what the search
worker is sent at every step, the full history beside the calls, the refiner once per round, resume.

A scripted chat model (tests/support/scripted_chat.py) answers from what it is sent and a fixed search
backend returns known pages, so every expected message list is written out by hand.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.agents.search import SearchResult
from attnprobe.generation.toolparse import call_ids
from attnprobe.studies.runner import RunSettings, run_questions
from attnprobe.studies.runner import validation as V
from attnprobe.studies.runner.worker import WORKER_SYSTEM


class FixedSearch:
    """'q1 ...' -> pages A, B; 'q2 ...' -> C, B; anything else -> nothing."""

    name = "fixed"
    DOCS = {"u/a": ("A", "Alpha one. Alpha two."), "u/b": ("B", "Beta one."),
            "u/c": ("C", "Gamma one. Answer is 42. Gamma three.")}
    HITS = {"q1": ["u/a", "u/b"], "q2": ["u/c", "u/b"]}

    def search(self, query: str, k: int) -> list[SearchResult]:
        urls = self.HITS.get(query.split()[0] if query.split() else "", [])[:k]
        return [SearchResult(self.DOCS[u][0], u, self.DOCS[u][1][:9]) for u in urls]

    def fetch(self, url: str) -> str | None:
        d = self.DOCS.get(url)
        return f"{d[0]}\n\n{d[1]}" if d else None


Q = [{"id": "t1", "question": "What is the answer?", "answer": "42", "aliases": []}]
SUB = "find the answer"
# the worker's replies, by how many of its own turns it has been shown (masking keeps every turn)
WORKER_PLAN = [[("web_search", {"query": "q1 first"})],
               [("visit_page", {"url": "u/a"}), ("find_in_page", {"url": "u/c", "pattern": "Answer"})],
               [("web_search", {"query": "q2 second"})],
               [("final_answer", {"answer": "42"})]]


def _calls(messages, plan):
    ids = call_ids(messages, len(plan))
    return [tool_call(i, name, **args) for i, (name, args) in zip(ids, plan)]


def script(messages, tools):
    system = messages[0]["content"]
    if system.startswith("You are the manager"):
        done = any(m["role"] == "tool" for m in messages)
        plan = [("final_answer", {"answer": "42"})] if done else [("search_worker", {"task": SUB})]
        return "", _calls(messages, plan)
    if system == WORKER_SYSTEM:
        if "<system-reminder>" in str(messages[-1]["content"]):  # the in-context filter
            return "1"
        n = sum(m["role"] == "assistant" for m in messages)
        return f"thought {n}", _calls(messages, WORKER_PLAN[min(n, 3)])
    if system == V.STAGE1_SYSTEM:
        return "S1: The answer is 42. (from: O1)"
    return "VALID"


def run(tmp_path, name="r", **settings):
    out = tmp_path / f"{name}.jsonl"
    chat = ScriptedChat(script)
    res = run_questions(chat, Q, RunSettings.preset("baseline", worker_steps=4, **settings), out,
                        search=FixedSearch())
    return chat, res, out


def _digest(out):
    calls = out.read_bytes()
    results = [{k: v for k, v in json.loads(x).items() if k != "seconds"}
               for x in out.with_suffix(".results.ndjson").read_text().splitlines()]
    return (hashlib.sha256(calls).hexdigest()[:16],
            hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16])


# Recorded by the runner before context policies existed (commit 9fa85a3): the default (no policy) must
# keep writing these bytes.
PINNED = {"baseline": ("c62278a4e70405b5", "4a23c83c3e1c054a"),
          "in-context": ("13d886db45d2dc9e", "f6cc68f0963d2103")}


@pytest.mark.parametrize("case", list(PINNED))
def test_no_policy_records_what_the_runner_recorded_before(tmp_path, case):
    settings = {} if case == "baseline" else {"filter": "in-context", "validation": "full"}
    chat, res, out = run(tmp_path, **settings)
    assert res["results"][0]["answer"] == "42"
    assert _digest(out) == PINNED[case]
    assert not out.with_suffix(".history.jsonl").exists()
