"""The seeds' scaffolds with context policies in the loop: exactly what the model is sent at every step.

A scripted chat model (tests/support/scripted_chat.py) answers from what it is sent, and a fixed search
backend returns known documents, so every expected message list is written out by hand here.
"""

from __future__ import annotations

import json

import pytest
from support.fixed_search import FixedSearch
from support.ircot import D1, D2, R1, R2, R3, Q
from support.scripted_chat import ScriptedChat, tool_call, words

from attnprobe.agents.policies import DEFAULT_PLACEHOLDER, refine_latest
from attnprobe.agents.tagtext import unlabelled
from attnprobe.studies.loop.agents import LoopConfig, as_tags, run_question
from attnprobe.studies.loop.context import Setting, parse_setting
from attnprobe.studies.loop.pool import Browser
from attnprobe.studies.loop.prompts import IRCOT_INVALID, IRCOT_PROMPT, SEED002_SYSTEM
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.trajectory.schema import Trajectory


def ircot_script(messages, tools):
    """Reply by how many documents the model has been shown so far in the question's history: the step
    number is the count of assistant turns plus removed ones, so read it from the last message instead."""
    last = messages[-1]["content"]
    if last.startswith("Answer the given question"):
        return R1
    if "Gamma" in last or "42" in last:
        return R3
    return R2


def run_ircot(spec_or_setting, script=ircot_script, **cfg):
    setting = parse_setting(spec_or_setting) if isinstance(spec_or_setting, str) else spec_or_setting
    chat = ScriptedChat(script)
    result, calls, history = run_question(chat, FixedSearch(), setting, LoopConfig("ircot", ircot_form="chat", **cfg), Q,
                                          run_id=f"run/{setting.spec}", scorer=Scorer())
    return chat, result, calls, history


U = {"role": "user", "content": IRCOT_PROMPT.format(question=Q["question"])}


def A(text):
    return {"role": "assistant", "content": text}


def info(text):
    return {"role": "user", "content": f"<information>{text}</information>"}


IRCOT_EXPECTED = {
    "none": [[U], [U, A(R1), info(D1)], [U, A(R1), info(D1), A(R2), info(D2)]],
    # seed 004 §3.2: IRCoT-o [x, p_0, q_1, p_1, q_1, ..., q_{i-1}, o_i]
    "ircot:o": [[U], [U, A(R1), info(D1)], [U, A(R1), A(R2), info(D2)]],
    # IRCoT-oq [x, p_0, p_1, ..., p_{i-1}, q_{i-1}, o_i]
    "ircot:oq": [[U], [U, A(R1), info(D1)], [U, A("<think>p0</think>"), A(R2), info(D2)]],
    # IRCoT-oqp [x, p_{i-1}, q_{i-1}, o_i]
    "ircot:oqp": [[U], [U, A(R1), info(D1)], [U, A(R2), info(D2)]],
}


