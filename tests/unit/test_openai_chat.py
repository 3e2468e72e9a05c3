"""OpenAIChat against a misbehaving endpoint (a tiny stdlib HTTP server): every failure is one
AttnprobeError line naming the endpoint (issue 13, items 5 and 6)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.generation.openai_chat import OpenAIChat

REPLIES = {  # mode -> (content type, body)
    "html": ("text/html", b"<html><body><h1>Sign in</h1>\n<p>Proxy login</p></body></html>"),
    "text": ("text/plain", b"upstream busy, try later"),
    "not-a-completion": ("application/json", b'{"detail": "ok"}'),
    "array": ("application/json", b"[1, 2]"),
    "good": ("application/json", b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": '
                                 b'[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", '
                                 b'"content": "hello"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1, '
                                 b'"total_tokens": 4}}'),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode
        if mode == "drop":  # close the connection without a status line (RemoteDisconnected)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        ctype, body = REPLIES[mode]
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("mode,message", [
    ("drop", "the server closed the connection without a reply (Server disconnected without sending a response.)"),
    ("html", "the reply is not a chat completion (an HTML page: <html><body><h1>Sign in</h1> <p>Proxy login</p>"
             "</body></html>)"),
    ("text", "the reply is not a chat completion (not JSON: upstream busy, try later)"),
    ("not-a-completion", "malformed chat completion response: "),
    ("array", "malformed chat completion response: [1, 2]"),
])
def test_bad_endpoints_are_one_line_errors_naming_the_endpoint(server, mode, message):
    server.mode = mode
    url = f"http://127.0.0.1:{server.server_port}/v1"
    chat = OpenAIChat(url, "m", max_retries=0, timeout=10)
    with pytest.raises(AttnprobeError) as info:
        chat.complete([{"role": "user", "content": "hi"}])
    text = str(info.value)
    assert text.startswith(f"{url}/chat/completions: ") and message in text and "\n" not in text


def test_a_good_reply_still_works(server):
    server.mode = "good"
    reply = OpenAIChat(f"http://127.0.0.1:{server.server_port}/v1", "m", max_retries=0, timeout=10).complete(
        [{"role": "user", "content": "hi"}])
    assert (reply.content, reply.input_tokens, reply.output_tokens, reply.tool_calls) == ("hello", 3, 1, [])


# ------------------------------------------------------------------ usage counts validated (issue 38, item 6)
@pytest.mark.parametrize("usage, line", [
    ({"prompt_tokens": -100, "completion_tokens": 3}, "usage.prompt_tokens is -100, impossible: outside 0..{p}"),
    ({"prompt_tokens": 5, "completion_tokens": 1e15}, "usage.completion_tokens is 1000000000000000.0, impossible: outside 0..32 "
                                                      "(max_new_tokens 16 + 16)"),
    ({"prompt_tokens": 10 ** 6, "completion_tokens": 3}, "usage.prompt_tokens is 1000000, impossible: outside 0..{p}"),
    ({"prompt_tokens": "12", "completion_tokens": 3}, "usage.prompt_tokens is '12', not a whole number of tokens"),
    ({"prompt_tokens": 5, "completion_tokens": 2.5}, "usage.completion_tokens is 2.5, not a whole number of tokens"),
    ({"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 6}},
     "usage.prompt_tokens_details.cached_tokens is 6, impossible: outside 0..5 (prompt_tokens)"),
])
def test_impossible_usage_counts_are_one_line_naming_the_endpoint_and_field(usage, line):
    import json

    from support.scripted_server import scripted_endpoint

    with scripted_endpoint(usage=lambda body, text: usage) as ep:
        with pytest.raises(AttnprobeError) as exc:
            OpenAIChat(ep.url, "m", max_retries=0).complete([{"role": "user", "content": "hi"}], max_new_tokens=16)
        sent = len(json.dumps(ep.bodies[0], ensure_ascii=False).encode())  # the body the client sent
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) <= 400
    assert msg.startswith(f"{ep.url}/chat/completions: ")
    if "{p}" in line:
        assert line.split("{p}")[0] in msg and "(the request's " in msg and " bytes + 1024)" in msg
        bound = int(msg.split("outside 0..")[1].split(" ")[0].replace(",", ""))
        assert abs(bound - (sent + 1024)) < 64  # the body's bytes, as sent (key order aside) + the slack
    else:
        assert msg.endswith(line)


def test_plausible_usage_counts_are_kept():
    from support.scripted_server import scripted_endpoint

    with scripted_endpoint(usage=lambda body, text: {"prompt_tokens": 9, "completion_tokens": 16,
                                                     "prompt_tokens_details": {"cached_tokens": 4}}) as ep:
        chat = OpenAIChat(ep.url, "m", max_retries=0)
        reply = chat.complete([{"role": "user", "content": "hi"}], max_new_tokens=16)
    assert (reply.input_tokens, reply.output_tokens, chat.stats["cached"]) == (9, 16, 4)
