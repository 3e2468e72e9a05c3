"""What a study records from a hostile served model is what its readers accept (issue 38, item 1).

A seed002 study against a scripted endpoint whose first reply is a tool call with arguments that are not
JSON, an integer call id, or arguments sent as a JSON object: every file the study writes passes the
trajectory schema (``attnprobe capture``'s validation), the call that could not run is answered with an
error observation, the raw text is kept in its own field, and what the model is sent back is JSON text with
string ids. ``study attention`` skips (and names) a record the schema refuses instead of aborting.
"""

from __future__ import annotations

import json

import pytest
from support.interference import run_interference as run_study
from support.scripted_chat import ScriptedChat
from support.scripted_server import scripted_endpoint

from attnprobe.execution.local import LocalExecutor
from attnprobe.generation.openai_chat import OpenAIChat
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention import histories, recorded_calls
from attnprobe.trajectory.schema import load_trajectories

QUESTION = {"id": "q1", "question": "What is the capital of France?", "answers": ["Paris"], "type": None}
FINAL = "Explanation: known.\nExact Answer: Paris\nConfidence: 90%"
MODES = {  # the first reply's tool call, as the hostile server sends it
    "bad-arguments-json": {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{query: Paris"}},
    "integer-id": {"id": 7, "type": "function", "function": {"name": "search", "arguments": '{"query": "Paris"}'}},
    "object-arguments": {"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"query": "Paris"}}},
}


def _study(tmp_path, mode):
    def reply(body):
        if any(m.get("role") == "tool" for m in body["messages"]):
            return FINAL
        return {"content": "", "tool_calls": [MODES[mode]]}

    with scripted_endpoint(reply=reply) as ep:
        counts, _ = run_study(LocalExecutor(lambda: OpenAIChat(ep.url, "m", max_retries=0), progress=False),
                              tmp_path, [QUESTION], ["none"], LoopConfig("seed002", max_turns=3), n_boot=10)
        return counts, ep.bodies


@pytest.mark.parametrize("mode", list(MODES))
def test_every_file_a_study_writes_against_a_hostile_server_passes_validation(tmp_path, mode):
    counts, bodies = _study(tmp_path, mode)
    assert counts == {"done_before": 0, "done": 1, "failed": 0}
    calls = load_trajectories(tmp_path / "none" / "calls" / "q1.jsonl")  # capture's validation: no error
    history = load_trajectories(tmp_path / "none" / "history" / "q1.jsonl")[0]
    assert [t.id for t in load_trajectories(tmp_path / "none" / "calls.jsonl")] == ["none/q1/step-1", "none/q1/step-2"]
    made = calls[0].messages[-1]["tool_calls"][0]  # the reply as recorded
    sent_back = bodies[1]["messages"][2]["tool_calls"][0]  # what the model was sent back next
    obs = history.messages[3]["content"]
    assert calls[1].messages[3]["content"] == obs  # the observation as it was sent
    if mode == "bad-arguments-json":
        assert made["function"]["arguments"] == "{}" and made["raw_arguments"] == "{query: Paris"
        assert obs == "Error: the arguments of 'search' are not a JSON object ('{query: Paris'); nothing was run."
        assert sent_back["function"]["arguments"] == "{}" and "raw_arguments" not in sent_back
        assert json.loads((tmp_path / "none" / "results" / "q1.json").read_text())["retrievals"] == 0
    else:
        assert made["function"]["arguments"] == '{"query": "Paris"}' and "raw_arguments" not in made
        assert sent_back["function"]["arguments"] == '{"query": "Paris"}'  # JSON text, not an object
        assert not obs.startswith("Error")
    assert made["id"] == ("7" if mode == "integer-id" else "c1")
    assert sent_back["id"] == "call1"  # the history's own numbering


def test_study_attention_skips_and_names_a_record_the_schema_refuses(tmp_path):
    from attnprobe.results.caveats import skipped_records

    def script(messages, tools):
        return FINAL

    run_study(LocalExecutor(lambda: ScriptedChat(script), progress=False), tmp_path,
              [QUESTION, {**QUESTION, "id": "q2"}], ["none"], LoopConfig("seed002", max_turns=2), n_boot=10)
    path = tmp_path / "none" / "calls" / "q1.jsonl"
    rec = json.loads(path.read_text())  # as an older attnprobe kept a server's call: an integer id
    rec["messages"][-1]["tool_calls"] = [{"id": 7, "type": "function", "function": {"name": "search",
                                                                                     "arguments": "{}"}}]
    path.write_text(json.dumps(rec) + "\n")
    skipped: list[str] = []
    kept = recorded_calls(tmp_path, "none", skipped)
    assert [t.id for t in kept] == ["none/q2/step-1"]
    assert skipped == [f"{path}, line 1, field 'messages[2].tool_calls[0].id': expected a string, got int"]
    assert len(histories(tmp_path, "none")) == 2
    doc = {"settings": {"none": {"skipped": skipped}}}
    assert skipped_records(doc) == [f"1 recorded record skipped (not a valid trajectory), first of setting none: "
                                    f"{skipped[0]}"]


@pytest.mark.slow  # the tiny model's captures: 10-20 s on a busy 2-core machine
def test_study_attention_captures_every_call_of_a_study_against_every_hostile_mode(tmp_path, tiny_smol):
    from attnprobe.capture.job import CaptureOptions
    from attnprobe.studies.loop.attention_study import run_attention

    questions = [{**QUESTION, "id": mode, "question": f"Capital of France ({mode})?"} for mode in MODES]

    def reply(body):
        if any(m.get("role") == "tool" for m in body["messages"]):
            return FINAL
        mode = next(m for m in MODES if f"({m})" in body["messages"][1]["content"])
        return {"content": "", "tool_calls": [MODES[mode]]}

    with scripted_endpoint(reply=reply) as ep:
        counts, _ = run_study(LocalExecutor(lambda: OpenAIChat(ep.url, "m", max_retries=0), progress=False),
                              tmp_path, questions, ["none"], LoopConfig("seed002", max_turns=3, top_k=1), n_boot=10)
    assert counts["done"] == 3
    path = tmp_path / "none" / "calls" / "integer-id.jsonl"  # and one record as an older attnprobe kept it
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    recs[0]["messages"][-1]["tool_calls"][0]["id"] = 7
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    _, doc = run_attention(LocalExecutor(lambda: tiny_smol, progress=False), tmp_path, model=tiny_smol,
                           capture=CaptureOptions(queries="reasoning+decision", layers=[0], chunk_size=512),
                           counterfactual=None, n_boot=10)
    d = doc["settings"]["none"]
    assert (d["recorded_calls"], d["captured_calls"]) == (5, 5)  # 6 calls, the one bad record skipped
    assert d["skipped"] == [f"{path}, line 1, field 'messages[2].tool_calls[0].id': expected a string, got int"]
    assert any(c.startswith("1 recorded record skipped") for c in doc["caveats"])


@pytest.mark.parametrize("call, normal", [
    ({"id": 3, "function": {"name": "s", "arguments": {"a": 1}}},
     {"id": "3", "function": {"name": "s", "arguments": '{"a": 1}'}}),
    ({"id": "c", "function": {"name": "s", "arguments": "[1]"}},
     {"id": "c", "function": {"name": "s", "arguments": "{}"}, "raw_arguments": "[1]"}),
    ({"function": {"name": "s", "arguments": '{"a": NaN}'}},
     {"function": {"name": "s", "arguments": "{}"}, "raw_arguments": '{"a": NaN}'}),
    ({"function": {"name": 5, "arguments": ""}}, {"function": {"name": "5", "arguments": ""}}),
    ({"function": {"name": None}}, {"function": {"name": "unnamed", "arguments": "{}"}}),
])
def test_a_call_is_normalised_once_and_then_left_alone(call, normal):
    from attnprobe.generation.chat import ChatReply, normal_tool_call
    from attnprobe.trajectory.schema import validate_record

    assert normal_tool_call(call) == normal and normal_tool_call(normal) == normal
    reply = ChatReply(content="", tool_calls=[call])
    assert reply.tool_calls == [normal]
    validate_record({"id": "x", "messages": [{"role": "user", "content": "q"}, reply.as_message()]})
