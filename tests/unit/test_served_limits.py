"""A served model's reply is bounded (issue 27): read at most ``max_reply_bytes``, within the request
timeout (an option, ``--request-timeout``), and a body that is not UTF-8 JSON is one short line naming the
URL. Raw socket servers stand in for a stalled, a flooding and a garbling endpoint."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import pytest

from attnprobe.cli.options import add_generation_options, make_generator
from attnprobe.errors import AttnprobeError
from attnprobe.generation.openai_chat import OpenAIChat

GOOD = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _read_request(conn) -> dict:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return json.loads(body)


class _Server:
    """One thread per connection; ``mode`` says what it answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.mode, self.payloads, self.stop = "good", [], threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            self.payloads.append(_read_request(conn))
            if self.mode == "silent":  # never answers
                self.stop.wait(10)
                return
            if self.mode == "flood":  # a 200 whose body never ends
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                chunk = b'{"choices": "' + b"x" * 65536
                while not self.stop.is_set():
                    conn.sendall(chunk)
                return
            body = {"good": json.dumps(GOOD).encode(), "latin1": b'{"a": "' + b"\xe9" * 2_000_000 + b'"}',
                    "broken": b'{"choices": [' + b"1, " * 700_000}[self.mode]
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            conn.close()


@pytest.fixture
def server():
    srv = _Server()
    yield srv
    srv.stop.set()
    srv.sock.close()


def _fails(chat, line_has):
    t = time.perf_counter()
    with pytest.raises(AttnprobeError) as info:
        chat.complete([{"role": "user", "content": "q"}])
    text = str(info.value)
    assert text.startswith(chat.url + ": ") and line_has in text and "\n" not in text and len(text) < 300, text
    return time.perf_counter() - t


def test_a_silent_server_fails_within_the_request_timeout(server):
    server.mode = "silent"
    seconds = _fails(OpenAIChat(server.url, "m", timeout=0.4, max_retries=0), "no reply within 0.4 s")
    assert seconds > 0.35  # not before the timeout; the line proves it fired (the server hangs up after 10 s)


def test_an_endless_reply_is_cut_at_the_byte_cap(server):
    server.mode = "flood"
    _fails(OpenAIChat(server.url, "m", timeout=5, max_retries=0, max_reply_bytes=300_000),
           "the reply exceeds 300,000 bytes")  # the body never ends: only the cap ends the read


@pytest.mark.parametrize("mode,line_has", [("latin1", "the reply is not UTF-8 text (byte 7 of 2,000,009: "),
                                           ("broken", "the reply is not a chat completion (broken JSON at character")])
def test_a_garbled_body_is_one_short_line_naming_the_url(server, mode, line_has):
    server.mode = mode
    _fails(OpenAIChat(server.url, "m", timeout=5, max_retries=0), line_has)


def test_max_tokens_is_always_sent_and_a_good_reply_reads(server):
    chat = OpenAIChat(server.url, "m", timeout=5, max_retries=0)
    reply = chat.complete([{"role": "user", "content": "q"}], max_new_tokens=None)
    assert (reply.content, reply.input_tokens, reply.output_tokens) == ("hi", 3, 1)
    assert server.payloads[-1]["max_tokens"] == 256
    chat.complete([{"role": "user", "content": "q"}], max_new_tokens=7)
    assert server.payloads[-1]["max_tokens"] == 7


def _args(*argv):
    p = argparse.ArgumentParser()
    add_generation_options(p, max_new_tokens=16)
    return p.parse_args(["--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", *argv])


def test_request_timeout_and_reply_cap_are_options():
    chat = make_generator(_args("--request-timeout", "2.5", "--max-reply-bytes", "1234"), timeout=600.0)
    assert (chat.timeout, chat.max_reply_bytes) == (2.5, 1234)
    chat = make_generator(_args(), timeout=600.0)
    assert (chat.timeout, chat.max_reply_bytes) == (600.0, 8_000_000)
    with pytest.raises(SystemExit):
        _args("--request-timeout", "0")
