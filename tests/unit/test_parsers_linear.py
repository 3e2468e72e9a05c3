"""The parsers of model text run in linear time (issue 27, "parsers are linear"): the lazy regexes they
replaced were quadratic on unclosed tags, unclosed parentheses and long whitespace runs (64 KB of
``<search>`` took 7 s in ``parse_tags``, 40 KB of spaces after ``<tool_call>`` 60 s). Each hostile input is
checked by how its cost grows from 1/16 of a megabyte to a megabyte (support/complexity.py: CPU time ratios
with a wide margin), never by a time limit (issue 38: a busy machine made those fail)."""

from __future__ import annotations

import pytest
from support.complexity import assert_linear

from attnprobe.generation.toolparse import parse_tags, parse_tool_calls
from attnprobe.trajectory.tags import closed

MB = 1_000_000
SMALL = MB // 16


@pytest.mark.parametrize("tag", ["<search>", "<answer>", "<information>", "<think>"])
def test_parse_tags_on_1mb_of_unclosed_tags_is_linear_and_finds_nothing(tag):
    def make(n):
        return ("<think>plan</think>" + (tag + "x ") * (n // (len(tag) + 2)),)

    assert_linear(parse_tags, make, SMALL, MB)
    (text,) = make(MB)
    act = parse_tags(text)
    assert (act.thoughts, act.queries, act.answer, act.text) == (["plan"], [], None, text.strip())


def test_parse_tags_keeps_the_closed_spans_before_a_megabyte_of_open_ones():
    assert_linear(parse_tags, lambda n: ("<search>a</search>" + "<search>" * (n // 8),), SMALL, MB)
    act = parse_tags("<search>a</search>" + "<search>" * (MB // 8))
    assert act.queries == ["a"] and act.text == "<search>a</search>"
    text = "<think>t</think>" + "<answer>" * (MB // 16) + "<answer>42</answer>"
    act = parse_tags(text)
    assert act.answer == "<answer>" * (MB // 16 - 1) + "<answer>42"  # the first open tag's span, as the regex


def test_closed_reads_as_the_lazy_regex():
    assert closed("<b>1</b> <b>2<b>3</b></b> <b>", "b") == ["1", "2<b>3"]
    assert closed("</b><b></b>", "b") == [""]


def test_tag_parse_time_grows_linearly():
    assert_linear(parse_tags, lambda n: ("<search>x " * (n // 10),), SMALL, MB)  # quadratic would be 256x


HOSTILE = {  # a megabyte-sized text of each kind from its size n
    "unclosed parentheses": lambda n: "f(" * (n // 2),
    "whitespace in an unclosed block": lambda n: "<tool_call>x" + " " * n + "x",
    "whitespace after a fence": lambda n: "```" + " " * n + "x",
    "open blocks": lambda n: "<tool_call>" * (n // 11),
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_parse_tool_calls_on_hostile_megabytes_is_linear(kind):
    text_of = HOSTILE[kind]
    assert_linear(parse_tool_calls, lambda n: (text_of(n), ["f"]), SMALL, MB)
    content, calls = parse_tool_calls(text_of(MB), ["f"])
    assert calls == []
    if kind == "unclosed parentheses":
        assert content == "f(" * (MB // 2)


def test_deeply_nested_brackets_are_text_not_a_recursion_error():
    content, calls = parse_tool_calls("[" * 20_000 + "]" * 20_000, None)
    assert calls == [] and content == "[" * 20_000 + "]" * 20_000


def test_tool_call_blocks_read_as_before():
    assert parse_tool_calls('x <tool_call>\n {"name": "f", "arguments": {"a": 1}} \n</tool_call> y', ["f"])[1][0] \
        .arguments == {"a": 1}
    content, calls = parse_tool_calls('think <tool_call> {"name": "f", "arguments": {"a": 2}}  \n', ["f"])
    assert (content, calls[0].name, calls[0].arguments) == ("think", "f", {"a": 2})
    content, calls = parse_tool_calls('so ```json\n{"name": "f", "parameters": {"q": "z"}}```', ["f"])
    assert (content, calls[0].arguments) == ("so", {"q": "z"})
    content, calls = parse_tool_calls('print(1) then f(q="a") and f(q="b")', ["f"])
    assert (content, calls[0].arguments) == ("print(1) then", {"q": "a"})


def test_unclosed_brackets_are_text_in_linear_time():
    for bracket, names in (("[", None), ("{", ["f"])):
        assert_linear(parse_tool_calls, lambda n, b=bracket, f=names: (b * n, f), 12_500, 200_000)
    assert parse_tool_calls("[" * 200_000, None) == ("[" * 200_000, [])
    assert parse_tool_calls("{" * 200_000, ["f"])[1] == []


def test_reasoning_chain_lines_parse_in_linear_time():
    from attnprobe.studies.runner.validation import parse_chain

    items = {"T": "task", "O1": "obs"}
    def make(n):
        return ("\n".join([" " * n + "x", "S1" + " " * n + "x", "S1: a (" + "T  " * n + "x",
                           "S2: b (T)" + " " * n + "x"]), items, "42")

    assert_linear(parse_chain, make, 1_250, 20_000)
    steps, parsed = parse_chain(*make(20_000))
    assert parsed
    assert [(s.label, s.claim[:8], s.cites) for s in steps] == [("S1", "a (T  T ", []), ("S2", "b (T)   ", [])]
    steps, _ = parse_chain("  - **S1**: Paris is in France (from: T, O1).  \nAnswer: Paris (S1 and T)", items, "x")
    assert [(s.label, s.claim, s.cites) for s in steps] == [("S1", "Paris is in France", ["T", "O1"]),
                                                           ("S2", "Paris", ["S1", "T"])]


def test_counterfactual_tag_actions_read_in_linear_time():
    from attnprobe.counterfactual.actions import classify_action

    def make(n):
        return ("<search>" * (n // 8) + "<answer>" * (n // 8) + "<answer> 42 </answer>", None, [])

    assert_linear(classify_action, make, SMALL, MB)
    action = classify_action(*make(MB))
    assert action == {"action": "<answer>", "kind": "tag", "arguments": {"answer": "<answer>" * (MB // 8) + " 42"}}
