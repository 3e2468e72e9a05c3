"""A small OpenAI-compatible server for a transformers model (loopback by default).

Lets the OpenAI-compatible code paths (runner, IBIS) be exercised against a real server process
serving the bundled model when vLLM is not installed. Endpoints: GET /v1/models, GET /health,
POST /v1/chat/completions (non-streaming; tool calls parsed from the generated text by the same
:class:`~attnprobe.generation.transformers_chat.TransformersChat` the in-process backends use, without
stop-at-call, so a reply is the full greedy generation).

    python -m attnprobe.generation.server [--model default] [--dtype float32] [--host 127.0.0.1] [--port 0]
    attnprobe serve [...]   (the same, default port 8000)

Once it accepts connections it prints ONE line on stdout (port 0 = any free port):
``{"event": "listening", "url": "http://127.0.0.1:PORT/v1", "model": NAME}``; it then serves until
SIGTERM or SIGINT and shuts down cleanly.

It is built for one trusted user, so it is deliberately plain (stdlib ``http.server``, HTTP/1.0, one
connection per request) but it never hangs or crashes on a bad request:

- one generation at a time (the model is not re-entrant); other requests wait their turn;
- every failure is a JSON ``{"error": {"message", "type", "param", "code"}}`` body with its status:
  400 malformed JSON / not UTF-8 / not an object / bad Content-Length / a message the trajectory schema
  refuses (unknown role, image or other non-text parts, ...) / ``stream: true`` (not implemented) /
  prompt longer than ``--max-prompt-tokens`` (code ``context_length_exceeded``); 401 missing or wrong
  bearer token (with ``--api-key-env``); 411 no Content-Length (chunked bodies are not read); 413 body
  over ``--max-body-bytes``, refused before any of it is read; 408 a client that stops sending
  (``--read-timeout`` per socket read: a garbage request line, a short body; ``--request-timeout`` for
  the whole request line, headers and body, so a client that trickles a byte at a time cannot hold a
  connection open either); 503 generation over
  ``--max-seconds``;
- a generation stops (between tokens; a prefill runs to its end) when the client disconnects (a
  client that half-closes its socket after sending counts as gone), and so does a request still
  waiting for its turn.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import math
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from attnprobe.errors import AttnprobeError, TrajectoryError
from attnprobe.generation.transformers_chat import TransformersChat

READY_EVENT = "listening"
DEFAULT_MAX_BODY_BYTES = 8 << 20  # 8 MiB: far above any prompt a context window holds
DEFAULT_READ_TIMEOUT = 30.0  # seconds per socket read
DEFAULT_REQUEST_TIMEOUT = 120.0  # seconds to receive a whole request (line, headers, body)
DEFAULT_CONTEXT = 8192  # prompt-token limit when the model config names no context length
DEFAULT_MAX_TOKENS = 256
_CHECK_EVERY_S = 0.2  # how often a running generation looks at the client socket and the clock
_DRAIN_S = 2.0  # after refusing a body unread, how long its bytes are still received and dropped


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "authentication_error" if self.status == 401 else (
            "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may cost. ``max_prompt_tokens`` None = the model's context length."""

    max_prompt_tokens: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_seconds: float | None = None
    api_key: str | None = None


def context_length(loaded) -> int:
    """The model's context window from its config (``max_position_embeddings``), else DEFAULT_CONTEXT."""
    n = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else DEFAULT_CONTEXT


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def parse_chat_request(body: bytes, *, max_tokens_cap: int) -> dict:
    """The validated fields of a /v1/chat/completions body, or a RequestError(400) naming the problem.

    Messages and tools go through the trajectory schema (:func:`~attnprobe.trajectory.schema.validate_record`),
    the one place that says what a message may hold, so the server accepts exactly what capture can render.
    """
    from attnprobe.trajectory.schema import validate_record

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"body is not valid UTF-8 (byte {exc.start})") from None
    try:
        req = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                           ) from None
    except RecursionError:
        raise RequestError(400, "body JSON is nested too deeply") from None
    if not isinstance(req, dict):
        raise RequestError(400, f"body must be a JSON object, got {type(req).__name__}")
    if req.get("stream"):
        raise RequestError(400, "stream=true is not supported by attnprobe serve: send the request without "
                                "'stream' (the whole reply comes in one response)", param="stream")
    if req.get("n") not in (None, 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    if "messages" not in req:
        raise RequestError(400, "missing required field 'messages'", param="messages")
    try:
        validate_record({"id": "request", "messages": req["messages"], "tools": req.get("tools")})
    except TrajectoryError as exc:
        raise RequestError(400, f"{exc.field}: {exc.reason}" if exc.field else exc.reason, param=exc.field) from None
    max_tokens = req.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = req.get("max_tokens")
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, max_tokens_cap)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= max_tokens_cap:
        raise RequestError(400, f"max_tokens must be an integer from 1 to {max_tokens_cap}, got {max_tokens!r}",
                           param="max_tokens")
    temperature = req.get("temperature")
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise RequestError(400, f"temperature must be a number >= 0, got {temperature!r}", param="temperature")
    model = req.get("model")
    return {"messages": req["messages"], "tools": req.get("tools") or None, "max_tokens": max_tokens,
            "temperature": float(temperature), "model": model if isinstance(model, str) else None}


