"""The caveat "N of M replies were not valid actions" (issue 37), from hand-built recorded calls of each
scaffold and form: what the agent's own parser made of each reply."""

from __future__ import annotations

import pytest

from attnprobe.results.caveats import attention_caveats, invalid_actions, study_caveats
from attnprobe.studies.loop.validity import invalid_actions as count
from attnprobe.studies.loop.validity import valid_action


def stream(raw, final=False):
    meta = {"runner": "loop-ircot", "stream": {"prompt_tokens": 10}, "raw_text": raw, **({"final_call": True}
                                                                                          if final else {})}
    return {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Q" + raw}], "meta": meta}


def chat(content, final=False):
    return {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": content}],
            "meta": {"runner": "loop-ircot", "raw_text": content, **({"final_call": True} if final else {})}}


def seed002(content="", calls=None):
    reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return {"messages": [{"role": "user", "content": "Q"}, reply], "meta": {"runner": "loop-seed002"}}


def call(name, **extra):
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}, **extra}


@pytest.mark.parametrize(("rec", "valid"), [
    (stream("<think>x</think>\n<search> Humber Bridge </search>"), True),
    (stream("<think>x</think>\n<answer> 1981 </answer>"), True),
    (stream("<think>x</think>\n<search> Humber Bridge </search>", final=True), False),  # not run at the final call
    (stream("<think>x</think>\n<answer> 1981 </answer>", final=True), True),
    (stream("<think>the bridge opened in"), False),                                     # cut before an action
    (stream("<search></search>"), True),                                                # Search-R1: an empty search
    (chat("<think>x</think> <search>Humber Bridge</search>"), True),
    (chat("<think>x</think> <answer>1981</answer>"), True),
    (chat("I think it opened in 1981."), False),
    (chat("(empty reply)"), False),
    (chat("<search>q</search>", final=True), False),
    (seed002(calls=[call("search")]), True),
    (seed002(calls=[call("search"), call("open")]), True),
    (seed002(calls=[call("search", raw_arguments="query=x")]), False),   # arguments that were no JSON object
    (seed002(calls=[call("browse")]), False),                            # no such tool
    (seed002("Explanation: x\nExact Answer: 1981"), True),               # the final answer
    (seed002("(empty reply)"), False),
])
def test_valid_action_per_scaffold(rec, valid):
    assert valid_action(rec) is valid


def test_counts_and_the_caveat_in_every_output():
    counts = count({"none": [stream("<search> a </search>"), stream("<think>x")],
                    "mask:1": [stream("<think>y"), stream("<think>z"), stream("<answer> b </answer>")]})
    assert counts == {"replies": 5, "invalid": 3, "settings": {"none": [1, 2], "mask:1": [2, 3]}}
    text = ("3 of 5 replies were not valid actions (no search or answer the scaffold could act on; at the final "
            "call only an answer counts): none 1 of 2, mask:1 2 of 3")
    assert invalid_actions(counts) == [text]
    assert invalid_actions({"replies": 5, "invalid": 0, "settings": {}}) == [] and invalid_actions(None) == []
    study = {"settings": {"none": {"questions": 12, "art": 1.0}}, "baseline": "none", "invalid_actions": counts}
    assert text in study_caveats(study)
    assert text in attention_caveats({"settings": {}, "invalid_actions": counts})  # attention.md copies the count


def test_observations_that_held_a_passage():
    from attnprobe.results.caveats import observations_with_passage, passage_line

    hist = [{"messages": [{"role": "user", "content": "Q"},
                          {"role": "tool", "content": "Doc 1(Title: Humber Bridge) It opened in 1981.\n"},
                          {"role": "tool", "content": ""},                          # an empty <information> block
                          {"role": "tool", "content": "No results for 'query'."},   # seed 002's empty search
                          {"role": "tool", "content": "Error: no such page"}]},
            {"messages": [{"role": "tool", "content": "Doc 1(Title: Hafnium) atomic number 72"}]}]
    got = observations_with_passage(hist)
    assert got == {"with_passage": 2, "observations": 5}
    line = passage_line({"none": got, "mask:1": {"with_passage": 0, "observations": 0}})
    assert line[0] == ("Observations that held a passage (of those retrieved, before any policy edited them): "
                       "none 2 of 5 (40%), mask:1 0 of 0.")


def test_a_baseline_whose_observations_held_no_passage_says_so():
    from attnprobe.results.caveats import empty_observations

    obs = {"none": {"with_passage": 0, "observations": 3}, "mask:1": {"with_passage": 0, "observations": 3},
           "ircot:oq": {"with_passage": 2, "observations": 3}}
    text = ("setting none retrieved no passage: none of its 3 observations held one (empty results), so its "
            "past-observation attention is attention to empty result markup, not to retrieved text")
    assert empty_observations(obs, "none") == [text]  # mask:1 is retrieved_nothing's (from its calls)
    assert empty_observations({"none": {"with_passage": 1, "observations": 3}}, "none") == []
    assert empty_observations({"none": {"with_passage": 0, "observations": 0}}, "none") == []  # never searched
    study = {"settings": {"none": {"questions": 12, "art": 0.25}}, "baseline": "none", "observations": obs}
    assert text in study_caveats(study)
    assert text in attention_caveats({"settings": {}, "baseline": "none", "observations": obs})
