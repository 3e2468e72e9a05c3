"""The app against hostile data, without a model: a hand-built 3-turn capture (known tokens, text and
attention) next to a deeply nested, a huge and an unparsable meta.json, and copies of the capture whose
arrays disagree with its metadata. Every page keeps working, names each bad folder once, and the
Trajectory page says what is inconsistent instead of raising. Plus: `attnprobe app` stops its Streamlit
child on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from support.appdata import APP_FILE, find_chart, is_token_strip, strip_values  # noqa: E402
from support.paths import ROOT  # noqa: E402

from attnprobe.io import MAX_JSON_BYTES  # noqa: E402
from attnprobe.render.segments import QueryPoint, Segment  # noqa: E402
from attnprobe.results.result import CaptureResult  # noqa: E402

PAGES = ("Trajectory", "Decay", "Framings", "Models", "Study")
N = 12  # tokens


def toy_capture() -> CaptureResult:
    """3 turns over 12 four-character tokens; every layer and head attends like ``token_attention``."""
    text = "".join(f"t{i:02d} " for i in range(N))
    seg = [("system", "external", 0, 0, 0, 2), ("task", "external", 0, 1, 2, 4), ("reasoning", "self", 0, 2, 4, 6),
           ("observation", "external", 0, 3, 6, 8), ("reasoning", "self", 1, 4, 8, 10),
           ("observation", "external", 1, 5, 10, 11), ("reasoning", "self", 2, 6, 11, 12)]
    segments = [Segment(role=r, author=a, turn=t, message_index=m, start=s, end=e) for r, a, t, m, s, e in seg]
    queries = [QueryPoint(position=p, kind="reasoning", turn=t, message_index=m) for p, t, m in ((4, 0, 2), (8, 1, 4),
                                                                                                 (11, 2, 6))]
    tok = np.zeros((3, N), dtype=np.float32)
    for qi, q in enumerate(queries):  # causal rows: weight k+1 on token k <= position, normalised
        w = np.arange(1, q.position + 2, dtype=np.float32)
        tok[qi, : q.position + 1] = w / w.sum()
    seg_att = np.stack([tok[:, s.start:s.end].sum(1) for s in segments], axis=1)
    lh = np.broadcast_to(seg_att[:, None, None, :], (3, 2, 2, len(segments))).copy()
    return CaptureResult(trajectory_id="toy", input_ids=np.arange(100, 100 + N), segments=segments, queries=queries,
                         layers=[0, 1], segment_attention=seg_att, layer_head_attention=lh, token_attention=tok,
                         meta={"model": "toy-model", "dtype": "float32"}, text=text,
                         offsets=np.array([[4 * i, 4 * i + 4] for i in range(N)]))


def run_app(monkeypatch, data: Path, page: str = "Trajectory", **params) -> AppTest:
    monkeypatch.setenv("ATTNPROBE_APP_DATA", str(data))
    at = AppTest.from_file(APP_FILE, default_timeout=60)
    at.query_params["page"] = page
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at, kind: str) -> str:
    return "\n".join(str(e.value) for e in getattr(at, kind))


@pytest.fixture
def hostile(tmp_path) -> Path:
    data = tmp_path / "data"
    toy_capture().save(data / "good")
    for name, content in {"deep": "[" * 100_000 + "]" * 100_000,
                          "bigint": '{"format_version": 1, "trajectory_id": ' + "1" * 5000 + "}"}.items():
        (data / "more" / name).mkdir(parents=True)
        (data / "more" / name / "meta.json").write_text(content)
    (data / "more" / "huge").mkdir()
    with open(data / "more" / "huge" / "meta.json", "wb") as f:  # sparse: no disk used, never read
        f.truncate(MAX_JSON_BYTES + 1)
    return data


PROBLEMS = ["unreadable: more/bigint/meta.json: invalid JSON value (Exceeds the limit (4300 digits)",
            "unreadable: more/deep/meta.json: JSON nested too deeply",
            f"unreadable: more/huge/meta.json: {MAX_JSON_BYTES + 1} bytes, above the limit of {MAX_JSON_BYTES} bytes"]


def test_hostile_meta_json_is_listed_and_skipped_on_every_page(monkeypatch, hostile):
    for page in PAGES:
        at = run_app(monkeypatch, hostile, page)
        listed = texts(at, "text").splitlines()
        for want in PROBLEMS:
            assert sum(line.startswith(want) for line in listed) == 1, (page, want, listed)
    at = run_app(monkeypatch, hostile)
    assert at.sidebar.selectbox(key="traj_run").options == ["toy · toy-model · 3 turns (good)"]
    # the good capture still renders, with its known token attention
    res = toy_capture()
    strip = find_chart(at, is_token_strip)
    np.testing.assert_allclose(strip_values(strip, N), res.token_attention[2], rtol=1e-6)
    # a deep link straight to the nested one: an error on the page, nothing raised
    at = run_app(monkeypatch, hostile, run="more/deep")
    assert "more/deep/meta.json: JSON nested too deeply" in texts(at, "error")
    assert not at.get("plotly_chart")


def _edit_meta(folder: Path, change) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def _edit_scores(folder: Path, change) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(folder / "scores.safetensors"))
    change(arrays)
    save_file(arrays, str(folder / "scores.safetensors"))


BROKEN = {
    "tokens": (lambda f: _edit_meta(f, lambda m: m.update(num_tokens=99)),
               "meta.json says num_tokens 99 but scores.safetensors holds 12 input_ids"),
    "segment": (lambda f: _edit_meta(f, lambda m: m["segments"][6].update(end=40)),
                "segments[6] spans tokens [11, 40) of turn 2, outside the 12 tokens"),
    "role": (lambda f: _edit_meta(f, lambda m: m["segments"][2].update(role="thinking")),
             # refused by CaptureResult.load itself, naming the file and field (issue 22)
             "<data>/role/meta.json, field 'segments[2].role': unknown role 'thinking'"),
    "query": (lambda f: _edit_meta(f, lambda m: m["queries"][2].update(position=50)),
              "queries[2] is token 50 of turn 2, outside the 12 tokens / 3 turns"),
    "turns": (lambda f: _edit_meta(f, lambda m: m.update(num_turns=7)),
              "meta.json says num_turns 7 but the segments cover 3 turns"),
    "strip": (lambda f: _edit_scores(f, lambda a: a.update(token_attention=a["token_attention"][:, :5].copy())),
              "token_attention has shape (3, 5), expected (3 queries, 12 tokens)"),
    "offsets": (lambda f: _edit_scores(f, lambda a: a.update(offsets=a["offsets"][:4].copy())),
                "offsets has shape (4, 2), expected (12 tokens, 2)"),
    "layers": (lambda f: _edit_meta(f, lambda m: m.update(layers=[0, 1, 2])),
               "layer_head_attention has shape (3, 2, 2, 7), expected (3, 3 layers, heads, 7)"),
}


def test_inconsistent_captures_show_what_disagrees(monkeypatch, tmp_path):
    data = tmp_path / "data"
    toy_capture().save(data / "good")
    for name, (breaker, _) in BROKEN.items():
        toy_capture().save(data / name)
        breaker(data / name)
    at = run_app(monkeypatch, data)
    for name, (_, words) in BROKEN.items():
        at.sidebar.selectbox(key="traj_run").set_value(name).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        err = texts(at, "error")
        want = words if words.startswith("<data>") else f"{name}: inconsistent capture: {words}"
        assert f"Cannot show `{name}`: {want}" in err, (name, err)
        assert not at.get("plotly_chart"), name
    at.sidebar.selectbox(key="traj_run").set_value("good").run()
    assert not texts(at, "error") and find_chart(at, is_token_strip)
    # the Decay page skips them by name and still shows the rest
    at = run_app(monkeypatch, data, "Decay")
    at.multiselect(key="decay_runs").set_value(["good", *BROKEN]).run()
    assert not at.exception
    skipped = [e for e in texts(at, "error").splitlines() if e.startswith("Skipped: ")]
    assert len(skipped) == len(BROKEN)


def test_decay_page_says_what_it_preselected(monkeypatch, tmp_path):
    data = tmp_path / "data"
    for i in range(14):
        toy_capture().save(data / f"run{i:02d}")
    at = run_app(monkeypatch, data, "Decay")
    assert len(at.multiselect(key="decay_runs").value) == 12
    assert "The first 12 of 14 runs (by folder) are preselected" in texts(at, "caption")


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (a dead child that init has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopping_attnprobe_app_stops_the_streamlit_child(tmp_path, sig):
    """SIGTERM / SIGINT are forwarded to Streamlit and waited for (exit 0 / 130); after SIGKILL, which
    cannot be forwarded, Linux's parent-death signal stops it. Nothing is left running."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "attnprobe", "app", "--data", str(tmp_path), "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT))
    children: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "app did not start: " + log.read_text()[-2000:]
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(children) == 1
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        assert rc == {signal.SIGTERM: 0, signal.SIGINT: 130, signal.SIGKILL: -9}[sig], log.read_text()[-2000:]
        deadline = time.monotonic() + 60
        while not _gone(children[0]):
            assert time.monotonic() < deadline, f"streamlit (pid {children[0]}) still running"
            time.sleep(0.2)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
