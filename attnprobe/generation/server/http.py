"""HTTP handling of ``attnprobe serve``: the request clock, body limits, authorisation, one generation
at a time, and stopping a generation whose client left or whose time ran out (see the package docstring)."""

from __future__ import annotations

import hmac
import json
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from attnprobe.generation.server.protocol import Limits, RequestError, context_length, parse_chat_request
from attnprobe.generation.transformers_chat import TransformersChat

_CHECK_EVERY_S = 0.2  # how often a running generation looks at the client socket and the clock
_DRAIN_S = 2.0  # after refusing a body unread, how long its bytes are still received and dropped


def client_gone(sock: socket.socket) -> bool:
    """True when the peer has closed its end (readable with nothing to read) or the socket broke
    (:func:`_peer_state`; a request's own check is :class:`_Presence`, which tells a half-close apart)."""
    return _peer_state(sock) != "open"


def _peer_state(sock: socket.socket) -> str:
    """``"open"``, ``"eof"`` (the client sent its end of input: closed, or only half-closed and still reading) or
    ``"error"`` (the connection broke: reset, or the socket is unusable)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return "eof" if readable and sock.recv(1, socket.MSG_PEEK) == b"" else "open"
    except (OSError, ValueError):
        return "error"


class _Presence:
    """Whether the client of one request is still there. An end of input alone does not tell a client that closed
    from one that half-closed after sending its whole request (it still reads the reply): an HTTP/1.1 client is
    then sent an interim ``100 Continue`` (every HTTP/1.1 client reads and skips a 1xx reply), which a closed
    client's side answers with a reset (gone) and a half-closed one reads; an HTTP/1.0 client cannot be asked,
    so its end of input counts as gone."""

    def __init__(self, sock: socket.socket, probe: bytes | None):
        self.sock, self.probe = sock, probe
        self.asked = self.left = False

    def gone(self) -> bool:
        if self.left:
            return True
        state = _peer_state(self.sock)
        if state == "eof" and self.probe is not None and not self.asked:
            self.asked = True
            try:
                self.sock.sendall(self.probe)  # a closed client's side answers with a reset
                return False
            except OSError:
                state = "error"
        if state == "eof" and self.asked:  # the reset a closed client's side sent back leaves an error to read
            try:
                state = "error" if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) else "open"
                self.sock.send(b"")  # EPIPE once the connection was reset
            except OSError:
                state = "error"
        self.left = state in ("error", "eof")  # open after the probe: half-closed, still reading
        return self.left


class _ClientGone(Exception):
    """The client closed its connection; the message says what was left undone (logged on stderr)."""


class _CancellableChat(TransformersChat):
    """TransformersChat whose ``generate`` also stops when ``self.should_stop()`` says so (the client
    left, the time is up). Used under the server's lock, so the per-request hook is never shared."""

    should_stop = None

    def _gen_kwargs(self, max_new_tokens: int, temperature: float) -> dict:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        kw = super()._gen_kwargs(max_new_tokens, temperature)
        check = self.should_stop
        if check is not None:
            class _Stop(StoppingCriteria):
                def __call__(self, input_ids, scores, **kwargs):
                    return torch.full((input_ids.shape[0],), bool(check()), dtype=torch.bool, device=input_ids.device)

            kw["stopping_criteria"] = StoppingCriteriaList([_Stop()])
        return kw


@dataclass
class _App:
    """What every request of one server shares: the model's chat, one generation at a time (the model is
    not re-entrant on CPU), the admission count and the limits."""

    loaded: Any
    limits: Limits
    chat: _CancellableChat
    context: int
    max_prompt: int
    api_key: bytes | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    admitted: threading.BoundedSemaphore | None = None  # generating or waiting for the lock

    def __post_init__(self) -> None:
        self.admitted = threading.BoundedSemaphore(self.limits.max_queue)


def make_server(loaded, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None) -> ThreadingHTTPServer:
    """The HTTP server (not yet serving) for ``loaded`` under ``limits``; see the module docstring."""
    limits = limits or Limits()
    context = context_length(loaded)
    server = _Server((host, port), _Handler)
    server.app = _App(loaded, limits, _CancellableChat(loaded, stop_at_call=False), context,
                      limits.max_prompt_tokens or context, limits.api_key.encode() if limits.api_key else None)
    return server


