"""Context policies on a hand-built trajectory: exact resulting messages and status per original message."""

from __future__ import annotations

import json

import pytest
from support.messages import call

from attnprobe.agents.policies import (
    DEFAULT_PLACEHOLDER,
    apply_edits,
    compose,
    default_is_error,
    ircot,
    make_policy,
    mask_observations,
    parse_policy,
    refine_latest,
)
from attnprobe.agents.refiners import bm25_refiner, chat_refiner, split_sentences

SYS = {"role": "system", "content": "You are a search agent."}
TASK = {"role": "user", "content": "Task: who named holmium?"}
MSGS = [
    SYS, TASK,
    {"role": "assistant", "content": "Search first.", "tool_calls": [call("c0", "web_search", query="holmium")]},  # 2
    {"role": "tool", "tool_call_id": "c0", "content": "1. Holmium page. Named by Cleve.\n2. Unrelated."},  # 3
    {"role": "assistant", "content": "Open it.", "tool_calls": [call("c1", "visit_page", url="https://h.org")]},  # 4
    {"role": "tool", "tool_call_id": "c1", "content": "Error: timeout after 30 s"},  # 5
    {"role": "assistant", "content": "", "tool_calls": [call("c2", "web_search", query="Cleve chemist")]},  # 6
    {"role": "tool", "tool_call_id": "c2", "content": "Per Teodor Cleve was a Swedish chemist."},  # 7
    {"role": "assistant", "content": "Two checks.",
     "tool_calls": [call("c3", "web_search", query="Cleve holmium 1879"),
                    call("c4", "web_search", query="Holmia Stockholm")]},  # 8
    {"role": "tool", "tool_call_id": "c3", "content": "Cleve named holmium in 1879. It is a rare earth."},  # 9
    {"role": "tool", "tool_call_id": "c4", "content": "Holmia is the Latin name of Stockholm."},  # 10
]


def placeholder(name, **args):
    return DEFAULT_PLACEHOLDER.format(name=name, arguments=json.dumps(args))


def test_mask_keeps_last_k_and_errors_with_tool_name_and_arguments():
    cf = mask_observations(2)(MSGS)
    # Observations 3, 5, 7, 9, 10: the last two (9, 10) stay, 5 is an error, 3 and 7 are masked.
    assert cf.changes == {0: "kept", 1: "kept", 2: "kept", 3: "placeholder", 4: "kept", 5: "kept", 6: "kept",
                          7: "placeholder", 8: "kept", 9: "kept", 10: "kept"}
    assert cf.source == list(range(11))
    assert cf.messages[3] == {"role": "tool", "tool_call_id": "c0", "content": placeholder("web_search", query="holmium")}
    assert cf.messages[7]["content"] == placeholder("web_search", query="Cleve chemist")
    assert "web_search" in cf.messages[7]["content"] and "Cleve chemist" in cf.messages[7]["content"]
    assert cf.messages[5] == MSGS[5]  # the error observation is exempt
    assert [m for i, m in enumerate(cf.messages) if i not in (3, 7)] == [m for i, m in enumerate(MSGS) if i not in (3, 7)]
    assert MSGS[3]["content"].startswith("1. Holmium")  # input untouched


def test_mask_options():
    cf = mask_observations(2, keep_errors=False, placeholder="<{name} {tool_call_id} {lines} lines>")(MSGS)
    assert cf.indices("placeholder") == [3, 5, 7]
    assert cf.messages[3]["content"] == "<web_search c0 2 lines>"
    assert mask_observations(5)(MSGS).changed is False  # 5 observations, all kept
    assert mask_observations(0)(MSGS).indices("placeholder") == [3, 7, 9, 10]
    with pytest.raises(ValueError):
        mask_observations(-1)


def test_default_is_error():
    assert default_is_error({"role": "tool", "content": "Error: 404"})
    assert default_is_error({"role": "tool", "content": "fine", "is_error": True})
    assert not default_is_error({"role": "tool", "content": "No errors were found on the page."})


def test_ircot_o_drops_earlier_observations_only():
    cf = ircot("o")(MSGS)
    assert cf.indices("removed") == [3, 5, 7]
    assert cf.source == [0, 1, 2, 4, 6, 8, 9, 10]
    assert cf.messages == [MSGS[i] for i in cf.source]


