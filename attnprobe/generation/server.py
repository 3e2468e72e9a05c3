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
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from attnprobe.generation.transformers_chat import TransformersChat

READY_EVENT = "listening"


def make_server(loaded, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    chat = TransformersChat(loaded, stop_at_call=False)
    lock = threading.Lock()  # one generation at a time: the model is not re-entrant on CPU

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, code: int, payload: dict):
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": loaded.name, "object": "model"}]})
            elif self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                messages = req["messages"]
            except (json.JSONDecodeError, KeyError) as exc:
                self._send(400, {"error": {"message": f"bad request: {exc}"}})
                return
            max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or 256
            try:
                with lock:
                    reply = chat.complete(messages, req.get("tools"), max_tokens=int(max_tokens),
                                          temperature=float(req.get("temperature") or 0.0))
            except Exception as exc:  # report, don't crash the server
                self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            msg = {"role": "assistant", "content": reply.content if not reply.tool_calls else reply.content or None}
            if reply.tool_calls:
                msg["tool_calls"] = reply.tool_calls
            self._send(200, {
                "id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model") or loaded.name,
                "choices": [{"index": 0, "message": msg, "finish_reason": reply.finish_reason}],
                "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                          "total_tokens": reply.input_tokens + reply.output_tokens},
            })

    return ThreadingHTTPServer((host, port), Handler)


def serve(model_spec: str = "default", *, dtype: str = "float32", host: str = "127.0.0.1", port: int = 0,
          announce: bool = True, device: str | None = None) -> int:
    """Load ``model_spec`` (``dtype``, ``device``), bind ``host:port`` (0 = any free port), print the readiness line (when
    ``announce``) and serve until SIGTERM/SIGINT; returns 0 after a clean shutdown."""
    from attnprobe.capture.models import load_model

    loaded = load_model(model_spec, dtype=dtype, device=device)
    server = make_server(loaded, host=host, port=port)
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
        if announce:
            print(json.dumps({"event": READY_EVENT, "url": f"http://{bound_host}:{bound_port}/v1",
                              "model": loaded.name}), flush=True)
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m attnprobe.generation.server``: the same server as ``attnprobe serve`` (default port 0)."""
    p = argparse.ArgumentParser(prog="python -m attnprobe.generation.server",
                                description="Serve a transformers model on an OpenAI-compatible endpoint.")
    p.add_argument("--model", default="default", help="model spec (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (default 0 = any free port)")
    args = p.parse_args(argv)
    return serve(args.model, dtype=args.dtype, device=args.device, host=args.host, port=args.port)


if __name__ == "__main__":
    sys.exit(main())
