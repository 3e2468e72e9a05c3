"""The generation backends without a model: the OpenAI-compatible client against a loopback stub
endpoint (errors name the URL; request, key and tool calls as sent), and the backend registry."""

from __future__ import annotations

import json

import pytest

import attnprobe


def _closed_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stub_endpoint():
    """A loopback HTTP server whose reply to POST /v1/chat/completions the test sets: (status, content type, body).
    It records the headers and JSON body of every request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = {"reply": (200, "application/json", b"{}"), "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state["requests"].append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "json": json.loads(body)})
            code, ctype, out = state["reply"]
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield state
    srv.shutdown()
    srv.server_close()


def _completion(message: dict, finish="stop", usage=(11, 3)) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                       "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                 "total_tokens": sum(usage)}}).encode()


def test_openai_client_connection_refused_names_the_url():
    from attnprobe.generation.openai_chat import OpenAIChat

    url = f"http://127.0.0.1:{_closed_loopback_port()}/v1"
    chat = OpenAIChat(url, "m", max_retries=0, timeout=10)
    with pytest.raises(attnprobe.AttnprobeError) as info:
        chat.complete([{"role": "user", "content": "hi"}])
    msg = str(info.value)
    assert f"{url}/chat/completions" in msg and "cannot connect" in msg and "\n" not in msg


def test_openai_client_http_and_malformed_errors(stub_endpoint):
    from attnprobe.generation.openai_chat import OpenAIChat

    chat = OpenAIChat(stub_endpoint["url"], "m", max_retries=0, timeout=10)
    where = stub_endpoint["url"] + "/chat/completions"
    stub_endpoint["reply"] = (500, "application/json", b'{"error": {"message": "model\\nexploded"}}')
    with pytest.raises(attnprobe.AttnprobeError, match="HTTP 500") as info:
        chat.complete([{"role": "user", "content": "hi"}])
    assert where in str(info.value) and "\n" not in str(info.value)
    for ctype, body in (("text/html", b"<html>not an API</html>"), ("application/json", b'{"choices": 5}'),
                        ("application/json", b'{"id": "no choices"}')):
        stub_endpoint["reply"] = (200, ctype, body)
        with pytest.raises(attnprobe.AttnprobeError, match="malformed chat completion|not a chat completion") as info:
            chat.complete([{"role": "user", "content": "hi"}])
        assert where in str(info.value)


def test_openai_client_request_key_and_tool_calls(stub_endpoint, monkeypatch):
    from attnprobe.generation.factory import open_backend

    monkeypatch.setenv("ATTNPROBE_TEST_KEY", "sekret")
    chat = open_backend("openai", base_url=stub_endpoint["url"] + "/", served_model="served-m",
                        api_key_env="ATTNPROBE_TEST_KEY", timeout=10)
    assert chat.kind == "openai" and chat.name == "served-m"
    tools = [{"type": "function", "function": {"name": "web_search", "parameters": {"type": "object"}}}]
    # no structured calls: the text is parsed (ids call1, call2, ... per reply)
    stub_endpoint["reply"] = (200, "application/json",
                              _completion({"role": "assistant", "content": 'ok {"name": "web_search", "arguments": '
                                                                           '{"query": "q"}}'}))
    reply = chat.complete([{"role": "user", "content": "hi"}], tools, max_new_tokens=7, temperature=0.0)
    assert reply.tool_calls == [{"id": "call1", "type": "function",
                                 "function": {"name": "web_search", "arguments": '{"query": "q"}'}}]
    assert (reply.content, reply.input_tokens, reply.output_tokens, reply.finish_reason) == ("ok", 11, 3, "stop")
    req = stub_endpoint["requests"][-1]
    assert req["path"] == "/v1/chat/completions" and req["headers"]["authorization"] == "Bearer sekret"
    assert {k: req["json"][k] for k in ("model", "max_tokens", "temperature", "tools")} == {
        "model": "served-m", "max_tokens": 7, "temperature": 0.0, "tools": tools}
    # structured calls from the server are kept as they are
    structured = [{"id": "srv-1", "type": "function", "function": {"name": "visit_page", "arguments": '{"url": "u"}'}}]
    stub_endpoint["reply"] = (200, "application/json",
                              _completion({"role": "assistant", "content": None, "tool_calls": structured},
                                          finish="tool_calls"))
    reply = chat.complete([{"role": "user", "content": "hi"}], tools)
    assert reply.tool_calls == structured and reply.content == "" and reply.finish_reason == "tool_calls"
    chat.complete([{"role": "user", "content": "x"}])
    assert "tools" not in stub_endpoint["requests"][-1]["json"]  # none offered: none sent


def test_open_backend_registry_errors():
    from attnprobe.generation.factory import BACKENDS, open_backend

    assert set(BACKENDS) == {"transformers", "openai", "vllm"}
    with pytest.raises(attnprobe.AttnprobeError, match="unknown generation backend"):
        open_backend("bogus")
    with pytest.raises(attnprobe.AttnprobeError, match="base URL"):
        open_backend("openai")
