"""IRCoT variants on rounds (seed 004 §3.2; DESIGN.md §10): invalid turns never hide the latest documents.

A scripted agent replies from a fixed queue, so every message list the model is sent is written out by hand,
for each variant, with the invalid turn before the first search, between searches and after the last one.
Then the same rule on plain OpenAI messages (the counterfactual path) and with the NIS-Agent worker's
no-call hint, and Search-R1's final answer call.
"""

from __future__ import annotations

import pytest
from support.fixed_search import FixedSearch
from support.ircot import D1, D2, R1, R2, R3, A, Q, U, info
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.agents.policies import ircot, rounds
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.prompts import IRCOT_INVALID
from attnprobe.studies.loop.scoring import Scorer

BAD = "I am not sure."
FB = {"role": "user", "content": IRCOT_INVALID}


def strip(sent):
    """The messages as the model reads them (annotations are labels for capture, not text)."""
    return [[{k: v for k, v in m.items() if k != "annotations"} for m in msgs] for msgs in sent]


def run(spec, replies, **cfg):
    queue = list(replies)
    chat = ScriptedChat(lambda m, t: queue.pop(0))
    result, calls, history = run_question(chat, FixedSearch(), parse_setting(spec), LoopConfig("ircot", ircot_form="chat", **cfg), Q,
                                          run_id=f"run/{spec}", scorer=Scorer())
    return chat, result, calls, history


P0 = A("<think>p0</think>")  # turn 1 with its query removed (IRCoT-oq)

# (replies, {variant: the message lists sent at steps 3 and 4}); steps 1-2 are fixed by the replies
CASES = {
    "invalid-between-searches": ([R1, BAD, R2, R3], {
        "none": [[U, A(R1), info(D1), A(BAD), FB], [U, A(R1), info(D1), A(BAD), FB, A(R2), info(D2)]],
        # after the invalid turn the latest round is still q1's: its documents stay (the bug: they were dropped)
        "ircot:o": [[U, A(R1), info(D1), A(BAD), FB], [U, A(R1), A(BAD), FB, A(R2), info(D2)]],
        "ircot:oq": [[U, A(R1), info(D1), A(BAD), FB], [U, P0, A(BAD), FB, A(R2), info(D2)]],
        "ircot:oqp": [[U, A(R1), info(D1), A(BAD), FB], [U, A(R2), info(D2)]],
    }),
    "invalid-before-first-search": ([BAD, R1, R2, R3], {
        "none": [[U, A(BAD), FB, A(R1), info(D1)], [U, A(BAD), FB, A(R1), info(D1), A(R2), info(D2)]],
        "ircot:o": [[U, A(BAD), FB, A(R1), info(D1)], [U, A(BAD), FB, A(R1), A(R2), info(D2)]],
        "ircot:oq": [[U, A(BAD), FB, A(R1), info(D1)], [U, A(BAD), FB, P0, A(R2), info(D2)]],
        "ircot:oqp": [[U, A(R1), info(D1)], [U, A(R2), info(D2)]],
    }),
    "invalid-after-last-search": ([R1, R2, BAD, R3], {
        "none": [[U, A(R1), info(D1), A(R2), info(D2)], [U, A(R1), info(D1), A(R2), info(D2), A(BAD), FB]],
        "ircot:o": [[U, A(R1), A(R2), info(D2)], [U, A(R1), A(R2), info(D2), A(BAD), FB]],
        "ircot:oq": [[U, P0, A(R2), info(D2)], [U, P0, A(R2), info(D2), A(BAD), FB]],
        "ircot:oqp": [[U, A(R2), info(D2)], [U, A(R2), info(D2), A(BAD), FB]],
    }),
}
STEP2 = {"invalid-between-searches": [U, A(R1), info(D1)], "invalid-before-first-search": [U, A(BAD), FB],
         "invalid-after-last-search": [U, A(R1), info(D1)]}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec", ["none", "ircot:o", "ircot:oq", "ircot:oqp"])
def test_every_message_sent_with_an_invalid_turn(case, spec):
    replies, expected = CASES[case]
    chat, result, calls, history = run(spec, replies)
    assert strip(chat.sent) == [[U], STEP2[case]] + expected[spec]
    assert result["answer"] == "42" and result["correct"] is True and result["retrievals"] == 2
    assert result["model_calls"] == 4 and result["final_call"] is False


