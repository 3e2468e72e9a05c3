"""Start the OpenAI-compatible server (attnprobe.generation.server) as a real subprocess.

    with served(cli=True) as info:   # {"event": "listening", "url": "http://127.0.0.1:PORT/v1", "model": ...}
        ...
    with served(args=["--read-timeout", "2"], env={"KEY": "s3cret"}) as info:
        info["stderr"]()   # what the server wrote on stderr so far

The helper waits for the server's one readiness line (a JSON object with ``"event": "listening"``)
for at most ``timeout`` seconds, fails the test with the server's stderr tail if it exits or times
out first, and stops it with SIGTERM (SIGKILL if it does not exit) afterwards.

:func:`raw_request` / :func:`post` talk to it over a bare socket, so tests can send exactly the
malformed bytes a hostile client would (and time how long the answer takes).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from support.paths import ROOT


def _read_lines(stream, q: queue.Queue) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


@contextlib.contextmanager
def served(model: str = "default", *, cli: bool = False, timeout: float = 900.0, host: str = "127.0.0.1",
           args: Sequence[str] = (), env: dict | None = None) -> Iterator[dict]:
    """``cli=False``: ``python -m attnprobe.generation.server``; ``cli=True``: ``python -m attnprobe serve``
    (both bind a free port on ``host``; ``args`` are more server options, ``env`` more environment).
    The yielded readiness object gets ``"stderr"``: a function returning the server's stderr so far."""
    module = ["-m", "attnprobe", "serve"] if cli else ["-m", "attnprobe.generation.server"]
    cmd = [sys.executable, *module, "--model", model, "--host", host, "--port", "0", *args]
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    with tempfile.NamedTemporaryFile(mode="w+", suffix=".log") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        try:
            info = None
            deadline = time.monotonic() + timeout
            while info is None:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    pytest.fail(f"{' '.join(module)}: no readiness line within {timeout:g} s")
                if line is None:
                    proc.wait(30)
                    err.seek(0)
                    pytest.fail(f"{' '.join(module)} exited with {proc.returncode}: {err.read()[-2000:]}")
                if line.strip().startswith("{"):
                    obj = json.loads(line)
                    if obj.get("event") == "listening":
                        info = obj

            def stderr() -> str:
                with open(err.name, encoding="utf-8", errors="replace") as f:
                    return f.read()

            yield {**info, "stderr": stderr}
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)


def raw_request(port: int, data: bytes, *, host: str = "127.0.0.1", timeout: float = 30.0,
                close_after_send: bool = False) -> tuple[int | None, dict, dict | bytes, float]:
    """Send ``data`` as-is on a fresh connection and read until the server closes it.

    Returns (status or None when the server closed without a response, headers (lower-case names),
    the body parsed as JSON when it is JSON else raw bytes, seconds until the connection closed).
    ``close_after_send``: hang up right after sending (a client that leaves) and return at once.
    """
    import socket

    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        if close_after_send:
            return None, {}, b"", time.monotonic() - t0
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    elapsed = time.monotonic() - t0
    raw = b"".join(chunks)
    if not raw:
        return None, {}, b"", elapsed
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    try:
        parsed: dict | bytes = json.loads(body)
    except ValueError:
        parsed = body
    return status, headers, parsed, elapsed


def post(port: int, payload, *, path: str = "/v1/chat/completions", key: str | None = None,
         host: str = "127.0.0.1", **kw):
    """POST ``payload`` (bytes as-is, anything else as JSON) through :func:`raw_request`."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return raw_request(port, head + body, host=host, **kw)
