"""One breakdown per call everywhere (issue 37): the Study page's bar of a captured call equals attention.md's
numbers of that call. A real study (scripted IRCoT agent, one question, the shipped corpus) captured with the
tiny random-weight SmolLM2; with one question each step has one call, so attention.json's per-step row of a
step is that call's shares."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.appdata import APP_FILE, STUDY_QUESTIONS, _ircot_script, charts, decode
from support.scripted_chat import ScriptedChat

from attnprobe.capture.job import CaptureOptions
from attnprobe.execution.local import LocalExecutor
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention import run_attention
from attnprobe.studies.loop.attention_report import CATEGORIES
from attnprobe.studies.loop.study import run_study


def test_study_page_bar_equals_attention_md_for_the_same_call(monkeypatch, tmp_path, tiny_smol):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    folder = tmp_path / "data" / "study"
    counts, _ = run_study(LocalExecutor(lambda: ScriptedChat(_ircot_script), progress=False), folder,
                          STUDY_QUESTIONS[:1], ["none"], LoopConfig("ircot", ircot_form="chat", max_turns=4, top_k=1),
                          n_boot=20)
    assert counts["failed"] == 0
    run_attention(LocalExecutor(lambda: tiny_smol, progress=False), folder, model=tiny_smol,
                  capture=CaptureOptions(queries="reasoning+decision", chunk_size=512), n_boot=20)
    doc = json.loads((folder / "attention.json").read_text())
    md = (folder / "attention.md").read_text()
    by_step = doc["settings"]["none"]["decision"]["by_step"]
    assert len(by_step) >= 3 and all(v["calls"] == 1 for v in by_step.values())  # one call per step

    monkeypatch.setenv("ATTNPROBE_APP_DATA", str(tmp_path / "data"))
    at = AppTest.from_file(APP_FILE, default_timeout=60)
    at.query_params["page"] = "Study"
    at.run()
    at.radio(key="study_attention").set_value("every captured step").run()
    assert not at.exception, [e.value for e in at.exception]
    bars = [c for c in charts(at) if c["data"] and c["data"][0].get("type") == "bar"
            and c["data"][0].get("orientation") == "h"]
    assert len(bars) == len(by_step)  # one per captured call, in step order
    for (step, row), bar in zip(by_step.items(), bars):
        queries = list(bar["data"][0]["y"])
        got = {t["name"]: decode(t["x"])[queries.index("decision")] for t in bar["data"]}
        want = row["shares"]
        assert list(got) == [c.replace("_", " ") for c in CATEGORIES]
        np.testing.assert_allclose([got[c.replace("_", " ")] for c in CATEGORIES], [want[c] for c in CATEGORIES],
                                   atol=1e-6)
        # attention.md prints the same numbers in its per-step table (%, one decimal)
        cells = " | ".join(f"{100 * want[c]:.1f}" for c in CATEGORIES)
        assert f"| none | {step} | 1 | {cells} |" in md
        assert got["system"] > 0.01  # the template's tokens are owned by messages: system is never missing
