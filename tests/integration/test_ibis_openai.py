"""The OpenAI-compatible path against a real server process serving the bundled model on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.paths import ROOT  # noqa: E402

from attnprobe.cli.main import main
from attnprobe.studies.ibis.behaviour import TransformersBackend, read_decisions
from attnprobe.studies.ibis.framings import build_framing
from attnprobe.studies.ibis.items import load_items


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "attnprobe.generation.serve_main", "--model", "default", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        deadline = time.time() + 900
        line = ""
        while time.time() < deadline:
            line = proc.stdout.readline()
            if line.strip().startswith("{"):
                break
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}")
        info = json.loads(line)
        assert info["event"] == "listening" and info["url"].startswith("http://127.0.0.1:")
        yield info
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_openai_backend_against_real_server(server, smol, tmp_path, capsys):
    folder = tmp_path / "served"
    rc = main(["ibis", "run", "--backend", "openai", "--base-url", server["url"], "--served-model", server["model"],
               "--ids", "sci-04", "--framings", "observer", "--max-new-tokens", "6", "--folder", str(folder),
               "--no-progress"])
    assert rc == 0
    (rec,) = read_decisions(folder / "decisions.jsonl")
    assert rec["backend"] == "openai" and rec["model"] == server["model"] and rec["input_tokens"] > 100
    assert rec["decision"] in ("web_search", "visit_page", "answer", "unparseable")
    # same greedy tokens as the in-process model on the identical rendered prompt
    it = [i for i in load_items(ROOT / "trajectories" / "ibis_items.jsonl") if i.id == "sci-04"][0]
    local = TransformersBackend(smol, early_stop=False, forced_choice=False).complete(
        build_framing(it, "observer"), max_tokens=6)
    assert rec["raw_text"].strip() == local["raw_text"].strip()
    assert rec["input_tokens"] == local["input_tokens"]


def test_openai_unreachable_endpoint_is_logged_not_dropped(tmp_path):
    folder = tmp_path / "down"
    rc = main(["ibis", "run", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--served-model", "x",
               "--ids", "sci-01", "--framings", "agentic", "--folder", str(folder), "--no-progress"])
    assert rc == 1  # some items failed; they are in errors.jsonl and retried next time
    err = [json.loads(x) for x in (folder / "errors.jsonl").read_text().splitlines()]
    assert err[0]["item_id"] == "sci-01" and "cannot connect" in err[0]["error"]
    assert not (folder / "decisions.jsonl").exists()
