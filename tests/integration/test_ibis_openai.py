"""The OpenAI-compatible path against a real server process serving the bundled model on loopback."""

from __future__ import annotations

import json

import pytest
from support.paths import ROOT  # noqa: E402
from support.server import served

import attnprobe
from attnprobe.cli.main import main
from attnprobe.generation.openai_chat import OpenAIChat
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.studies.ibis.behaviour import BehaviourBackend, read_decisions
from attnprobe.studies.ibis.framings import build_framing
from attnprobe.studies.ibis.items import load_items


@pytest.fixture(scope="module")
def server():
    """`attnprobe serve --port 0` as a real subprocess (the same server `python -m
    attnprobe.generation.server` starts; test_runner_model uses that spelling)."""
    with served("default", cli=True) as info:
        assert info["url"].startswith("http://127.0.0.1:")
        yield info


# slow: a second model load in the server process, as in test_server_hostile_clients.py; .ci/run runs it once
@pytest.mark.slow
def test_openai_backend_against_real_server(server, smol, tmp_path, capsys):
    folder = tmp_path / "served"
    rc = main(["ibis", "run", "--generator", "openai", "--base-url", server["url"], "--served-model", server["model"],
               "--ids", "sci-04", "--framings", "observer", "--max-new-tokens", "6", "--folder", str(folder),
               "--no-progress"])
    assert rc == 0
    (rec,) = read_decisions(folder / "decisions.jsonl")
    assert rec["backend"] == "openai" and rec["model"] == server["model"] and rec["input_tokens"] > 100
    assert rec["decision"] in ("web_search", "visit_page", "answer", "unparseable")
    # same greedy tokens as the in-process model on the identical rendered prompt
    it = [i for i in load_items(ROOT / "trajectories" / "ibis_items.jsonl") if i.id == "sci-04"][0]
    local = BehaviourBackend(TransformersChat(smol), early_stop=False, forced_choice=False).complete(
        build_framing(it, "observer"), max_new_tokens=6)
    assert rec["raw_text"].strip() == local["raw_text"].strip()
    assert rec["input_tokens"] == local["input_tokens"]


def test_openai_unreachable_endpoint_is_logged_not_dropped(tmp_path):
    folder = tmp_path / "down"
    rc = main(["ibis", "run", "--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", "--served-model", "x",
               "--ids", "sci-01", "--framings", "agentic", "--folder", str(folder), "--no-progress"])
    assert rc == 1  # some items failed; they are in errors.jsonl and retried next time
    err = [json.loads(x) for x in (folder / "errors.jsonl").read_text().splitlines()]
    assert err[0]["item_id"] == "sci-01" and "cannot connect" in err[0]["error"]
    assert not (folder / "decisions.jsonl").exists()


@pytest.mark.slow
def test_openai_client_reply_equals_in_process_chat(server, smol):
    """One prompt with tools: the client against the real server returns the reply the in-process
    chat returns (the server generates without stop-at-call, so compare with that)."""
    tools = [{"type": "function", "function": {
        "name": "web_search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
    messages = [{"role": "system", "content": "You are a search agent. Answer with one tool call as JSON: "
                                              '{"name": "web_search", "arguments": {"query": "..."}}'},
                {"role": "user", "content": "Who discovered holmium?"}]
    remote = OpenAIChat(server["url"], server["model"], timeout=300).complete(messages, tools, max_new_tokens=24)
    local = TransformersChat(smol, stop_at_call=False).complete(messages, tools, max_new_tokens=24)
    assert remote.raw_text == local.raw_text and remote.content == local.content
    assert (remote.input_tokens, remote.output_tokens, remote.finish_reason) == (
        local.input_tokens, local.output_tokens, local.finish_reason)
    strip = [{k: v for k, v in c.items() if k != "id"} for c in remote.tool_calls]  # ids are numbered per process
    assert strip == [{k: v for k, v in c.items() if k != "id"} for c in local.tool_calls]


def test_openai_client_unreachable_server_raises_attnprobe_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(attnprobe.AttnprobeError, match="cannot connect") as info:
        OpenAIChat(url, "x", max_retries=0, timeout=10).complete([{"role": "user", "content": "hi"}])
    assert url in str(info.value)