def test_ircot_oq_drops_earlier_queries_keeps_thoughts():
    cf = ircot("oq")(MSGS)
    assert cf.changes[2] == "calls_removed" and cf.changes[4] == "calls_removed"
    assert cf.changes[6] == "removed"  # a tool-call-only message has nothing left
    assert cf.source == [0, 1, 2, 4, 8, 9, 10]
    assert cf.messages[2] == {"role": "assistant", "content": "Search first."}
    assert cf.messages[3] == {"role": "assistant", "content": "Open it."}
    assert cf.messages[4:] == MSGS[8:]


def test_ircot_oqp_keeps_only_latest_turn():
    cf = ircot("oqp")(MSGS)
    assert cf.source == [0, 1, 8, 9, 10]
    assert cf.messages == [SYS, TASK, *MSGS[8:]]
    assert cf.indices("kept") == [0, 1, 8, 9, 10]
    with pytest.raises(ValueError):
        ircot("x")


def test_policies_never_touch_system_and_task():
    for p in (mask_observations(0), ircot("oqp"), refine_latest(lambda q, d: "x")):
        cf = p(MSGS)
        assert cf.changes[0] == cf.changes[1] == "kept"
        assert cf.messages[:2] == [SYS, TASK]


def test_refine_latest_uses_the_query_of_each_latest_call():
    seen = []

    def refiner(query, doc):
        seen.append((query, doc))
        return doc.split(".")[0] + "."

    cf = refine_latest(refiner)(MSGS)
    assert seen == [("Cleve holmium 1879", MSGS[9]["content"]), ("Holmia Stockholm", MSGS[10]["content"])]
    assert cf.changes[9] == "refined" and cf.changes[10] == "kept"  # 10 has one sentence: unchanged
    assert cf.messages[9] == {"role": "tool", "tool_call_id": "c3", "content": "Cleve named holmium in 1879."}


def test_bm25_refiner_is_extractive_and_deterministic():
    doc = ("1. [Holmium | Archive](https://a.org) Holmium was named by Per Teodor Cleve. It melts at 1474 C.\n"
           "2. [Oslo trams](https://b.org) Trams run every ten minutes.\n"
           "3. [Stockholm](https://c.org) Holmia is the Latin name of Stockholm.")
    r = bm25_refiner(2)
    out = r("who named holmium Stockholm", doc)
    assert out == ("1. [Holmium | Archive](https://a.org) Holmium was named by Per Teodor Cleve.\n"
                   "3. [Stockholm](https://c.org) Holmia is the Latin name of Stockholm.")
    assert r("who named holmium Stockholm", doc) == out
    assert r("zzzz", doc) == "\n".join(split_sentences(doc)[:2])  # no known word: first sentences
    assert bm25_refiner(10)("q", doc) == "\n".join(split_sentences(doc))


def test_chat_refiner_sends_query_and_document():
    class Reply:
        content, raw_text = " kept text ", ""

    class Chat:
        def complete(self, messages, max_new_tokens=0):
            self.messages = messages
            return Reply()

    chat = Chat()
    assert chat_refiner(chat)("q1", "doc body") == "kept text"
    assert "Search query: q1" in chat.messages[0]["content"] and "doc body" in chat.messages[0]["content"]


def test_user_policy_and_compose():
    drop_first_obs = make_policy("drop3", lambda msgs: {3: ("removed", None)})
    cf = compose(drop_first_obs, mask_observations(1))(MSGS)
    # after dropping 3, observations 5 (error), 7, 9, 10 remain; keep the last one: 7 and 9 masked
    assert cf.changes == {0: "kept", 1: "kept", 2: "kept", 3: "removed", 4: "kept", 5: "kept", 6: "kept",
                          7: "placeholder", 8: "kept", 9: "placeholder", 10: "kept"}
    assert cf.source == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert compose(drop_first_obs, ircot("o")).name == "drop3+ircot:o"
    with pytest.raises(ValueError, match="unknown status"):
        apply_edits(MSGS, {3: ("gone", None)})


def test_parse_policy_names():
    assert parse_policy("mask:5").name == "mask:5"
    assert parse_policy("ircot:oqp").name == "ircot:oqp"
    assert parse_policy("refine:bm25").name == "refine:bm25:3"
    assert parse_policy("refine:bm25:2").name == "refine:bm25:2"
    for bad in ("mask:x", "drop", "ircot:z", "refine:foo"):
        with pytest.raises(ValueError):
            parse_policy(bad)