def test_the_repeated_search_of_the_old_rule_does_not_happen():
    """The review's reproduction: under the old "latest = last assistant message" rule, ircot:oqp sent
    neither q1 nor its documents after an invalid turn, so the agent repeated its first search."""
    chat, *_ = run("ircot:oqp", [R1, BAD, R2, R3])
    third = strip(chat.sent)[2]
    assert any("<search>q1 first</search>" in m["content"] for m in third)
    assert any(D1 in m["content"] for m in third)


# ------------------------------------------------------------------ the rule on plain OpenAI messages
SYS = {"role": "system", "content": "You are a search worker."}
TASK = {"role": "user", "content": "find X"}
HINT = {"role": "user", "content": "Your reply had no tool call. Call a tool."}  # the NIS-Agent worker's shape


def call_turn(*ids, text="thinking"):
    return {"role": "assistant", "content": text, "tool_calls": [tool_call(c, "web_search", query=c) for c in ids]}


def obs(cid, text):
    return {"role": "tool", "tool_call_id": cid, "content": text}


# two parallel calls, an invalid turn and its hint, a call with no text, another invalid turn and hint
NIS = [SYS, TASK, call_turn("c1", "c1b"), obs("c1", "one"), obs("c1b", "one-b"),
       A("no call here"), HINT, call_turn("c2", text=""), obs("c2", "two"), A("still no call"), HINT]


def test_rounds_of_a_worker_history_with_no_call_hints():
    r = rounds(NIS)
    assert (r.task, r.latest, r.latest_obs, r.after) == ([0, 1], 7, [8], [9, 10])
    assert rounds([SYS, TASK, A("x"), HINT]) == type(r)([0, 1], None, [], [2, 3])


@pytest.mark.parametrize("variant,kept,changes", [
    ("o", [0, 1, 2, 5, 6, 7, 8, 9, 10], {3: "removed", 4: "removed"}),
    # turn 7 has no text: under oq only the latest query is kept, and it is the latest, so it stays
    ("oq", [0, 1, 2, 5, 6, 7, 8, 9, 10], {2: "calls_removed", 3: "removed", 4: "removed"}),
    ("oqp", [0, 1, 7, 8, 9, 10], {2: "removed", 3: "removed", 4: "removed", 5: "removed", 6: "removed"}),
])
def test_variants_on_a_worker_history(variant, kept, changes):
    cf = ircot(variant)(NIS)
    assert cf.source == kept
    assert {i: s for i, s in cf.changes.items() if s != "kept"} == changes
    if variant == "oq":
        assert "tool_calls" not in cf.messages[2] and cf.messages[2]["content"] == "thinking"
    # the latest observation survives the no-call hints after it in every variant
    assert any(m.get("content") == "two" for m in cf.messages)


def test_no_round_yet_changes_nothing():
    for v in ("o", "oq", "oqp"):
        assert not ircot(v)([SYS, TASK, A("x"), HINT]).changed


# ------------------------------------------------------------------ Search-R1's final answer call
def test_final_answer_call_after_max_turns():
    chat, result, calls, history = run("ircot:o", [R1, R2, R3], max_turns=2)
    assert strip(chat.sent) == [[U], [U, A(R1), info(D1)], [U, A(R1), A(R2), info(D2)]]
    assert result["answer"] == "42" and result["correct"] is True
    assert result["model_calls"] == 3 and result["retrievals"] == 2 and result["final_call"] is True
    assert calls[-1]["meta"]["final_call"] is True and "final_call" not in calls[0]["meta"]
    assert history["messages"][-1] == A(R3)


def test_a_search_in_the_final_call_is_not_run():
    chat, result, calls, history = run("none", [R1, R2], max_turns=1)
    assert result["retrievals"] == 1 and result["final_searches"] == 1 and result["model_calls"] == 2
    assert result["answer"] is None and result["correct"] is False
    assert [m["role"] for m in history["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_final_call_can_be_turned_off():
    chat, result, *_ = run("none", [R1], max_turns=1, final_call=False)
    assert result["model_calls"] == 1 and result["answer"] is None and result["final_call"] is False
