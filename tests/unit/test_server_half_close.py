"""Issue 38, item 12: ``attnprobe serve`` answers a client that half-closes its socket after a full request (it
still reads: an interim ``100 Continue`` tells it from a client that closed, whose generation still stops), and
an HTTP/0.9 request line (no headers follow it) at once with a 400 and a status line. The real handler over a
fake model and the byte-level tokenizer: no weights."""

from __future__ import annotations

import json
import socket

import pytest
from support.fake_serve import fake, running, wait_until
from support.tiny_tokenizer import tiny_tokenizer

USER = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    """Send ``data`` (then shut the write side when ``half_close``) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _post(max_tokens: int, version: str = "HTTP/1.1") -> bytes:
    body = json.dumps({"messages": USER, "max_tokens": max_tokens}).encode()
    return (f"POST /v1/chat/completions {version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def test_a_half_closed_client_gets_its_reply(tok):
    loaded = fake(tok, delay=0.05)
    with running(loaded) as port:
        raw = _exchange(port, _post(8), half_close=True)
    interim, _, final = raw.partition(b"\r\n\r\n")
    assert interim == b"HTTP/1.0 100 Continue"
    head, _, body = final.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    reply = json.loads(body)
    assert reply["usage"]["completion_tokens"] == 8 and loaded.model.runs == [8]
    assert reply["choices"][0]["message"]["content"] == tok.decode([loaded.model.token] * 8).strip()


def test_a_client_that_closes_still_stops_its_generation(tok, capsys):
    loaded = fake(tok, delay=0.02)
    with running(loaded) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(_post(3000))
        wait_until(lambda: loaded.model.runs)
        # an HTTP/1.0 client cannot be sent an interim reply: its end of input counts as gone, as before
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(_post(3000, "HTTP/1.0"))
            s.shutdown(socket.SHUT_WR)
            assert s.recv(65536) == b""
        wait_until(lambda: len(loaded.model.runs) == 2)
    assert all(n < 3000 for n in loaded.model.runs)
    err = capsys.readouterr().err
    assert err.count("attnprobe serve: client disconnected; generation stopped after ") == 2


@pytest.mark.parametrize("line", [b"GET /v1/models\r\n", b"GET /v1/models\r\n\r\n", b"GET /\n"])
def test_an_http_0_9_request_gets_a_400_at_once(tok, line):
    """HTTP/0.9 sends no headers: the request line alone is answered (before, the server waited for headers
    until --read-timeout and then closed without a reply)."""
    with running(fake(tok), read_timeout=30.0) as port:
        raw = _exchange(port, line)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 Bad Request\r\n") and b"Content-Type: application/json" in head
    assert json.loads(body)["error"]["message"] == "HTTP/0.9 requests are not supported"
