"""CLI: capture is resumable and atomic, report renders real figures, exit codes are meaningful."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from support.paths import TRAJ_DIR

import attnprobe
from attnprobe.cli.main import main
from attnprobe.io import safe_name

REASONING = str(TRAJ_DIR / "reasoning_content.jsonl")


def test_capture_resume_and_report(smol, tmp_path, capsys):
    out = tmp_path / "caps"
    args = ["capture", REASONING, "--out", str(out), "--chunk-size", "256"]
    assert main(args) == 0
    folders = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert folders == ["sample-reasoning-1", "sample-reasoning-2"]
    res = attnprobe.CaptureResult.load(out / "sample-reasoning-1")
    direct = attnprobe.capture(smol, attnprobe.load_trajectories(REASONING)[0], chunk_size=256)
    np.testing.assert_allclose(res.segment_attention, direct.segment_attention, atol=1e-6)
    m = res.meta
    assert (m["model"], m["backend"], m["dtype"], m["chunk_size"], m["rendering"]) == \
        ("SmolLM2-135M-Instruct", "transformers", "float32", 256, "text")
    assert m["layers"] == list(range(30)) and len(m["chat_template_hash"]) == 16
    assert m["attnprobe_version"] == attnprobe.__version__ and m["trajectory_id"] == "sample-reasoning-1"
    mtime = (out / "sample-reasoning-1" / "meta.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0  # resume: nothing to do
    assert "2 of 2 trajectories already captured" in capsys.readouterr().err
    assert (out / "sample-reasoning-1" / "meta.json").stat().st_mtime_ns == mtime
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "sample-reasoning-2" in html and "Decay curves" in html and "plotly" in html.lower()
    assert html.count("Plotly.newPlot") >= 5  # decay + heatmap/breakdown per trajectory


def test_partial_failure_exit_code(smol, tmp_path, capsys):
    out = tmp_path / "caps"
    code = main(["capture", REASONING, "--out", str(out), "--max-tokens", "1618"])
    err = capsys.readouterr().err
    # sample-reasoning-1 renders to 1616 tokens and fits; sample-reasoning-2 (1620) does not.
    assert code == 1 and "sample-reasoning-2" in err and "above the limit of 1618" in err
    assert (out / "sample-reasoning-1" / "meta.json").is_file()
    assert not (out / "sample-reasoning-2").exists()
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert errors[0]["trajectory_id"] == "sample-reasoning-2"


def test_bad_input_exit_code_names_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"id": "b"}\n')
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert f"{bad}, line 2, field 'messages': missing required field" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(bad), "--out", str(tmp_path / "o"),
                           "--model", str(tmp_path / "nope.gguf")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2  # the input is validated before any model is loaded


def test_missing_model_exit_code(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(good), "--out", str(tmp_path / "o"),
                           "--model", str(tmp_path / "nope.gguf"), "--queries", "decision"],
                          capture_output=True, text=True)
    assert proc.returncode == 3 and "GGUF file not found" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(good), "--out", str(tmp_path / "o"),
                           "--model", "someone/not-cached-model", "--queries", "decision"],
                          capture_output=True, text=True, env=dict(os.environ, HF_HOME=str(tmp_path / "hf")))
    assert proc.returncode == 3 and "never downloads" in proc.stderr


def test_safe_names_are_unique():
    assert safe_name("sample-long-research") == "sample-long-research"
    a, b = safe_name("run-1/worker-2"), safe_name("run-1__worker-2")
    assert a.startswith("run-1__worker-2-") and a != b and "/" not in a
