"""`attnprobe study interference` end to end with the bundled model (in process and through `attnprobe
serve`), and the recorded calls read by `capture` and `counterfactual` as they are. Budgets are tiny (one
question, two turns, a few new tokens); CI runs these (marked slow)."""

from __future__ import annotations

import json

import pytest
from support.server import served

import attnprobe
from attnprobe.cli.main import main
from attnprobe.resources import data_path

pytestmark = pytest.mark.slow

QUESTIONS = str(data_path("questions_loop.jsonl"))


def _study(out, *extra):
    return main(["study", "interference", "--ircot-form", "chat", QUESTIONS, "--limit", "1", "--max-turns", "2", "--max-new-tokens", "12",
                 "--out", str(out), "--no-progress", "--bootstrap", "100", *extra])


def test_seed002_in_process_then_capture_and_counterfactual_of_the_recorded_calls(tmp_path, smol):
    out = tmp_path / "study"
    assert _study(out, "--scaffold", "seed002", "--generation-preset", "cpu", "--top-k", "3", "--policy", "none",
                  "--policy", "mask:1") == 0
    study = json.loads((out / "study.json").read_text())
    assert set(study["settings"]) == {"none", "mask:1"} and study["scorer"] == "em"
    calls = out / "mask-1" / "calls.jsonl"
    trajs = attnprobe.load_trajectories(calls)
    assert trajs and all(t.meta["setting"] == "mask:1" for t in trajs)
    # every recorded prompt is exactly what the model was sent: re-rendering it gives the counted tokens
    from attnprobe.generation.transformers_chat import TransformersChat

    chat = TransformersChat(smol)
    for t in trajs:
        sent = [dict(m) for m in t.messages[:-1]]
        assert len(chat.prompt(sent, t.tools).ids) == t.meta["usage"]["input_tokens"]
    assert main(["capture", str(calls), "--out", str(tmp_path / "cap"), "--queries", "decision",
                 "--no-progress"]) == 0
    none = out / "none" / "calls.jsonl"
    if any(sum(m["role"] == "assistant" for m in t.messages) >= 2 for t in attnprobe.load_trajectories(none)):
        assert main(["counterfactual", str(none), "--policy", "mask:1", "--min-past", "1", "--include-actions",
                     "--max-steps", "1", "--out", str(tmp_path / "cf"), "--no-progress"]) == 0


def test_ircot_through_attnprobe_serve_equals_in_process(tmp_path):
    with served("default", cli=True) as info:
        assert _study(tmp_path / "served", "--scaffold", "ircot", "--policy", "none", "--generator", "openai",
                      "--base-url", info["url"], "--served-model", info["model"]) == 0
    assert _study(tmp_path / "local", "--scaffold", "ircot", "--policy", "none") == 0
    served_calls = [json.loads(x) for x in (tmp_path / "served" / "none" / "calls.jsonl").read_text().splitlines()]
    local_calls = [json.loads(x) for x in (tmp_path / "local" / "none" / "calls.jsonl").read_text().splitlines()]
    # greedy decoding of the same weights: the same replies, so the same contexts at every step
    assert [c["messages"] for c in served_calls] == [c["messages"] for c in local_calls]
    assert [c["meta"]["usage"]["input_tokens"] for c in served_calls] == \
        [c["meta"]["usage"]["input_tokens"] for c in local_calls]
