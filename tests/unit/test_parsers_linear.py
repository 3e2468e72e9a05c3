"""The parsers of model text run in linear time (issue 27, "parsers are linear"): the lazy regexes they
replaced were quadratic on unclosed tags, unclosed parentheses and long whitespace runs (64 KB of
``<search>`` took 7 s in ``parse_tags``, 40 KB of spaces after ``<tool_call>`` 60 s)."""

from __future__ import annotations

import time

import pytest

from attnprobe.generation.toolparse import parse_tags, parse_tool_calls
from attnprobe.trajectory.tags import closed

MB = 1_000_000


def _timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


@pytest.mark.parametrize("tag", ["<search>", "<answer>", "<information>", "<think>"])
def test_parse_tags_on_1mb_of_unclosed_tags_is_fast_and_finds_nothing(tag):
    text = "<think>plan</think>" + (tag + "x ") * (MB // (len(tag) + 2))
    act, seconds = _timed(parse_tags, text)
    assert seconds < 1.0
    assert (act.thoughts, act.queries, act.answer, act.text) == (["plan"], [], None, text.strip())


def test_parse_tags_keeps_the_closed_spans_before_a_megabyte_of_open_ones():
    text = "<search>a</search>" + "<search>" * (MB // 8)
    act, seconds = _timed(parse_tags, text)
    assert seconds < 1.0 and act.queries == ["a"] and act.text == "<search>a</search>"
    text = "<think>t</think>" + "<answer>" * (MB // 16) + "<answer>42</answer>"
    act, _ = _timed(parse_tags, text)
    assert act.answer == "<answer>" * (MB // 16 - 1) + "<answer>42"  # the first open tag's span, as the regex


def test_closed_reads_as_the_lazy_regex():
    assert closed("<b>1</b> <b>2<b>3</b></b> <b>", "b") == ["1", "2<b>3"]
    assert closed("</b><b></b>", "b") == [""]


def test_tag_parse_time_grows_linearly():
    small, large = ("<search>x " * (n // 10) for n in (100_000, MB))
    t_small = min(_timed(parse_tags, small)[1] for _ in range(3))
    t_large = min(_timed(parse_tags, large)[1] for _ in range(3))
    assert t_large < 30 * max(t_small, 1e-4)  # quadratic would be 100x


@pytest.mark.parametrize("text,expected", [
    ("f(" * (MB // 2), ("f(" * (MB // 2), [])),  # unclosed parentheses
    ("<tool_call>x" + " " * MB + "x", None),  # a whitespace run inside an unclosed block
    ("```" + " " * MB + "x", None),
    ("<tool_call>" * (MB // 11), None),
])
def test_parse_tool_calls_on_hostile_megabytes_is_fast(text, expected):
    (content, calls), seconds = _timed(parse_tool_calls, text, ["f"])
    assert seconds < 1.5 and calls == []
    if expected:
        assert (content, calls) == expected


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
    (content, calls), seconds = _timed(parse_tool_calls, "[" * 200_000, None)
    assert seconds < 1.5 and (content, calls) == ("[" * 200_000, [])
    (content, calls), seconds = _timed(parse_tool_calls, "{" * 200_000, ["f"])
    assert seconds < 1.5 and calls == []


def test_reasoning_chain_lines_parse_in_linear_time():
    from attnprobe.studies.runner.validation import parse_chain

    items = {"T": "task", "O1": "obs"}
    hostile = "\n".join([" " * 20_000 + "x", "S1" + " " * 20_000 + "x", "S1: a (" + "T  " * 20_000 + "x",
                         "S2: b (T)" + " " * 20_000 + "x"])
    (steps, parsed), seconds = _timed(parse_chain, hostile, items, "42")
    assert seconds < 1.0 and parsed
    assert [(s.label, s.claim[:8], s.cites) for s in steps] == [("S1", "a (T  T ", []), ("S2", "b (T)   ", [])]
    steps, _ = parse_chain("  - **S1**: Paris is in France (from: T, O1).  \nAnswer: Paris (S1 and T)", items, "x")
    assert [(s.label, s.claim, s.cites) for s in steps] == [("S1", "Paris is in France", ["T", "O1"]),
                                                           ("S2", "Paris", ["S1", "T"])]


def test_counterfactual_tag_actions_read_in_linear_time():
    from attnprobe.counterfactual.actions import classify_action

    text = "<search>" * (MB // 8) + "<answer>" * (MB // 8) + "<answer> 42 </answer>"
    action, seconds = _timed(classify_action, text, None, [])
    assert seconds < 1.0
    assert action == {"action": "<answer>", "kind": "tag", "arguments": {"answer": "<answer>" * (MB // 8) + " 42"}}
