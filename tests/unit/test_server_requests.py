"""attnprobe serve without a model: request validation, and the cancellation / time limit / prompt
limit of the real handler, served in a thread over a fake model whose ``generate`` emits one known
token per step (so the reply and the number of generated tokens are known exactly)."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import pytest
from support.fake_serve import fake, running, wait_until
from support.server import post

from attnprobe.errors import AttnprobeError
from attnprobe.generation.server import (
    Limits,
    RequestError,
    _client_gone,
    add_server_options,
    is_loopback,
    limits_from_args,
    parse_chat_request,
)
from attnprobe.generation.transformers_chat import TransformersChat

USER = [{"role": "user", "content": "Say hi."}]


def parse(obj, cap=100):
    return parse_chat_request(obj if isinstance(obj, bytes) else json.dumps(obj).encode(), max_new_tokens_cap=cap)


def refused(obj, cap=100) -> RequestError:
    with pytest.raises(RequestError) as err:
        parse(obj, cap)
    assert err.value.status == 400
    return err.value


# ------------------------------------------------------------------ request validation
def test_valid_request_fields():
    got = parse({"messages": USER, "max_tokens": 7, "temperature": 0.5, "model": "m"})
    assert got == {"messages": USER, "tools": None, "max_new_tokens": 7, "temperature": 0.5, "model": "m"}
    got = parse({"messages": USER, "max_completion_tokens": 3, "max_tokens": 9})
    assert (got["max_new_tokens"], got["temperature"], got["model"]) == (3, 0.0, None)
    assert parse({"messages": USER})["max_new_tokens"] == 100  # the default 256 capped at the context length
    assert parse({"messages": USER}, cap=4096)["max_new_tokens"] == 256
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert parse({"messages": text_parts, "stream": False})["messages"] == text_parts


@pytest.mark.parametrize("body, param, words", [
    (b"[1, 2]", None, "must be a JSON object, got list"),
    (b'{"messages": "\xff"}', None, "not valid UTF-8 (byte 14)"),
    (b'{"messages": [', None, "not valid JSON"),
    (b"[" * 200_000 + b"]" * 200_000, None, "nested too deeply"),
    ({"messages": USER, "stream": True}, "stream", "stream=true is not supported"),
    ({"messages": USER, "n": 2}, "n", "only n=1"),
    ({"model": "x"}, "messages", "missing required field 'messages'"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role",
     "role must be one of system, user, assistant, tool; got 'wizard'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0].content[1]", "only text parts"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "expected a string"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0]", "expected {'type': 'function'"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens", "from 1 to 100, got 0"),
    ({"messages": USER, "max_tokens": 101}, "max_tokens", "from 1 to 100, got 101"),
    ({"messages": USER, "max_tokens": "5"}, "max_tokens", "got '5'"),
    ({"messages": USER, "max_tokens": True}, "max_tokens", "got True"),
    ({"messages": USER, "temperature": -0.1}, "temperature", "number >= 0"),
    ({"messages": USER, "temperature": "hot"}, "temperature", "number >= 0"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None, "NaN is not a JSON number"),
    # issue 22: an oversized integer was a dropped connection; a non-string model, non-object tool
    # parameters and duplicate keys were accepted
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + b"9" * 5000 + b"}", None,
     "not valid JSON (Exceeds the limit (4300 digits)"),
    ({"messages": USER, "model": ["a", "b"]}, "model", "model must be a string, got list"),
    ({"messages": USER, "model": 7}, "model", "model must be a string, got int"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters", "expected a JSON Schema object, got str"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_tokens": 7}', None,
     "duplicate key 'max_tokens'"),
])
def test_refused_requests_name_the_field(body, param, words):
    err = refused(body)
    assert err.param == param
    assert words in err.message
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_loopback_detection():
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.org"):
        assert not is_loopback(host), host


def test_limits_from_args(monkeypatch):
    p = argparse.ArgumentParser()
    add_server_options(p, default_port=0)
    lim = limits_from_args(p.parse_args(["--max-prompt-tokens", "50", "--max-seconds", "2.5"]))
    assert lim == Limits(max_prompt_tokens=50, max_body_bytes=8 << 20, read_timeout=30.0, max_seconds=2.5)
    monkeypatch.delenv("ATTNPROBE_TEST_KEY", raising=False)
    with pytest.raises(AttnprobeError, match="ATTNPROBE_TEST_KEY: that environment variable is not set"):
        limits_from_args(p.parse_args(["--require-key-env", "ATTNPROBE_TEST_KEY"]))
    monkeypatch.setenv("ATTNPROBE_TEST_KEY", "k1")
    assert limits_from_args(p.parse_args(["--require-key-env", "ATTNPROBE_TEST_KEY"])).api_key == "k1"
    with pytest.raises(AttnprobeError, match="--max-body-bytes must be positive, got -1"):
        limits_from_args(p.parse_args(["--max-body-bytes", "-1"]))
    with pytest.raises(AttnprobeError, match="^--receive-timeout must be positive, got 0"):  # its flag (issue 38)
        limits_from_args(p.parse_args(["--receive-timeout", "0"]))


def test_client_gone_on_a_socket_pair():
    a, b = socket.socketpair()
    with a, b:
        assert not _client_gone(a)
        b.sendall(b"more")  # pipelined bytes are not a hang-up
        assert not _client_gone(a)
        assert a.recv(4) == b"more"
        b.close()
        assert _client_gone(a)


# ------------------------------------------------------------------ the handler over a fake model
@pytest.fixture(scope="module")
def tok(smol):
    return smol.tokenizer


def test_reply_is_the_generated_text_and_usage(tok):
    loaded = fake(tok)
    n_prompt = len(TransformersChat(loaded).prompt(USER).ids)
    with running(loaded) as port:
        status, _, body, _ = post(port, {"messages": USER, "max_tokens": 5})
    assert status == 200
    assert body["choices"][0]["message"] == {"role": "assistant", "content": tok.decode([loaded.model.token] * 5).strip()}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 5, "total_tokens": n_prompt + 5}
    assert loaded.model.runs == [5]


def test_prompt_limit_is_exact(tok):
    loaded = fake(tok)
    n_prompt = len(TransformersChat(loaded).prompt(USER).ids)
    with running(loaded, max_prompt_tokens=n_prompt) as port:
        assert post(port, {"messages": USER, "max_tokens": 1})[0] == 200
    with running(loaded, max_prompt_tokens=n_prompt - 1) as port:
        status, _, body, _ = post(port, {"messages": USER, "max_tokens": 1})
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded"
    assert f"the prompt is {n_prompt} tokens, over the limit of {n_prompt - 1}" in body["error"]["message"]
    assert loaded.model.runs == [1]  # the refused prompt never reached the model


def test_time_limit_stops_generation(tok):
    loaded = fake(tok, delay=0.02)
    with running(loaded, max_seconds=0.5) as port:
        status, _, body, _ = post(port, {"messages": USER, "max_tokens": 3000})
    assert status == 503 and "stopped after 0.5 s" in body["error"]["message"]
    assert body["error"]["type"] == "server_error"
    assert len(loaded.model.runs) == 1 and loaded.model.runs[0] < 3000  # counted: stopped before 3000 tokens


def test_disconnect_stops_generation_and_queued_requests(tok, capsys):
    loaded = fake(tok, delay=0.02)
    with running(loaded) as port:
        post(port, {"messages": USER, "max_tokens": 3000}, close_after_send=True)
        wait_until(lambda: loaded.model.runs)
        assert loaded.model.runs[0] < 3000
        # a request that leaves while another one generates is dropped before it starts
        results = []
        first = threading.Thread(target=lambda: results.append(post(port, {"messages": USER, "max_tokens": 150})))
        first.start()
        time.sleep(0.5)
        post(port, {"messages": USER, "max_tokens": 3000}, close_after_send=True)
        first.join(60)
        time.sleep(0.5)
    assert results[0][0] == 200 and results[0][2]["usage"]["completion_tokens"] == 150
    assert loaded.model.runs[1:] == [150]
    err = capsys.readouterr().err
    assert f"client disconnected; generation stopped after {loaded.model.runs[0]} of 3000 tokens" in err
    assert "client disconnected; it left while waiting for its turn; nothing generated" in err


def test_oversized_body_gets_413_not_a_reset(tok):
    """A client that writes its whole body before reading (http.client, httpx) still reads the 413:
    the server refuses before reading and then drops the bytes instead of resetting the connection."""
    import http.client

    loaded = fake(tok)
    with running(loaded, max_body_bytes=1 << 20) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=b" " * 20_000_000)
        resp = conn.getresponse()
        body = json.loads(resp.read())
    assert resp.status == 413
    assert body["error"]["message"] == ("body of 20000000 bytes is over the limit of 1048576 bytes "
                                        "(attnprobe serve --max-body-bytes)")
    assert loaded.model.runs == []


def test_a_port_in_use_is_one_line_naming_host_and_port_before_the_model_loads():
    from attnprobe.generation.server import check_port_free

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AttnprobeError, match=rf"^127\.0\.0\.1:{port}: address already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", 0)  # any free port: nothing to check
