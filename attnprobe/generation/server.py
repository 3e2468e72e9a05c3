"""A small OpenAI-compatible server for a transformers model (loopback by default).

Lets the OpenAI-compatible code paths (runner, IBIS) be exercised against a real server process
serving the bundled model when vLLM is not installed. Endpoints: GET /v1/models,
POST /v1/chat/completions (non-streaming; tool calls parsed from the generated text).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from attnprobe.generation.chat import TransformersChat


def make_server(loaded, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    chat = TransformersChat(loaded)
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
            try:
                with lock:
                    reply = chat.complete(messages, req.get("tools"), max_tokens=int(req.get("max_tokens") or 256),
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
