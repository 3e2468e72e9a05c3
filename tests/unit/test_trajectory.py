"""Trajectory format: validation errors name file, line and field; round trips keep everything."""

from __future__ import annotations

import json

import pytest
from support.paths import SAMPLE_FILES, TRAJ_DIR

import attnprobe
from attnprobe.errors import TrajectoryError
from attnprobe.trajectory.importers import from_masking_record, from_smolagents_memory, iter_import

GOOD = {"id": "t1", "task": "Find X", "messages": [
    {"role": "system", "content": "sys"}, {"role": "user", "content": "Task: find X"},
    {"role": "assistant", "content": "search", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{\"query\": \"X\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "1. [X](https://x.example) about X"}],
    "custom_field": {"kept": True}}


def write(tmp_path, records, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return p


def test_shipped_samples_load_and_round_trip(tmp_path):
    trajs = [t for f in SAMPLE_FILES for t in attnprobe.load_trajectories(TRAJ_DIR / f)]
    assert len(trajs) == 4
    long = next(t for t in trajs if t.id == "sample-long-research")
    assert long.num_turns >= 20
    par = next(t for t in trajs if t.id == "sample-parallel-calls")
    assert any(len(m.get("tool_calls") or []) > 1 for m in par.messages)
    assert any(m["role"] == "tool" and m["content"].startswith("Error:") for m in par.messages)
    assert all(m.get("reasoning_content") for t in trajs if t.id.startswith("sample-reasoning")
               for m in t.messages if m["role"] == "assistant")
    out = tmp_path / "rt.jsonl"
    attnprobe.save_trajectories(trajs, out)
    again = attnprobe.load_trajectories(out)
    assert [t.to_dict() for t in again] == [t.to_dict() for t in trajs]


def test_unknown_fields_kept(tmp_path):
    t = attnprobe.load_trajectories(write(tmp_path, [GOOD]))[0]
    assert t.extra == {"custom_field": {"kept": True}}
    assert t.to_dict()["custom_field"] == {"kept": True}


@pytest.mark.parametrize("mutate,line,field,reason", [
    (lambda r: r.pop("id"), 2, "id", "missing required field"),
    (lambda r: r.update(messages=[]), 2, "messages", "non-empty list"),
    (lambda r: r["messages"][1].update(role="human"), 2, "messages[1].role", "role must be one of"),
    (lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{bad"), 2,
     "messages[2].tool_calls[0].function.arguments", "not valid JSON"),
    (lambda r: r["messages"][3].update(tool_call_id="c9"), 2, "messages[3].tool_call_id",
     "answers no tool call"),
    (lambda r: r["messages"][1].update(content=5), 2, "messages[1].content", "expected a string"),
    (lambda r: r["messages"][0].update(tool_calls=[{"function": {"name": "x"}}]), 2, "messages[0].tool_calls",
     "only assistant messages"),
    (lambda r: r["messages"][1].update(annotations=[{"start": 3, "end": 999, "role": "observation"}]), 2,
     "messages[1].annotations[0]", "start < end"),
    (lambda r: r.update(id=True), 2, "id", "must be a non-empty string (or an integer), got True"),
    (lambda r: r["messages"].insert(2, {"role": "tool", "content": "stray"}), 2, "messages[2].role",
     "a tool message must follow an assistant message with tool_calls"),
])
def test_bad_records_name_file_line_field(tmp_path, mutate, line, field, reason):
    bad = json.loads(json.dumps(GOOD))
    bad["id"] = "t2"
    mutate(bad)
    path = write(tmp_path, [GOOD, bad])
    with pytest.raises(TrajectoryError) as info:
        attnprobe.load_trajectories(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert str(err).startswith(f"{path}, line {line}, field '{field}': ")
    assert reason in str(err)


def test_invalid_json_and_duplicates(tmp_path):
    path = write(tmp_path, [GOOD, "{not json"])
    with pytest.raises(TrajectoryError, match=r"t.jsonl, line 2: invalid JSON"):
        attnprobe.load_trajectories(path)
    path = write(tmp_path, [GOOD, GOOD], name="dup.jsonl")
    with pytest.raises(TrajectoryError, match=r"line 2, field 'id': duplicate id 't1' \(first on line 1\)"):
        attnprobe.load_trajectories(path)
    with pytest.raises(TrajectoryError, match="file not found"):
        attnprobe.load_trajectories(tmp_path / "missing.jsonl")


def test_import_openai_list(tmp_path):
    path = write(tmp_path, [GOOD["messages"]], name="plain.jsonl")
    (t,) = list(iter_import(path, "openai"))
    assert t.id == "plain-1" and t.task == "Task: find X" and t.messages == GOOD["messages"]


def test_import_masking_record():
    rec = {"qid": 17, "question": "Who?", "full_messages": GOOD["messages"], "answer": "Y", "correct": False,
           "num_turns": 2}
    t = from_masking_record(rec)
    assert (t.id, t.task, t.labels, t.meta["num_turns"]) == ("17", "Who?", {"answer": "Y", "correct": False}, 2)
    with pytest.raises(TrajectoryError, match="field 'full_messages': missing required field"):
        from_masking_record({"qid": 1})


def test_import_smolagents_memory():
    mem = [
        {"role": "system", "content": [{"type": "text", "text": "You are an agent."}]},
        {"role": "user", "content": [{"type": "text", "text": "New task:\nFind X"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Thought: search for X"}]},
        {"role": "tool-call", "content": [{"type": "text", "text":
            "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'web_search', "
            "'arguments': {'query': 'X'}}}]"}]},
        {"role": "tool-response", "content": [{"type": "text", "text": "Call id: call_1\nObservation:\nX is 4."}]},
    ]
    t = from_smolagents_memory(mem, id="s1")
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool"]
    call = t.messages[2]["tool_calls"][0]
    assert call["id"] == "call_1" and json.loads(call["function"]["arguments"]) == {"query": "X"}
    assert t.messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "X is 4."}
    with pytest.raises(TrajectoryError, match=r"field 'messages\[0\].role': unknown smolagents role 'robot'"):
        from_smolagents_memory([{"role": "robot", "content": "x"}], id="s2")


def test_content_hash_follows_content_only(tmp_path):
    a = attnprobe.load_trajectories(write(tmp_path, [GOOD]))[0]
    reordered = dict(reversed(list(json.loads(json.dumps(GOOD)).items())))  # same content, other key order
    b = attnprobe.load_trajectories(write(tmp_path, [reordered], name="b.jsonl"))[0]
    assert a.content_hash() == b.content_hash() and len(a.content_hash()) == 16
    assert (a.origin, b.origin) == (f"{tmp_path / 't.jsonl'}, line 1", f"{tmp_path / 'b.jsonl'}, line 1")
    changed = json.loads(json.dumps(GOOD))
    changed["messages"][3]["content"] += " "
    c = attnprobe.load_trajectories(write(tmp_path, [changed], name="c.jsonl"))[0]
    assert c.content_hash() != a.content_hash()


def test_unique_ids_across_files_and_empty_files(tmp_path):
    from attnprobe.trajectory.schema import check_unique_ids

    a = attnprobe.load_trajectories(write(tmp_path, [GOOD], name="a.jsonl"))
    b = attnprobe.load_trajectories(write(tmp_path, [dict(GOOD, id="t0"), GOOD], name="b.jsonl"))
    with pytest.raises(TrajectoryError) as info:
        check_unique_ids(a + b)
    assert str(info.value) == (f"{tmp_path / 'b.jsonl'}, line 2, field 'id': duplicate trajectory id 't1': also at "
                               f"{tmp_path / 'a.jsonl'}, line 1; ids must be unique across all inputs")
    check_unique_ids(a + b[:1])
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(TrajectoryError, match=r"e.jsonl: no trajectories in this file \(it is empty\)"):
        attnprobe.load_trajectories(tmp_path / "e.jsonl")
