"""Helpers for the app tests: building real data (captures of the shipped trajectories, an IBIS run on two
items, a compare table; with the tiny SmolLM2 for the page tests, the bundled model for the browser) and
reading plotly charts back."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np

from support.paths import ROOT

APP_FILE = str(ROOT / "app" / "streamlit_app.py")
# long_research is cut to its first 2048 tokens (still 5+ turns) to keep the suite fast on 2 cores.
CAPTURES = {"long_research.jsonl": 2048, "parallel_calls.jsonl": None, "reasoning_content.jsonl": None}


def build(base: Path, smol, model_args: tuple[str, ...] = (), studies: bool = False) -> None:
    """``model_args``: the CLI's ``--model`` for the IBIS run (none: the bundled model); ``studies``: also two
    scripted-agent studies with their per-call captures (:func:`build_studies`)."""
    import attnprobe
    from attnprobe.cli.main import main

    for name, limit in CAPTURES.items():
        for traj in attnprobe.load_trajectories(ROOT / "trajectories" / name):
            res = attnprobe.capture(smol, traj, queries="reasoning", max_tokens=limit, truncate=limit is not None)
            res.save(base / "captures" / traj.id.replace("/", "_"))
    # exit code 1 = some (item, framing) pairs failed; the pages must still show the rest, and
    # test_framings_page_item_and_aggregate reports missing decisions at its end.
    # the matched protocol: the Models page's attentional gap needs the query shown to the observer
    rc = main(["ibis", "all", "--limit", "2", "--protocol", "matched", "--results", str(base / "ibis"), "--bootstrap", "200",
               "--permutations", "10", "--no-progress", "--max-new-tokens", "24", *model_args])
    assert rc in (0, 1), f"attnprobe ibis all failed (exit {rc})"
    rc = main(["compare", str(base / "ibis"), "--out", str(base / "compare"), "--plotlyjs", "cdn"])
    assert rc == 0, f"attnprobe compare failed (exit {rc})"
    if studies:
        build_studies(base / "studies", smol)
    (base / "BUILT").write_text("ok")


STUDY_QUESTIONS = [{"id": "q1", "question": "Who discovered holmium?", "answers": ["Per Teodor Cleve"], "type": None},
                   {"id": "q2", "question": "What is two plus two?", "answers": ["4"], "type": None}]
SEARCHES = ["holmium", "holmium discovery Cleve", "Uppsala chemist"]


def _seed002_script(messages, tools):
    from support.scripted_chat import tool_call

    turns = sum(m["role"] == "assistant" for m in messages)
    if "two plus two" in messages[1]["content"] or turns >= len(SEARCHES):
        return "Explanation: known.\nExact Answer: Per Teodor Cleve\nConfidence: 90%"
    return f"Step {turns}: search again.", [tool_call(f"c{turns}", "search", query=SEARCHES[turns])]


def _ircot_script(messages, tools):
    turns = sum(m["role"] == "assistant" for m in messages)
    if any("two plus two" in str(m.get("content")) for m in messages[:2]) or turns >= len(SEARCHES):
        return "<think>The documents name him.</think><answer>Per Teodor Cleve</answer>"
    return f"<think>Step {turns}: look it up.</think><search>{SEARCHES[turns]}</search>"


def build_studies(base: Path, smol) -> dict[str, Path]:
    """Two scripted-agent studies over the shipped BM25 corpus, every recorded call captured with ``smol``:
    ``loop-seed002`` (none, mask:1: placeholders) and ``loop-ircot`` (none, ircot:oq: removed turns)."""
    from attnprobe.capture.job import CaptureOptions
    from attnprobe.execution.local import LocalExecutor
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.attention_study import run_attention
    from support.interference import run_interference as run_study
    from support.scripted_chat import ScriptedChat

    out = {}
    for name, cfg, settings, script in (
            ("loop-seed002", LoopConfig("seed002", max_turns=8, top_k=1), ["none", "mask:1"], _seed002_script),
            ("loop-ircot", LoopConfig("ircot", ircot_form="chat", max_turns=4, top_k=1), ["none", "ircot:oq"], _ircot_script)):
        folder = base / name
        counts, _ = run_study(LocalExecutor(lambda s=script: ScriptedChat(s), progress=False), folder, STUDY_QUESTIONS,
                              settings, cfg, n_boot=100)
        assert counts["failed"] == 0, counts
        cap = CaptureOptions(queries="reasoning+decision", chunk_size=512)
        run_attention(LocalExecutor(lambda: smol, progress=False), folder, model=smol, capture=cap,
                      shares_min_past=2, n_boot=100)
        out[name] = folder
    return out


def capture_dirs(base: Path) -> list[Path]:
    return sorted(p.parent for p in (base / "captures").glob("*/meta.json"))  # not the studies' per-call ones


def ibis_folder(base: Path) -> Path:
    return next(p.parent for p in (base / "ibis").glob("*/items.jsonl"))


def decode(v):
    """A plotly JSON array (plain list or base64 typed array) as a float numpy array (None -> NaN)."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if "shape" in v:
            arr = arr.reshape([int(s) for s in str(v["shape"]).split(",")])
        return arr.astype(np.float64)
    return np.asarray([[np.nan if x is None else x for x in r] if isinstance(r, list) else
                       (np.nan if r is None else r) for r in v], dtype=np.float64)


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def find_chart(at, pred) -> dict:
    found = [c for c in charts(at) if pred(c)]
    assert found, "chart not found"
    return found[0]


def is_heatmap(c) -> bool:
    return len(c["data"]) == 2 and all(t.get("type") == "heatmap" for t in c["data"]) and \
        c["data"][0].get("name") == "reasoning"


def is_token_strip(c) -> bool:
    return bool(c["data"]) and c["data"][0].get("type") == "bar" and "token %{x}" in c["data"][0].get(
        "hovertemplate", "")


def strip_values(c, n: int) -> np.ndarray:
    out = np.zeros(n)
    for t in c["data"]:
        out[decode(t["x"]).astype(int)] = decode(t["y"])
    return out


FIRST_DRAWS: list[str] = []  # the browser test's "first draw (s): ..." lines; tests/app/conftest.py prints them last


def md_tables(at) -> list:
    """The Markdown tables a page drew (``attnprobe_app.common.table``), in order, as DataFrames of the
    cell texts (escapes removed), so tests read them as they read ``st.dataframe``."""
    import pandas as pd

    out = []
    for m in at.markdown:
        lines = m.value.split("\n")
        if len(lines) < 2 or not lines[0].startswith("| ") or not lines[1].startswith("| ---"):
            continue
        rows = [[re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", line)[1:-1]]
                for line in lines if not line.startswith("| ---")]
        out.append(pd.DataFrame(rows[1:], columns=rows[0]))
    return out
