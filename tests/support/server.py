"""Start the OpenAI-compatible server (attnprobe.generation.server) as a real subprocess.

    with served(cli=True) as info:   # {"event": "listening", "url": "http://127.0.0.1:PORT/v1", "model": ...}
        ...

The helper waits for the server's one readiness line (a JSON object with ``"event": "listening"``)
for at most ``timeout`` seconds, fails the test with the server's stderr tail if it exits or times
out first, and stops it with SIGTERM (SIGKILL if it does not exit) afterwards.
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
from collections.abc import Iterator

import pytest

from support.paths import ROOT


def _read_lines(stream, q: queue.Queue) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


@contextlib.contextmanager
def served(model: str = "default", *, cli: bool = False, timeout: float = 900.0) -> Iterator[dict]:
    """``cli=False``: ``python -m attnprobe.generation.server``; ``cli=True``: ``python -m attnprobe serve``
    (both bind a free loopback port)."""
    module = ["-m", "attnprobe", "serve"] if cli else ["-m", "attnprobe.generation.server"]
    cmd = [sys.executable, *module, "--model", model, "--host", "127.0.0.1", "--port", "0"]
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryFile(mode="w+") as err:
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
            yield info
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)