@pytest.mark.parametrize("spec", list(IRCOT_EXPECTED))
def test_ircot_sends_exactly_the_variant_context(spec):
    chat, result, calls, history = run_ircot(spec)
    assert chat.sent == IRCOT_EXPECTED[spec]
    assert chat.tools == [None, None, None]
    # the recorded calls are exactly what was sent (labelled by annotations, which the model is not sent), plus
    # the reply
    assert [unlabelled(c["messages"][:-1]) for c in calls] == IRCOT_EXPECTED[spec]
    assert all(m.get("annotations") for c in calls for m in c["messages"][1:-1] if "<information>" in m["content"])
    assert [c["messages"][-1]["content"] for c in calls] == [R1, R2, R3]
    assert result["answer"] == "42" and result["correct"] is True
    assert result["retrievals"] == 2 and result["tool_calls"] == 2 and result["model_calls"] == 3
    # the full history is the same for every variant: nothing removed, queries as calls, documents raw
    assert [m["role"] for m in history["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert history["messages"][2]["content"] == D1 and history["messages"][4]["content"] == D2
    assert json.loads(history["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"query": "q1 first"}
    assert history["messages"][1]["content"] == "<think>p0</think>"
    assert history["meta"]["steps"] == [{"step": 1, "call_id": f"run/{spec}/step-1", "messages": 1},
                                        {"step": 2, "call_id": f"run/{spec}/step-2", "messages": 3},
                                        {"step": 3, "call_id": f"run/{spec}/step-3", "messages": 5}]
    # each call links its sent messages to the full history
    assert calls[2]["meta"]["history"]["messages"] == 5
    src = calls[2]["meta"]["history"]["source"]
    assert src == {"none": [0, 1, 2, 3, 4], "ircot:o": [0, 1, 3, 4], "ircot:oq": [0, 1, 3, 4],
                   "ircot:oqp": [0, 3, 4]}[spec]
    for c in calls + [history]:
        Trajectory.from_dict(c)  # every record is a valid trajectory


def test_refiner_runs_once_per_round_on_that_rounds_query_and_documents():
    seen = []

    def refiner(query, document):
        seen.append((query, document))
        return f"R[{query}]"

    setting = Setting("refine:test", refine=refine_latest(refiner, name="refine:test"), parts=["refine:test"])
    chat, result, calls, history = run_ircot(setting, script=lambda m, t: (
        R1 if len(m) == 1 else R2 if len(m) == 3 else R3))
    assert seen == [("q1 first", D1), ("q2 second", D2)]  # once per round, never again at later steps
    assert chat.sent == [[U], [U, A(R1), info("R[q1 first]")],
                         [U, A(R1), info("R[q1 first]"), A(R2), info("R[q2 second]")]]
    assert result["refiner_calls"] == 2
    # the full history keeps the raw documents; the refined text is kept beside it, by message index
    assert history["messages"][2]["content"] == D1
    assert history["meta"]["refined"] == {"2": "R[q1 first]", "4": "R[q2 second]"}
    assert calls[2]["meta"]["history"]["refined"] == [2, 4]


def test_refiner_composes_with_a_variant():
    from attnprobe.agents.refiners import bm25_refiner

    chat, result, calls, history = run_ircot("ircot:o+refine:bm25:1")
    f = bm25_refiner(1)
    assert chat.sent[2] == [U, A(R1), A(R2), info(f("q2 second", D2))]
    assert chat.sent[1] == [U, A(R1), info(f("q1 first", D1))]


def test_ircot_invalid_turn_gets_search_r1_feedback_and_no_answer_is_wrong():
    chat, result, calls, history = run_ircot("none", script=lambda m, t: "I am not sure.", max_turns=2)
    assert chat.sent[1] == [U, A("I am not sure."), {"role": "user", "content": IRCOT_INVALID}]
    assert result["answer"] is None and result["no_answer"] and result["correct"] is False
    assert result["retrievals"] == 0


def test_as_tags_drops_a_turn_left_empty():
    msgs = [U, {"role": "assistant", "content": "", "tool_calls": [tool_call("c1", "search", query="x")],
                "tag_text": "<search>x</search>"}]
    sent, kept = as_tags(msgs)
    assert (unlabelled(sent), kept) == ([U, A("<search>x</search>")], [0, 1])
    assert sent[1]["annotations"] == [{"start": 0, "end": 18, "role": "tool_call", "author": "self"}]
    sent, kept = as_tags([U, {"role": "assistant", "content": ""}, {"role": "tool", "content": "d"}])
    assert (sent, kept) == ([U, {**info("d"), "annotations": [{"start": 0, "end": 28, "role": "observation",
                                                                 "author": "external"}]}], [0, 2])


def test_context_length_and_tokens_are_the_means_and_sums_of_what_was_sent():
    chat, result, calls, history = run_ircot("ircot:oqp")
    per_call = [words(m) for m in IRCOT_EXPECTED["ircot:oqp"]]
    assert result["input_tokens"] == sum(per_call)
    assert result["context_tokens"] == pytest.approx(sum(per_call) / 3, abs=0.01)
    assert result["output_tokens"] == sum(len(r.split()) for r in (R1, R2, R3))


# ------------------------------------------------------------------ seed 002
SYS = {"role": "system", "content": (
    f"{SEED002_SYSTEM}\n\nTools:\n"  # the scripted chat has no template: the release's "none" family, no sentence
    "- search(query): Search for pages; returns results with their cursor numbers, titles, URLs and snippets.\n"
    "- open(id, loc): Open a page by cursor number or URL; returns its numbered lines from line loc on.\n"
    "- find(id, pattern): Find the lines of a page that contain a pattern (exact text, case-insensitive).\n"
    'Call a tool with JSON, for example {"name": "search", "arguments": {"query": "keywords"}}.')}
TASK = {"role": "user", "content": Q["question"]}  # the release sends the question alone
FINAL = "Explanation: it says so [2].\nExact Answer: 42\nConfidence: 90%"


def seed002_script(messages, tools):
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if turns == 0:  # two searches in parallel
        return "", [tool_call("x1", "search", query="q1 a"), tool_call("x2", "search", query="q2 b")]
    if turns == 1:  # open a page by cursor, find in it, and a bad cursor (an error)
        return "<think>look</think>", [tool_call("x3", "open", id="2"), tool_call("x4", "find", id="2", pattern="answer"),
                        tool_call("x5", "open", id="9")]
    return FINAL


def run_seed002(spec, script=seed002_script):
    chat = ScriptedChat(script)
    result, calls, history = run_question(chat, FixedSearch(), parse_setting(spec), LoopConfig("seed002"), Q,
                                          run_id="run", scorer=Scorer())
    return chat, result, calls, history


def ph(name, args):
    """mask-obs:K's placeholder (ours)."""
    return DEFAULT_PLACEHOLDER.format(name=name, arguments=json.dumps(args))


def arch(name, args):
    """mask:K's placeholder: the released scaffold's text, args as k=repr(v)[:80] joined by ', '."""
    return f"[Auto-archived browser result] tool={name} | args: {args}"


S1 = "[0] A (u/a)\nAlpha one\n[1] B (u/b)\nBeta one."
S2 = "[2] C (u/c)\nGamma one\n[1] B (u/b)\nBeta one."
OPEN2 = "[2] C (u/c)\nL0: C\nL1: Gamma one.\nL2: Answer is 42.\n(lines 0-2 of 3)"
FIND2 = "[2] C\nL2: Answer is 42."
ERR = "Error: no page with cursor 9 in the pool (cursors 0-2)."


def _calls(*specs):
    return [{"id": f"call{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in specs]


TURN1 = {"role": "assistant", "content": "", "tool_calls": _calls((1, ("search", {"query": "q1 a"})),
                                                                  (2, ("search", {"query": "q2 b"})))}
# the release's turns: <think> text as reasoning_content, no content beside tool calls (deploy_agent.py)
TURN2 = {"role": "assistant", "content": "", "reasoning_content": "look", "tool_calls": _calls(
    (3, ("open", {"id": "2"})), (4, ("find", {"id": "2", "pattern": "answer"})), (5, ("open", {"id": "9"})))}


def T(cid, name, content):
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


def test_seed002_pool_parallel_calls_and_no_masking():
    chat, result, calls, history = run_seed002("none")
    step3 = [SYS, TASK, TURN1, T("call1", "search", S1), T("call2", "search", S2),
             TURN2, T("call3", "open", OPEN2), T("call4", "find", FIND2), T("call5", "open", ERR)]
    assert chat.sent == [[SYS, TASK], step3[:5], step3]
    assert all(t is not None and [f["function"]["name"] for f in t] == ["search", "open", "find"] for t in chat.tools)
    assert result["answer"] == "42" and result["correct"] is True and result["confidence"] == 90
    assert result["retrievals"] == 2 and result["tool_calls"] == 5
    # u/b came back from both searches: one page, one cursor (deduplicated, stable)
    assert [p["url"] for p in history["meta"]["page_pool"]] == ["u/a", "u/b", "u/c"]


def test_seed002_mask_obs_counts_observations_and_keeps_errors():
    chat, result, calls, history = run_seed002("mask-obs:2")
    assert chat.sent[1] == [SYS, TASK, TURN1, T("call1", "search", S1), T("call2", "search", S2)]
    assert chat.sent[2] == [SYS, TASK, TURN1,
                            T("call1", "search", ph("search", {"query": "q1 a"})),
                            T("call2", "search", ph("search", {"query": "q2 b"})),
                            TURN2, T("call3", "open", OPEN2),
                            T("call4", "find", FIND2), T("call5", "open", ERR)]
    # the error is exempt and uses no window slot: the two kept are the newest two others (issue 19)
    assert calls[2]["meta"]["history"]["changes"] == {"3": "placeholder", "4": "placeholder"}
    # the full history keeps every observation
    assert history["messages"][3]["content"] == S1 and history["messages"][6]["content"] == OPEN2


def seed002_longer(messages, tools):
    """Parallel searches; open + find + a bad cursor (an error) in parallel; a turn whose only call fails;
    a find that succeeds; the answer."""
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if turns < 2:
        return seed002_script(messages, tools)
    if turns == 2:
        return "<think>retry</think>", [tool_call("x6", "open", id="7")]
    if turns == 3:
        return "check</think>", [tool_call("x7", "find", id="0", pattern="Alpha")]
    return FINAL


ERR7 = "Error: no page with cursor 7 in the pool (cursors 0-2)."
FIND0 = "[0] A\nL1: Alpha one.\nL2: Alpha two."
TURN3 = {"role": "assistant", "content": "", "reasoning_content": "retry", "tool_calls": _calls((6, ("open", {"id": "7"})))}
TURN4 = {"role": "assistant", "content": "", "reasoning_content": "check",  # "</think>" alone: Qwen3.5's opened <think>
         "tool_calls": _calls((7, ("find", {"id": "0", "pattern": "Alpha"})))}


def test_seed002_mask_1_is_the_released_rule_at_every_step():
    """Issue 26: mask:1 archives every successful result older than the most recent turn with a non-error
    call, with the release's placeholder; parallel results of one turn go together; errors never; a turn
    whose only call failed does not move the window."""
    chat, result, calls, history = run_seed002("mask:1", seed002_longer)
    r1, r2 = T("call1", "search", S1), T("call2", "search", S2)
    r3, r4, e5 = T("call3", "open", OPEN2), T("call4", "find", FIND2), T("call5", "open", ERR)
    e6, r7 = T("call6", "open", ERR7), T("call7", "find", FIND0)
    a1 = T("call1", "search", arch("search", "query='q1 a'"))
    a2 = T("call2", "search", arch("search", "query='q2 b'"))
    a3 = T("call3", "open", arch("open", "id='2'"))
    a4 = T("call4", "find", arch("find", "id='2', pattern='answer'"))
    assert chat.sent == [
        [SYS, TASK],
        [SYS, TASK, TURN1, r1, r2],  # one counted turn: nothing before it
        [SYS, TASK, TURN1, a1, a2, TURN2, r3, r4, e5],  # turn 2 counts (open and find succeed beside the error)
        [SYS, TASK, TURN1, a1, a2, TURN2, r3, r4, e5, TURN3, e6],  # turn 3 only failed: the window stays
        [SYS, TASK, TURN1, a1, a2, TURN2, a3, a4, e5, TURN3, e6, TURN4, r7],  # the errors are never archived
    ]
    assert [c["meta"]["history"]["changes"] for c in calls] == [
        {}, {}, {"3": "placeholder", "4": "placeholder"}, {"3": "placeholder", "4": "placeholder"},
        {"3": "placeholder", "4": "placeholder", "6": "placeholder", "7": "placeholder"}]
    assert result["answer"] == "42" and result["tool_calls"] == 7 and result["model_calls"] == 5
    assert history["messages"][3]["content"] == S1  # the full history keeps every observation
    assert result["policy_rules"]["mask:1"]["placeholder"].startswith("[Auto-archived browser result] tool=<name>")
    # mask:2 on the same run: only the first turn's results, and only once three turns have counted
    chat, *_ = run_seed002("mask:2", seed002_longer)
    assert [[m["content"] for m in sent if m["content"].startswith("[Auto")] for sent in chat.sent] == [
        [], [], [], [], [arch("search", "query='q1 a'"), arch("search", "query='q2 b'")]]
    chat, *_ = run_seed002("mask:0", seed002_longer)  # K = 0 archives nothing, as in the release
    assert chat.sent == run_seed002("none", seed002_longer)[0].sent


def test_seed002_system_prompt_is_the_same_for_every_setting_and_never_mentions_masking():
    firsts = {spec: run_seed002(spec)[0].sent[0] for spec in ("none", "mask:1", "mask-obs:2", "refine:bm25:1")}
    assert all(sent == [SYS, TASK] for sent in firsts.values())
    text = SYS["content"].lower()
    for word in ("mask", "archiv", "replace", "placeholder", "omit", "older", "note", "hidden", "remove"):
        assert word not in text, word
    # the release's first paragraph and answer format, verbatim (utils/prompts.py DEVELOPER_CONTENT)
    assert SYS["content"].startswith("You are a deep research agent. You need to answer the given question by "
                                     "interacting with a search engine, using the search tool provided.")
    assert "Exact Answer: {{your succinct, final answer}}" in SYS["content"]


def test_page_pool_cursors_are_stable_and_reopen_after_masking():
    b = Browser(FixedSearch(), top_k=5)
    first = b.search("q1")
    assert b.search("q1") == first  # same pages, same cursors
    b.search("q2")
    assert [p.url for p in b.pool.pages] == ["u/a", "u/b", "u/c"]
    assert b.open("0").startswith("[0] A (u/a)\nL0: A\nL1: Alpha one.")
    assert b.open("u/c", 2) == "[2] C (u/c)\nL2: Answer is 42.\n(lines 2-2 of 3)"
    assert b.find("1", "zzz") == "No line of [1] contains 'zzz'."
    assert b.open("7").startswith("Error:")
    assert b.open("u/new").startswith("Error: could not open u/new")  # unknown URL: pooled, but unreadable
    assert b.pool.pages[-1].url == "u/new"


def test_bad_settings_are_refused():
    for bad in ("mask:x", "mask-turns:1", "mask-obs:", "ircot:z", "refine:bm25:2+refine:bm25:3", "whatever"):
        with pytest.raises(ValueError):
            parse_setting(bad)
    assert parse_setting("none").view is None and parse_setting("none").refine is None


def test_parse_tags():
    from attnprobe.generation.toolparse import parse_tags

    a = parse_tags("<think>a</think> <search> holmium </search><information>made up</information><answer>x</answer>")
    assert (a.thoughts, a.queries, a.answer) == (["a"], ["holmium"], None)
    assert a.text == "<think>a</think> <search> holmium </search>"  # cut after the query
    b = parse_tags("<think>b</think><answer> 67 </answer> and more")
    assert (b.queries, b.answer, b.text) == ([], "67", "<think>b</think><answer> 67 </answer>")
    c = parse_tags("<think>c</think><search>cut off by max tok")  # unclosed: no query (Search-R1)
    assert (c.queries, c.answer, c.text) == ([], None, "<think>c</think><search>cut off by max tok")
    assert parse_tags("<search> </search><answer>y</answer>").queries == []  # empty spans ignored