def _client_gone(sock: socket.socket) -> bool:
    """True when the peer has closed its end (readable with nothing to read) or the socket broke."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _ClientGone(Exception):
    """The client closed its connection; the message says what was left undone (logged on stderr)."""


class _CancellableChat(TransformersChat):
    """TransformersChat whose ``generate`` also stops when ``self.should_stop()`` says so (the client
    left, the time is up). Used under the server's lock, so the per-request hook is never shared."""

    should_stop = None

    def _gen_kwargs(self, max_tokens: int, temperature: float) -> dict:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        kw = super()._gen_kwargs(max_tokens, temperature)
        check = self.should_stop
        if check is not None:
            class _Stop(StoppingCriteria):
                def __call__(self, input_ids, scores, **kwargs):
                    return torch.full((input_ids.shape[0],), bool(check()), dtype=torch.bool, device=input_ids.device)

            kw["stopping_criteria"] = StoppingCriteriaList([_Stop()])
        return kw


def make_server(loaded, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None) -> ThreadingHTTPServer:
    """The HTTP server (not yet serving) for ``loaded`` under ``limits``; see the module docstring."""
    limits = limits or Limits()
    chat = _CancellableChat(loaded, stop_at_call=False)
    lock = threading.Lock()  # one generation at a time: the model is not re-entrant on CPU
    context = context_length(loaded)
    max_prompt = limits.max_prompt_tokens or context
    api_key = limits.api_key.encode() if limits.api_key else None

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.read_timeout  # StreamRequestHandler sets it on the socket: no read waits forever
        server_version = "attnprobe-serve"

        def log_message(self, *args):  # keep test output clean
            pass

        def setup(self):
            """Start the whole-request clock: when it runs out before the request is read, the socket's
            read side is shut, so the blocked read returns and the request is answered 408."""
            super().setup()
            self._late = self._answered = False
            self._clock = threading.Timer(limits.request_timeout, self._expire)
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

        @staticmethod
        def _late_message() -> str:
            return f"the request was not received within {limits.request_timeout:g} s (attnprobe serve --request-timeout)"

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
            self._send(err.status, err.body(), {"WWW-Authenticate": "Bearer"} if err.status == 401 else None)
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
            if not super().parse_request():
                return False
            if self._late:  # headers cut short by the clock: do not act on half a request
                self._refuse(RequestError(408, self._late_message()))
                return False
            if self.request_version == "HTTP/0.9":
                self.send_error(400, "HTTP/0.9 requests are not supported")
                return False
            return True

        def _authorize(self):
            if api_key is None or self.path.rstrip("/") in ("/health", "/v1/health"):
                return
            got = self.headers.get("Authorization", "")
            scheme, _, token = got.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key):
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
            if n > limits.max_body_bytes:
                raise RequestError(413, f"body of {n} bytes is over the limit of {limits.max_body_bytes} bytes "
                                        "(attnprobe serve --max-body-bytes)")
            try:
                body = self.rfile.read(n)
                self._received()
            except TimeoutError:
                raise RequestError(408, f"no data for {limits.read_timeout:g} s while reading the body "
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
                self._send(200, {"object": "list", "data": [{"id": loaded.name, "object": "model",
                                                             "context_length": context}]})
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
                req = parse_chat_request(body, max_tokens_cap=context)
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
                "model": req["model"] or loaded.name,
                "choices": [{"index": 0, "message": msg, "finish_reason": reply.finish_reason}],
                "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                          "total_tokens": reply.input_tokens + reply.output_tokens},
            })

        def _complete(self, req: dict):
            sock = self.connection
            while not lock.acquire(timeout=_CHECK_EVERY_S):  # wait our turn; give up if the client leaves
                if _client_gone(sock):
                    raise _ClientGone("it left while waiting for its turn; nothing generated")
            try:
                try:
                    n_prompt = len(chat.prompt(req["messages"], req["tools"]).ids)
                except Exception as exc:  # the chat template refuses the conversation (e.g. role order)
                    raise RequestError(400, f"cannot render the messages: {type(exc).__name__}: {exc}") from None
                if n_prompt > max_prompt:
                    raise RequestError(400, f"the prompt is {n_prompt} tokens, over the limit of {max_prompt} "
                                            "(attnprobe serve --max-prompt-tokens)", param="messages",
                                       code="context_length_exceeded")
                state = {"reason": None, "next": 0.0}
                deadline = None if not limits.max_seconds else time.monotonic() + limits.max_seconds

                def should_stop() -> bool:
                    now = time.monotonic()
                    if now < state["next"]:
                        return False
                    state["next"] = now + _CHECK_EVERY_S
                    if _client_gone(sock):
                        state["reason"] = "gone"
                    elif deadline is not None and now > deadline:
                        state["reason"] = "time"
                    return state["reason"] is not None

                chat.should_stop = should_stop
                try:
                    reply = chat.complete(req["messages"], req["tools"], max_tokens=req["max_tokens"],
                                          temperature=req["temperature"])
                except Exception as exc:  # report, don't crash the server
                    raise RequestError(500, f"generation failed: {type(exc).__name__}: {exc}") from None
                finally:
                    chat.should_stop = None
            finally:
                lock.release()
            if state["reason"] == "gone":
                raise _ClientGone(f"generation stopped after {reply.output_tokens} of {req['max_tokens']} tokens")
            if state["reason"] == "time":
                raise RequestError(503, f"generation stopped after {limits.max_seconds:g} s "
                                        "(attnprobe serve --max-seconds); ask for fewer max_tokens",
                                   code="timeout")
            return reply

    return _Server((host, port), Handler)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that vanished mid-response is routine; anything else is one line on stderr."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            print(f"attnprobe serve: request from {client_address[0]} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)