class _Handler(BaseHTTPRequestHandler):
    """One request of ``attnprobe serve``; what the server shares (model, lock, limits) is ``self.server.app``."""

    server_version = "attnprobe-serve"

    @property
    def app(self) -> _App:
        return self.server.app

    @property
    def timeout(self) -> float:  # StreamRequestHandler sets it on the socket: no read waits forever
        return self.app.limits.read_timeout

    def log_message(self, *args):  # keep test output clean
        pass

    def setup(self):
        """Start the whole-request clock: when it runs out before the request is read, the socket's
        read side is shut, so the blocked read returns and the request is answered 408."""
        super().setup()
        self._late = self._answered = False
        self._clock = threading.Timer(self.app.limits.request_timeout, self._expire)
        self._clock.daemon = True
        self._clock.start()

    def _expire(self):
        self._late = True
        try:
            self.connection.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def _received(self):
        """The request is read in full: stop the clock (a generation is limited by --max-seconds)."""
        self._clock.cancel()
        if self._late:
            raise RequestError(408, self._late_message())

    def handle_one_request(self):
        super().handle_one_request()
        if self._late and not self._answered:  # the clock ran out inside the request line or headers
            self._refuse(RequestError(408, self._late_message()))

    def _late_message(self) -> str:
        return f"the request was not received within {self.app.limits.request_timeout:g} s (attnprobe serve --receive-timeout)"

    def finish(self):
        self._clock.cancel()
        super().finish()

    def _send(self, code: int, payload: dict, headers: dict | None = None):
        self._answered = True
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, err: RequestError):
        self.close_connection = True
        headers = {401: {"WWW-Authenticate": "Bearer"}, 503: {"Retry-After": "1"}}.get(err.status)
        self._send(err.status, err.body(), headers)
        if getattr(self, "_body_unread", False):
            self._discard_input()

    def _discard_input(self):
        """Drop what the client still sends (for at most _DRAIN_S): a client that writes its whole body
        before reading then gets our error instead of a connection reset."""
        deadline = time.monotonic() + _DRAIN_S
        try:
            self.connection.settimeout(_CHECK_EVERY_S)
            while time.monotonic() < deadline and self.connection.recv(1 << 20):
                pass
        except OSError:
            pass

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (bad request line, oversized headers, timeouts, unknown methods) as JSON."""
        if self.request_version == "HTTP/0.9":  # answer with a status line, whatever the client sent
            self.request_version = "HTTP/1.0"
        self._refuse(RequestError(code, message or self.responses.get(code, ("error",))[0]))

    def parse_request(self) -> bool:
        if len(self.raw_requestline.split()) == 2:  # "GET /path": HTTP/0.9 sends no headers; answer before reading any
            self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
            self.command, self.path = self.requestline.split()
            self.request_version, self.close_connection = "HTTP/0.9", True
            self.send_error(400, "HTTP/0.9 requests are not supported")
            return False
        if not super().parse_request():
            return False
        if self._late:  # headers cut short by the clock: do not act on half a request
            self._refuse(RequestError(408, self._late_message()))
            return False
        return True

    def _authorize(self):
        if self.app.api_key is None or self.path.rstrip("/") in ("/health", "/v1/health"):
            return
        got = self.headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.app.api_key):
            raise RequestError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "chunked request bodies are not supported: send a Content-Length")
        values = self.headers.get_all("Content-Length") or []
        if not values:
            raise RequestError(411, "a Content-Length header is required")
        if len(set(values)) > 1 or not re.fullmatch(r"[0-9]{1,20}", values[0].strip()):
            raise RequestError(400, f"Content-Length must be one non-negative integer, got {', '.join(values)!r}")
        n = int(values[0])
        if n > self.app.limits.max_body_bytes:
            raise RequestError(413, f"body of {n} bytes is over the limit of {self.app.limits.max_body_bytes} bytes "
                                    "(attnprobe serve --max-body-bytes)")
        try:
            body = self.rfile.read(n)
            self._received()
        except TimeoutError:
            raise RequestError(408, f"no data for {self.app.limits.read_timeout:g} s while reading the body "
                                    f"(Content-Length {n})") from None
        if len(body) < n:
            raise RequestError(400, f"body ended after {len(body)} of {n} bytes (Content-Length)")
        return body

    def do_GET(self):
        try:
            self._received()
            self._authorize()
        except RequestError as err:
            self._refuse(err)
            return
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.app.loaded.name, "object": "model",
                                                         "context_length": self.app.context}]})
        elif self.path.rstrip("/") in ("/health", "/v1/health"):
            self._send(200, {"status": "ok"})
        else:
            self._refuse(RequestError(404, f"no route {self.path}"))

    def do_POST(self):
        self._body_unread = True
        try:
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                raise RequestError(404, f"no route {self.path}")
            self._authorize()
            body = self._read_body()
            self._body_unread = False
            req = parse_chat_request(body, max_new_tokens_cap=self.app.context)
            reply = self._complete(req)
        except RequestError as err:
            self._refuse(err)
            return
        except _ClientGone as gone:
            self.close_connection = True
            print(f"attnprobe serve: client disconnected; {gone}", file=sys.stderr, flush=True)
            return
        msg = {"role": "assistant", "content": reply.content if not reply.tool_calls else reply.content or None}
        if reply.tool_calls:
            msg["tool_calls"] = reply.tool_calls
        self._send(200, {
            "id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "created": int(time.time()),
            "model": req["model"] or self.app.loaded.name,
            "choices": [{"index": 0, "message": msg, "finish_reason": reply.finish_reason}],
            "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                      "total_tokens": reply.input_tokens + reply.output_tokens},
        })

    def _complete(self, req: dict):
        """The reply, when fewer than --max-queue requests are admitted; else 503 at once (a flood is
        answered, never left to the listen backlog to reset)."""
        if not self.app.admitted.acquire(blocking=False):
            raise RequestError(503, f"busy: {self.app.limits.max_queue} requests are generating or waiting (attnprobe "
                                    "serve --max-queue); retry after the Retry-After seconds", code="busy")
        try:
            return self._complete_admitted(req)
        finally:
            self.app.admitted.release()

    def _complete_admitted(self, req: dict):
        client = _Presence(self.connection, f"{self.protocol_version} 100 Continue\r\n\r\n".encode()
                           if self.request_version == "HTTP/1.1" else None)
        while not self.app.lock.acquire(timeout=_CHECK_EVERY_S):  # wait our turn; give up if the client leaves
            if client.gone():
                raise _ClientGone("it left while waiting for its turn; nothing generated")
        try:
            try:
                n_prompt = len(self.app.chat.prompt(req["messages"], req["tools"]).ids)
            except Exception as exc:  # the chat template refuses the conversation (e.g. role order)
                raise RequestError(400, f"cannot render the messages: {type(exc).__name__}: {exc}") from None
            if n_prompt > self.app.max_prompt:
                raise RequestError(400, f"the prompt is {n_prompt} tokens, over the limit of {self.app.max_prompt} "
                                        "(attnprobe serve --max-prompt-tokens)", param="messages",
                                   code="context_length_exceeded")
            state = {"reason": None, "next": 0.0}
            deadline = None if not self.app.limits.max_seconds else time.monotonic() + self.app.limits.max_seconds

            def should_stop() -> bool:
                now = time.monotonic()
                if now < state["next"]:
                    return False
                state["next"] = now + _CHECK_EVERY_S
                if client.gone():
                    state["reason"] = "gone"
                elif deadline is not None and now > deadline:
                    state["reason"] = "time"
                return state["reason"] is not None

            self.app.chat.should_stop = should_stop
            try:
                reply = self.app.chat.complete(req["messages"], req["tools"], max_new_tokens=req["max_new_tokens"],
                                      temperature=req["temperature"])
            except Exception as exc:  # report, don't crash the server
                raise RequestError(500, f"generation failed: {type(exc).__name__}: {exc}") from None
            finally:
                self.app.chat.should_stop = None
        finally:
            self.app.lock.release()
        if state["reason"] == "gone":
            raise _ClientGone(f"generation stopped after {reply.output_tokens} of {req['max_new_tokens']} tokens")
        if state["reason"] == "time":
            raise RequestError(503, f"generation stopped after {self.app.limits.max_seconds:g} s "
                                    "(attnprobe serve --max-seconds); ask for fewer max_tokens",
                               code="timeout")
        return reply


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 reset 3 of 120 connections in a 30-way flood)

    def handle_error(self, request, client_address):
        """A client that vanished mid-response is routine; anything else is one line on stderr."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            print(f"attnprobe serve: request from {client_address[0]} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)


_client_gone = client_gone  # the old private name (tests)
