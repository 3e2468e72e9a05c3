"""A scripted OpenAI-compatible endpoint in a thread (stdlib HTTP server, no model): replies are a
function of the request, each after a fixed latency, so concurrency is measurable in a fast test.

    with scripted_endpoint(latency=0.2) as ep:      # ep.url: "http://127.0.0.1:PORT/v1"
        OpenAIChat(ep.url, "m").complete([{"role": "user", "content": "hi"}])
        ep.bodies          # every request body received (parsed JSON), in arrival order
        ep.max_in_flight   # the most requests the server was handling at once

The default reply is ``"echo <n>: <last user text>"`` with ``n`` the number of messages, and token
counts from word counts; a last user text starting with ``FAIL`` gets HTTP 500 with the body
``{"error": {"message": "scripted failure: <text>"}}``. ``reply(body) -> str`` replaces the default; it may
also return the whole assistant message as a dict (``{"content": ..., "tool_calls": [...]}``, sent as given:
a hostile server's integer ids or object arguments), and ``usage(body, text) -> dict`` the usage object.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


def default_reply(body: dict) -> str:
    msgs = body.get("messages") or []
    last = next((m.get("content") or "" for m in reversed(msgs) if m.get("role") == "user"), "")
    return f"echo {len(msgs)}: {last}"


@dataclass
class Endpoint:
    url: str
    latency: float
    reply: Callable[[dict], str | dict]
    usage: Callable[[dict, str], dict] | None = None
    bodies: list = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server (the client reuses connections)

    def log_message(self, *args):
        pass

    def do_POST(self):
        ep: Endpoint = self.server.endpoint
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with ep.lock:
            ep.bodies.append(body)
            ep.in_flight += 1
            ep.max_in_flight = max(ep.max_in_flight, ep.in_flight)
        try:
            time.sleep(ep.latency)
            text = ep.reply(body)
        finally:
            with ep.lock:
                ep.in_flight -= 1
        last = default_reply(body).split(": ", 1)[1]
        message = {"role": "assistant", **text} if isinstance(text, dict) else {"role": "assistant", "content": text}
        text = str(message.get("content") or "")
        if last.startswith("FAIL"):
            status, out = 500, {"error": {"message": f"scripted failure: {last}"}}
        else:
            prompt = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
            usage = {"prompt_tokens": prompt, "completion_tokens": len(text.split()),
                     "total_tokens": prompt + len(text.split())}
            status, out = 200, {
                "id": "scripted", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": ep.usage(body, text) if ep.usage is not None else usage}
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def scripted_endpoint(*, latency: float = 0.0, reply: Callable[[dict], str | dict] = default_reply,
                      usage: Callable[[dict, str], dict] | None = None) -> Iterator[Endpoint]:
    """Serve on a free port of 127.0.0.1 until the block ends (see the module docstring)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.endpoint = Endpoint(url=f"http://127.0.0.1:{srv.server_port}/v1", latency=latency, reply=reply,
                            usage=usage)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.endpoint
    finally:
        srv.shutdown()
        srv.server_close()
