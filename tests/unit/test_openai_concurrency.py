"""OpenAIChat.complete_batch with --concurrency N against a scripted endpoint with a fixed latency
(issue 30, item 2): N requests in flight, replies in request order and equal to sequential ones, call
ids from each request's own messages, the sequential error line on failure, guided-decoding options
in the body of a structured request, and --concurrency through the CLI's generation options."""

from __future__ import annotations

import argparse
import time

import pytest
from support.scripted_server import default_reply, scripted_endpoint

from attnprobe.errors import AttnprobeError
from attnprobe.generation.chat import ActionFormat, ChatRequest
from attnprobe.generation.openai_chat import OpenAIChat

LATENCY = 0.5  # long enough that thread start-up on a loaded 2-core machine (~0.3 s measured) stays small next to it


def _requests(texts, **kw):
    return [ChatRequest([{"role": "user", "content": t}], **kw) for t in texts]


def test_eight_requests_with_concurrency_eight_are_in_flight_at_once():
    with scripted_endpoint(latency=LATENCY) as ep:
        chat = OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=8)
        chat.complete_batch(_requests(["warm"]))  # the client's first request sets up its connection pool
        ep.bodies.clear()
        ep.max_in_flight = 0
        replies = chat.complete_batch(_requests([f"q{i}" for i in range(8)]))
    # counted by the server, not timed (issue 38): one at a time would be 1 in flight; all 8 at once, 8
    assert ep.max_in_flight == 8 and len(ep.bodies) == 8
    assert [r.content for r in replies] == [f"echo 1: q{i}" for i in range(8)]


def test_concurrency_is_bounded():
    with scripted_endpoint(latency=0.1) as ep:
        OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=3).complete_batch(
            _requests([f"q{i}" for i in range(9)]))
    assert 1 < ep.max_in_flight <= 3 and len(ep.bodies) == 9


def _slow_first(body):
    """Earlier requests answer later, so replies arrive in reverse order of the requests."""
    text = default_reply(body)
    time.sleep(0.02 * (8 - int(text.rsplit("q", 1)[1].split()[0])))
    return text


def test_replies_are_in_request_order_and_equal_sequential_ones_with_call_ids():
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    prior = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "call2", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}
    tool_msgs = [{"role": "tool", "tool_call_id": "call1", "content": "r1"},
                 {"role": "tool", "tool_call_id": "call2", "content": "r2"}]

    def reply(body):  # a call of the offered tool in the text, after a per-request delay
        text = _slow_first(body)
        return f'{text} {{"name": "search", "arguments": {{"query": "{text.rsplit("q", 1)[1]}"}}}}'

    # even requests start a conversation, odd ones continue one that already holds two calls
    reqs = [ChatRequest(([{"role": "user", "content": f"q{i}"}] if i % 2 == 0 else
                         [{"role": "user", "content": "start"}, prior, *tool_msgs, {"role": "user", "content": f"q{i}"}]),
                        tools=tools, max_new_tokens=9) for i in range(8)]
    with scripted_endpoint(reply=reply) as ep:
        concurrent = OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=8).complete_batch(reqs)
        arrival = [b["messages"][-1]["content"] for b in ep.bodies]
        one = OpenAIChat(ep.url, "m", max_retries=0, timeout=10)
        sequential = [one.complete(r.messages, r.tools, max_new_tokens=9) for r in reqs]
    assert concurrent == sequential
    assert [r.tool_calls[0]["id"] for r in concurrent] == ["call1", "call3"] * 4
    assert [r.tool_calls[0]["function"]["arguments"] for r in concurrent] == [f'{{"query": "{i}"}}' for i in range(8)]
    assert [r.content.split(" {")[0] for r in concurrent] == [f"echo {1 if i % 2 == 0 else 5}: q{i}" for i in range(8)]
    assert sorted(arrival) == [f"q{i}" for i in range(8)]


def test_a_failing_request_gives_the_sequential_error_line():
    texts = ["ok0", "ok1", "FAIL three", "ok3", "ok4", "FAIL six", "ok6", "ok7"]
    with scripted_endpoint(latency=0.05) as ep:
        chat = OpenAIChat(ep.url, "m", max_retries=0, timeout=10)
        with pytest.raises(AttnprobeError) as seq:
            for r in _requests(texts):
                chat.complete(r.messages)
        chat8 = OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=8)
        with pytest.raises(AttnprobeError) as conc:
            chat8.complete_batch(_requests(texts))
        with pytest.raises(AttnprobeError) as one:  # concurrency 1 through the batch call: the same line
            OpenAIChat(ep.url, "m", max_retries=0, timeout=10).complete_batch(_requests(texts))
    assert str(conc.value) == str(seq.value) == str(one.value)
    assert str(seq.value).startswith(f"{ep.url}/chat/completions: HTTP 500: ")
    assert "FAIL three" in str(seq.value) and "FAIL six" not in str(seq.value) and "\n" not in str(seq.value)


def test_a_structured_request_sends_the_guided_decoding_options(monkeypatch):
    # only the seam is tested here: the options the grammar module returns reach the server in the request
    # body (tests/unit/test_structured.py pins the options themselves)
    import attnprobe.generation.structured as structured

    seen = []

    def openai_extra_body(fmt):
        seen.append(fmt)
        return {"structured_outputs": {"grammar": f"root ::= \"{fmt.scaffold}\""}}

    monkeypatch.setattr(structured, "openai_extra_body", openai_extra_body)
    fmt = ActionFormat("ircot", final=True)
    with scripted_endpoint() as ep:
        chat = OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=2)
        chat.complete_batch([ChatRequest([{"role": "user", "content": "a"}], actions=fmt),
                             ChatRequest([{"role": "user", "content": "b"}])])
    bodies = {b["messages"][-1]["content"]: b for b in ep.bodies}
    assert bodies["a"]["structured_outputs"] == {"grammar": 'root ::= "ircot"'} and seen == [fmt]
    assert "structured_outputs" not in bodies["b"] and "extra_body" not in bodies["a"]


def test_token_counts_are_summed_over_threads():
    with scripted_endpoint() as ep:
        chat = OpenAIChat(ep.url, "m", max_retries=0, timeout=10, concurrency=4)
        chat.complete_batch(_requests(["one two", "three", "four five six", "seven"]))
    # the scripted usage: prompt = words sent, completion = words of "echo 1: <text>"
    assert chat.stats == {"calls": 4, "sent": 7, "cached": 0, "generated": 4 * 2 + 7}


def test_concurrency_option_reaches_the_backend():
    from attnprobe.cli.options import add_generation_options, finish_args, make_generator
    from attnprobe.generation.factory import open_backend

    p = argparse.ArgumentParser()
    add_generation_options(p, max_new_tokens=64)
    args = finish_args(p.parse_args(["--base-url", "http://127.0.0.1:9/v1", "--served-model", "m",
                                     "--concurrency", "8"]))
    chat = make_generator(args)
    assert (chat.kind, chat.concurrency) == ("openai", 8)
    assert finish_args(p.parse_args(["--base-url", "http://x/v1"])).concurrency == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--concurrency", "0"])
    assert open_backend("openai", base_url="http://127.0.0.1:9/v1", concurrency=3).concurrency == 3
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        OpenAIChat("http://127.0.0.1:9/v1", "m", concurrency=0)
