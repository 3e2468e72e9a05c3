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
  bearer token (with ``--require-key-env``); 411 no Content-Length (chunked bodies are not read); 413 body
  over ``--max-body-bytes``, refused before any of it is read; 408 a client that stops sending
  (``--read-timeout`` per socket read: a garbage request line, a short body; ``--receive-timeout`` for
  the whole request line, headers and body, so a client that trickles a byte at a time cannot hold a
  connection open either); 503 generation over
  ``--max-seconds``;
- a generation stops (between tokens; a prefill runs to its end) when the client disconnects, and so does a
  request still waiting for its turn. A client that half-closes its socket after sending a whole HTTP/1.1
  request still gets its reply: at its end of input it is sent an interim ``100 Continue``, which a client
  that closed answers with a reset (gone) and a half-closed one reads and skips; an HTTP/1.0 client cannot be
  sent one, so its end of input counts as gone;
- an HTTP/0.9 request line (``GET /path``, no headers follow) is answered at once: 400 with a status line.

Modules: :mod:`.protocol` (what a request may hold, limits, errors), :mod:`.http` (the HTTP handler),
:mod:`.launcher` (load, bind, serve; no command line), :mod:`.options` (the option group and ``main``).
"""

from __future__ import annotations

from attnprobe.generation.server.http import client_gone, make_server
from attnprobe.generation.server.launcher import READY_EVENT, bind_error, check_port_free, is_loopback, serve
from attnprobe.generation.server.options import add_server_options, limits_from_args, main, port_number
from attnprobe.generation.server.protocol import (
    DEFAULT_CONTEXT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    Limits,
    RequestError,
    context_length,
    parse_chat_request,
)

_client_gone = client_gone  # the old private name (tests)

__all__ = ["DEFAULT_CONTEXT", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_READ_TIMEOUT",
           "DEFAULT_REQUEST_TIMEOUT", "READY_EVENT", "Limits", "RequestError", "add_server_options", "bind_error",
           "check_port_free", "client_gone", "context_length", "is_loopback", "limits_from_args", "main",
           "make_server", "parse_chat_request", "port_number", "serve"]
