"""A scripted Search-R1 retrieval server in a thread (stdlib HTTP, loopback, no model): ``POST /retrieve``
answers as ``search_r1/search/retrieval_server.py`` does, from a fixed table of hits.

    with retrieval_server(HITS) as srv:    # srv.url: "http://127.0.0.1:PORT/retrieve"
        RetrieverSearch(srv.url).search("q1 first", 3)
        srv.bodies     # every request body received (parsed JSON), in arrival order

``hits``: first word of a query -> the corpus rows returned, best first (``{"id", "contents"}``, contents
``"Title"\\ntext`` as in wiki-18); any other query gets no hit. Scores count down from 1.0. A query starting
with ``FAIL`` gets HTTP 500; ``BROKEN`` gets a reply without ``result``; ``HANG`` waits until the test sets
``srv.release`` (a client timeout, without a sleep in the test).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

# a wiki-18-like corpus: the title line in double quotes, a passage with a newline of its own
CORPUS = {
    "1": {"id": "1", "contents": '"Alpha"\nAlpha one.\nAlpha two.'},
    "2": {"id": "2", "contents": '"Beta"\nBeta one.'},
    "3": {"id": "3", "contents": '"Gamma"\nGamma one. Answer is 42.'},
}
HITS = {"q1": ["1", "2"], "q2": ["3", "2"]}


@dataclass
class Server:
    url: str
    hits: dict
    bodies: list = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status: int, out) -> None:
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        srv: Server = self.server.scripted
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        srv.bodies.append(body)
        if self.path != "/retrieve":
            return self._send(404, {"detail": "Not Found"})
        queries, k = body["queries"], body.get("topk") or 3
        if any(q.startswith("HANG") for q in queries):
            srv.release.wait(30)
        if any(q.startswith("FAIL") for q in queries):
            return self._send(500, {"detail": "scripted failure"})
        if any(q.startswith("BROKEN") for q in queries):
            return self._send(200, {"detail": "no result here"})
        result = []
        for q in queries:
            docs = [CORPUS[i] for i in srv.hits.get((q.split() or [""])[0], [])][:k]
            if body.get("return_scores"):
                result.append([{"document": d, "score": 1.0 - 0.1 * j} for j, d in enumerate(docs)])
            else:
                result.append(docs)
        self._send(200, {"result": result})


@contextlib.contextmanager
def retrieval_server(hits: dict | None = None) -> Iterator[Server]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    srv = Server(f"http://127.0.0.1:{httpd.server_address[1]}/retrieve", HITS if hits is None else hits)
    httpd.scripted = srv
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()