def serve(model_spec: str = "default", *, dtype: str = "float32", host: str = "127.0.0.1", port: int = 0,
          announce: bool = True, device: str | None = None, limits: Limits | None = None) -> int:
    """Load ``model_spec`` (``dtype``, ``device``), bind ``host:port`` (0 = any free port), print the readiness line (when
    ``announce``) and serve until SIGTERM/SIGINT; returns 0 after a clean shutdown."""
    from attnprobe.capture.models import load_model

    limits = limits or Limits()
    loaded = load_model(model_spec, dtype=dtype, device=device)
    server = make_server(loaded, host=host, port=port, limits=limits)
    bound_host, bound_port = server.server_address[:2]
    stopping = threading.Event()

    def _stop(signum, frame):  # serve_forever runs in this thread: shut it down from another one
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _stop)
    try:
        if not is_loopback(host):
            print(f"attnprobe serve: WARNING: listening on {host}, beyond this machine; plain HTTP, "
                  + ("bearer token required (--api-key-env)" if limits.api_key else
                     "NO authentication: anyone who reaches the port can use the model (set --api-key-env)"),
                  file=sys.stderr, flush=True)
        if announce:
            print(json.dumps({"event": READY_EVENT, "url": f"http://{bound_host}:{bound_port}/v1",
                              "model": loaded.name}), flush=True)
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def add_server_options(p: argparse.ArgumentParser, *, default_port: int):
    """The "server" option group of ``attnprobe serve`` and ``python -m attnprobe.generation.server``."""
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; any other prints a warning)")
    g.add_argument("--port", type=_port, default=default_port, help=f"port (default {default_port}; 0 = any free port)")
    g.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="require 'Authorization: Bearer <key>' with the key read from environment variable NAME "
                        "(default: no authentication)")
    g.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="refuse longer prompts with HTTP 400 (default: the model's context length)")
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"refuse larger request bodies with HTTP 413 before reading them (default {DEFAULT_MAX_BODY_BYTES})")
    g.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT,
                   help=f"seconds a socket read may wait before the connection is dropped (default {DEFAULT_READ_TIMEOUT:g})")
    g.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                   help="seconds to receive a whole request (line, headers, body) before answering HTTP 408 "
                        f"(default {DEFAULT_REQUEST_TIMEOUT:g})")
    g.add_argument("--max-seconds", type=float, default=None,
                   help="stop a generation that runs longer and answer HTTP 503 (default: no limit)")
    return g


def _port(text: str) -> int:
    """argparse type: a TCP port 0-65535 (checked before the model loads)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {v}")
    return v


def limits_from_args(args) -> Limits:
    """Limits from the parsed server options; the API key is read from the named variable here."""
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "")
        if not key:
            raise AttnprobeError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
    for name in ("max_prompt_tokens", "max_body_bytes", "read_timeout", "request_timeout", "max_seconds"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise AttnprobeError(f"--{name.replace('_', '-')} must be positive, got {v}")
    return Limits(max_prompt_tokens=args.max_prompt_tokens, max_body_bytes=args.max_body_bytes,
                  read_timeout=args.read_timeout, request_timeout=args.request_timeout, max_seconds=args.max_seconds, api_key=key)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnprobe.generation.server``: the same server as ``attnprobe serve`` (default port 0)."""
    p = argparse.ArgumentParser(prog="python -m attnprobe.generation.server",
                                description="Serve a transformers model on an OpenAI-compatible endpoint.")
    p.add_argument("--model", default="default", help="model spec (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    add_server_options(p, default_port=0)
    args = p.parse_args(argv)
    try:
        limits = limits_from_args(args)
    except AttnprobeError as exc:
        p.error(str(exc))
    return serve(args.model, dtype=args.dtype, device=args.device, host=args.host, port=args.port, limits=limits)


if __name__ == "__main__":
    sys.exit(main())
