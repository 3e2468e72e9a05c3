"""Structured actions are verified (issue 38, item 3): every reply recorded as structured is checked against the
grammar it was sent (``meta.follows_grammar``), a study counts the replies that do not parse and says "the server
did not apply the grammar (N of M replies)" in study.json and study.md, and ``attnprobe serve``, which decodes
freely, refuses a request that asks for a grammar instead of answering it with free text."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
from support.interference import run_interference as run_study
from support.scripted_server import scripted_endpoint

from attnprobe.errors import AttnprobeError
from attnprobe.execution.local import LocalExecutor
from attnprobe.generation.chat import ActionFormat, ChatRequest
from attnprobe.generation.openai_chat import OpenAIChat
from attnprobe.generation.server import Limits, make_server, parse_chat_request
from attnprobe.generation.server.protocol import RequestError
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.pool import TOOLS

IRCOT = ActionFormat("ircot", max_new_tokens=128)
SEED002 = ActionFormat("seed002", tools=json.dumps(TOOLS), max_new_tokens=128)


@pytest.mark.parametrize("fmt, text, ok", [
    (IRCOT, "<think>which city</think><search>capital of France</search>", True),
    (IRCOT, "<think></think>\n<answer> Paris</answer>", True),
    (IRCOT, "Paris is the capital of France.", False),
    (IRCOT, "<think>x</think><search>capital of France", False),  # not closed
    (ActionFormat("ircot", final=True), "<think>x</think><search>q</search>", False),  # the final call: answers only
    (SEED002, '{"name": "search", "arguments": {"query": "capital of France"}}', True),
    (SEED002, 'Searching.\n[{"name": "search", "arguments": {"query": "a"}}, {"name": "open", "arguments": '
              '{"id": "1"}}]', True),
    (SEED002, "Explanation: known.\nExact Answer: Paris\nConfidence: 90%", True),
    (SEED002, '{"name": "browse", "arguments": {"query": "a"}}', False),  # not one of its tools
    (SEED002, "The answer is Paris.", False),
])
def test_a_reply_is_checked_against_its_grammar(fmt, text, ok):
    from attnprobe.generation.grammars import follows_grammar

    assert follows_grammar(fmt, text) is ok


def test_a_study_says_when_the_server_did_not_apply_the_grammar(tmp_path):
    def reply(body):  # a server that ignores the grammar it is sent on the first call, follows it on the second
        return "I think it is Paris." if len(body["messages"]) == 1 else "<think>ok</think><answer>Paris</answer>"

    q = {"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "type": None}
    with scripted_endpoint(reply=reply) as ep:
        run_study(LocalExecutor(lambda: OpenAIChat(ep.url, "m", max_retries=0), progress=False), tmp_path, [q],
                  ["none"], LoopConfig("ircot", ircot_form="chat", max_turns=3, structured_actions=True), n_boot=10)
        assert "grammar" in ep.bodies[0]["structured_outputs"]  # the grammar was sent
    calls = [json.loads(line) for line in (tmp_path / "none" / "calls.jsonl").read_text().splitlines()]
    assert [c["meta"]["follows_grammar"] for c in calls] == [False, True]
    # one meaning (issue 39): the grammar's scaffold name, as the runner records it
    assert [c["meta"]["structured_actions"] for c in calls] == ["ircot", "ircot"]
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["structured_replies"] == {"replies": 2, "off_grammar": 1}
    # calls recorded before (structured_actions: true) still load and count the same
    import attnprobe
    from attnprobe.results.caveats import structured_replies

    old = tmp_path / "old-calls.jsonl"
    old.write_text("".join(json.dumps({**c, "meta": {**c["meta"], "structured_actions": True}}) + "\n" for c in calls))
    assert [t.meta["structured_actions"] for t in attnprobe.load_trajectories(old)] == [True, True]
    assert structured_replies(json.loads(x) for x in old.read_text().splitlines()) == study["structured_replies"]
    assert study["caveats"][0].startswith("the server did not apply the grammar (1 of 2 replies): ")
    assert "- the server did not apply the grammar (1 of 2 replies)" in (tmp_path / "study.md").read_text()


def test_a_study_whose_replies_follow_the_grammar_says_nothing(tmp_path):
    q = {"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "type": None}
    with scripted_endpoint(reply=lambda body: "<think>ok</think><answer>Paris</answer>") as ep:
        run_study(LocalExecutor(lambda: OpenAIChat(ep.url, "m", max_retries=0), progress=False), tmp_path, [q],
                  ["none"], LoopConfig("ircot", ircot_form="chat", max_turns=3, structured_actions=True), n_boot=10)
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["structured_replies"] == {"replies": 1, "off_grammar": 0}
    assert not any("grammar" in c for c in study["caveats"])


@pytest.mark.parametrize("field, value", [("structured_outputs", {"grammar": "root ::= \"x\""}),
                                          ("guided_grammar", "root ::= \"x\""), ("ebnf", "root ::= \"x\""),
                                          ("guided_json", {}), ("response_format", {"type": "json_object"})])
def test_serve_refuses_a_request_for_constrained_decoding(field, value):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], field: value}).encode()
    with pytest.raises(RequestError) as exc:
        parse_chat_request(body, max_new_tokens_cap=100)
    assert exc.value.status == 400 and exc.value.param == field
    assert exc.value.message.startswith(f"{field} is not supported by attnprobe serve: it decodes freely")
    ok = json.dumps({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}}).encode()
    assert parse_chat_request(ok, max_new_tokens_cap=100)["max_new_tokens"] == 100


def test_a_structured_request_to_serve_fails_in_one_line():
    loaded = SimpleNamespace(name="fake", tokenizer=None, model=None)  # refused before any model work
    srv = make_server(loaded, "127.0.0.1", 0, Limits())
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        chat = OpenAIChat(f"http://127.0.0.1:{srv.server_address[1]}/v1", "fake", max_retries=0)
        with pytest.raises(AttnprobeError) as exc:
            chat.complete_batch([ChatRequest([{"role": "user", "content": "hi"}], max_new_tokens=8, actions=IRCOT)])
    finally:
        srv.shutdown()
        srv.server_close()
    msg = str(exc.value)
    assert "HTTP 400: " in msg and "structured_outputs is not supported by attnprobe serve" in msg and "\n" not in msg
