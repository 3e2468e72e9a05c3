"""``attnprobe serve`` under a flood (issue 27): every connection gets an HTTP answer, 200 or 503 with
Retry-After, none is reset. A scripted chat stands in for the model (make_server's chat class is swapped),
so the test measures the HTTP layer only."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from attnprobe.generation.chat import ChatReply
from attnprobe.generation.server import http
from attnprobe.generation.server.protocol import Limits

N, WAYS, QUEUE = 120, 30, 4


class _ScriptedChat:
    """Replies "ok" after 20 ms; the prompt is one token per message."""

    def __init__(self, loaded, stop_at_call=False):
        self.should_stop = None

    def prompt(self, messages, tools=None):
        return SimpleNamespace(ids=list(range(len(messages))))

    def complete(self, messages, tools=None, *, max_new_tokens=16, temperature=0.0):
        time.sleep(0.02)
        return ChatReply(content="ok", tool_calls=[], raw_text="ok", input_tokens=1, output_tokens=1,
                         finish_reason="stop")


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(http, "_CancellableChat", _ScriptedChat)
    loaded = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512)), name="m")
    srv = http.make_server(loaded, limits=Limits(max_queue=QUEUE))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _post(port: int) -> tuple[int, str, dict]:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, payload = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers.get("retry-after", ""), json.loads(payload)


def test_a_flood_is_answered_200_or_503_never_reset(server):
    with ThreadPoolExecutor(WAYS) as pool:
        answers = list(pool.map(lambda _: _post(server), range(N)))  # a reset raises here
    statuses = [a[0] for a in answers]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= QUEUE and statuses.count(503) > 0
    for status, retry, payload in answers:
        if status == 200:
            assert payload["choices"][0]["message"]["content"] == "ok"
        else:
            assert retry == "1" and payload["error"]["code"] == "busy" and "--max-queue" in payload["error"]["message"]


def test_under_the_queue_limit_every_request_is_served(server):
    with ThreadPoolExecutor(QUEUE) as pool:
        assert [a[0] for a in pool.map(lambda _: _post(server), range(8))] == [200] * 8
