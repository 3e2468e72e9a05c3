"""The filter's answer protocol: "No" (+ optional query) or one/two result URLs, parsed against the
results it judged, and mapped to the worker action it stands for (No -> web_search, sites -> visit_page)."""

from __future__ import annotations

import json

import pytest

from attnprobe.agents.filter import (
    REMINDER_ISOLATED,
    FilterDecision,
    decide,
    filter_action,
    isolated_messages,
    parse_filter_reply,
)
from attnprobe.agents.search import SearchResult
from attnprobe.agents.tools import FILTER_TOOLS
from attnprobe.generation.chat import ChatReply

HO = "https://en.wikipedia.org/wiki/Holmium"
ST = "https://en.wikipedia.org/wiki/Stockholm"
CL = "https://en.wikipedia.org/wiki/Per_Teodor_Cleve"
RESULTS = [{"title": "Holmium", "url": HO, "snippet": "Holmium is named after Holmia."},
           {"title": "Stockholm", "url": ST, "snippet": "Stockholm is the capital of Sweden."},
           {"title": "Per Teodor Cleve", "url": CL, "snippet": "A Swedish chemist."}]


def p(text):
    return parse_filter_reply(text, RESULTS)


@pytest.mark.parametrize("text, query, method", [
    ("No", None, "no"),
    ("no.", None, "no"),
    ("None of the results is helpful.", None, "no"),
    ("No\nQuery: holmium name origin Holmia", "holmium name origin Holmia", "no+query"),
    ("Answer: No\nNew query: \"Holmia Latin element\"", "Holmia Latin element", "no+query"),
    ("No.\nholmium etymology", "holmium etymology", "no+query"),
    ("No, try: element named after Stockholm", "element named after Stockholm", "no+query"),
    ("**No**\n\nQuery: holmium", "holmium", "no+query"),
    ("The answer is:\nNo", None, "no"),  # a reply of the bundled model
    ("The answer is: No.", None, "no"),
])
def test_no_and_no_with_query(text, query, method):
    d = p(text)
    assert (d.relevant, d.parsed, d.chosen_urls, d.new_query, d.method) == (False, True, [], query, method)
    assert d.kind == "no" and filter_action(d) == "web_search"


@pytest.mark.parametrize("text, urls, method", [
    (HO, [HO], "url"),
    (f"{ST}\n{HO}", [ST, HO], "url"),  # in the order written
    (f"{ST}\n{HO}\n{CL}", [ST, HO], "url"),  # at most two
    (f"The most helpful is <{HO}/>.", [HO], "url"),  # brackets, trailing slash and dot
    ("http://www.en.wikipedia.org/wiki/Stockholm", [ST], "url"),  # scheme and www ignored
    (f"- {HO}\n- {HO}", [HO], "url"),  # duplicates once
    (f"1. [Holmium]({HO})", [HO], "url"),  # the search tool's own markdown
    ("2", [ST], "index"),
    ("Result 3", [CL], "index"),
    ("[1]\n[3]", [HO, CL], "index"),
    ("Per Teodor Cleve", [CL], "title"),
    ('The most helpful webpage is the one with the title "Stockholm".', [ST], "title"),
])
def test_sites(text, urls, method):
    d = p(text)
    assert (d.relevant, d.parsed, d.chosen_urls, d.new_query, d.method) == (True, True, urls, None, method)
    assert d.kind == "sites" and filter_action(d) == "visit_page"


def test_only_urls_among_the_results_are_chosen():
    d = p("https://example.com/holmium")
    assert (d.parsed, d.method, d.chosen_urls) == (False, "unknown_url", [])
    assert filter_action(d) == "unparseable" and d.relevant  # fail open
    d = p(f"https://example.com/holmium\n{CL}")
    assert d.chosen_urls == [CL] and d.parsed
    assert p("7").parsed is False  # no result 7


@pytest.mark.parametrize("text, expect", [
    (json.dumps({"name": "visit_page", "arguments": {"url": HO}}), ("sites", [HO], None)),
    (f'<tool_call>{{"name": "visit_page", "arguments": {{"url": "{ST}"}}}}</tool_call>', ("sites", [ST], None)),
    ('visit_page(url="2")', ("sites", [ST], None)),
    ('web_search("holmium Holmia origin")', ("no", [], "holmium Holmia origin")),
    (json.dumps({"name": "web_search", "arguments": {"query": "holmium"}}), ("no", [], "holmium")),
    (json.dumps({"name": "visit_page", "arguments": {"url": "https://example.com"}}), ("unparseable", [], None)),
])
def test_tool_call_replies(text, expect):
    d = p(text)
    assert (d.kind, d.chosen_urls, d.new_query) == expect
    assert d.method.startswith("tool_call")


@pytest.mark.parametrize("text, method", [
    ("", "empty"), ("   \n ", "empty"),
    ("I think these pages are interesting.", "unparseable"),
    ("Nobel Prize winners in chemistry", "unparseable"),  # "No" only as a whole word
    ("You should first consider whether these webpages are helpful", "unparseable"),
])
def test_garbage_is_unparseable(text, method):
    d = p(text)
    assert (d.parsed, d.relevant, d.method, d.kind) == (False, True, method, "unparseable")
    assert filter_action(d) == "unparseable"


def test_yes_without_a_site_keeps_results():
    d = p("Yes, they are helpful.")
    assert (d.parsed, d.relevant, d.chosen_urls, d.kind) == (True, True, [], "keep")
    assert filter_action(d) == "visit_page"


def test_search_result_objects_and_structured_calls():
    objs = [SearchResult(**r) for r in RESULTS]
    assert parse_filter_reply(f"{CL}", objs).chosen_urls == [CL]
    call = {"id": "x", "type": "function", "function": {"name": "visit_page", "arguments": json.dumps({"url": HO})}}
    assert decide(ChatReply(content="", tool_calls=[call]), RESULTS).chosen_urls == [HO]
    assert decide(ChatReply(content="No\nQuery: q2"), RESULTS).new_query == "q2"
    assert FilterDecision(relevant=False).to_dict()["kind"] == "no"


def test_isolated_prompt_holds_task_query_results_and_reminder_in_order():
    """IBIS direct mode locates these pieces in this order (attnprobe/studies/ibis/framings.py)."""
    msgs = isolated_messages("the task", "the query", "1. [T](u)\nsnippet")
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert user == ("Task: the task\n\nSearch query: the query\n\nSearch results:\n```\n1. [T](u)\nsnippet\n```\n\n"
                    + REMINDER_ISOLATED)
    assert "No" in msgs[0]["content"] and "URL" in msgs[0]["content"]
    assert [t["function"]["name"] for t in FILTER_TOOLS] == ["web_search", "visit_page"]
