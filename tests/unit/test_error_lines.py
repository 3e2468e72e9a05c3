"""Issue 38, item 9: every error line the CLI prints is at most 400 characters (MAX_ERROR_CHARS), per-item
``failed:`` lines and the lock refusal included, whatever the server replies: each long value is cut in its
middle, so a line keeps the item, the endpoint and the end of the error."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest

from attnprobe.cli.main import MAX_ERROR_CHARS, main

LONG = "Proxy login required; " * 100
MODES = {  # the misbehaving endpoints of the hostile probe: (status, content type, body), or "drop"
    "html": (200, "text/html", f"<html><body>{LONG}</body></html>"),
    "text": (200, "text/plain", LONG),
    "not-a-completion": (200, "application/json", json.dumps({"detail": LONG})),
    "error-500": (500, "application/json", json.dumps({"error": {"message": LONG}})),
    "bad-json": (200, "application/json", '{"choices": [' + "1, " * 800),
    "drop": None,
}


class _Hostile(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        reply = MODES[self.server.mode]
        if reply is None:  # close without a status line
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status, ctype, body = reply
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("mode", list(MODES))
def test_per_item_failed_lines_are_at_most_400_characters(server, tmp_path, capsys, mode):
    """A long question id, endpoint path, served model and refiner spec against each hostile endpoint: one
    failed line per item, each <= 400 characters, naming the setting, the question and the endpoint."""
    server.mode = mode
    qid = "q-" + "x" * 120
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": qid, "question": "What is item 1?", "answers": ["1"]}))
    url = f"http://127.0.0.1:{server.server_port}/v1/" + "p" * 80
    refiner = f"refine:openai:http://127.0.0.1:{server.server_port}/v1:" + "r" * 60
    rc = main(["study", "interference", str(tmp_path / "q.jsonl"), "--out", str(tmp_path / "o"), "--ircot-form", "chat",
               "--policy", "none",
               "--policy", refiner, "--base-url", url, "--served-model", "m" * 60, "--no-progress", "--max-turns", "2",
               "--request-timeout", "10"])
    assert rc == 1
    lines = capsys.readouterr().err.splitlines()
    failed = [ln for ln in lines if " failed: AttnprobeError: " in ln]
    assert len(failed) == 2 and all(len(ln) <= MAX_ERROR_CHARS for ln in lines), [len(ln) for ln in lines]
    assert failed[0].startswith(f"attnprobe: interference: {{'setting': 'none', 'question_id': '{qid}'}} failed: "
                                f"AttnprobeError: {url[:60]}")
    assert failed[1].startswith(f"attnprobe: interference: {{'setting': '{refiner[:40]}")
    assert " characters cut ...] " in failed[1] and f"AttnprobeError: {url[:60]}" in failed[1]
    assert lines[-1] == f"study interference: 0 run, 0 already done, 2 failed -> {tmp_path / 'o' / 'study.md'}"


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from attnprobe.io import hold_dir_lock
with hold_dir_lock(Path(sys.argv[1]), "study folder"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_the_lock_refusal_is_at_most_400_characters(tmp_path, capsys):
    """The owner's command (recorded up to 300 characters) in the refusal: the line keeps the folder, the owner's
    PID and what to do, and is cut in the middle to 400 characters."""
    from support.studydir import make_study

    out = make_study(tmp_path / "study")
    proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out), "--policy", "mask:" + "9" * 400],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert main(["study", "attention", str(out)]) == 2
    finally:
        proc.kill()
        proc.wait()
    [line] = capsys.readouterr().err.splitlines()
    assert len(line) == MAX_ERROR_CHARS
    assert line.startswith(f"attnprobe: error: {out}: the study folder is in use by process {proc.pid} on ")
    assert line.endswith("; wait for it to finish or choose another output (lock file .attnprobe.lock)")
