"""The next-action parser across tool-call syntaxes of the main template families and plain text."""

from __future__ import annotations

import pytest

from attnprobe.studies.ibis.behaviour import api_messages, classify_reply
from attnprobe.studies.ibis.framings import REMINDER, SYSTEM_PROMPT

CASES = [
    # Qwen / Hermes
    ('<tool_call>\n{"name": "web_search", "arguments": {"query": "gallium melting point"}}\n</tool_call>',
     "web_search", "parsed"),
    # Llama 3 (JSON with "parameters") and Llama 3.1 python_tag
    ('{"name": "visit_page", "parameters": {"url": "https://en.wikipedia.org/wiki/Gallium"}}', "visit_page", "parsed"),
    ('<|python_tag|>{"name": "web_search", "parameters": {"query": "gallium"}}', "web_search", "parsed"),
    # smolagents text serialization (what the SmolLM2 fallback shows the model)
    ('Calling tools:\n[{"id": "call_2", "type": "function", "function": {"name": "visit_page", '
     '"arguments": {"url": "https://www.npl.co.uk/x"}}}]', "visit_page", "parsed"),
    # Mistral
    ('[TOOL_CALLS] [{"name": "web_search", "arguments": {"query": "carbon-14 half-life"}}]', "web_search", "parsed"),
    # fenced JSON, Action: style, Python-call style
    ('```json\n{"name": "visit_page", "arguments": {"url": "https://a.org"}}\n```', "visit_page", "parsed"),
    ('Action: {"name": "web_search", "arguments": {"query": "x"}}', "web_search", "parsed"),
    ('web_search(query="melting point of gallium")', "web_search", "parsed"),
    ('visit_page(url="https://en.wikipedia.org/wiki/Gallium")', "visit_page", "parsed"),
    # alias names
    ('{"name": "search", "arguments": {"query": "x"}}', "web_search", "parsed-alias"),
    ('{"name": "fetch_html", "arguments": {"url": "https://x.org"}}', "visit_page", "parsed-alias"),
    ('open_url(url="https://x.org")', "visit_page", "parsed-alias"),
    ('{"name": "final_answer", "arguments": {"answer": "29.76"}}', "answer", "parsed-alias"),
    # a truncated call still names its tool
    ('{"name": "visit_page", "arguments": {"url": "https://en.wiki', "visit_page", "name-mention"),
    # plain text
    ("None of these pages is about the element. I need a different query.", "web_search", "intent"),
    ("I will visit the first result page to read the details.", "visit_page", "intent"),
    ("The final answer is 29.76 degrees.", "answer", "intent"),
    # unparseable
    ("1. Gallium festival 2. Instagram", "unparseable", "none"),
    ("", "unparseable", "none"),
    ("I could search again or visit the page.", "unparseable", "none"),  # both intents: undecidable
]


@pytest.mark.parametrize("text, decision, method", CASES)
def test_classify(text, decision, method):
    got = classify_reply(text, None, prompt_text="")
    assert (got["decision"], got["method"]) == (decision, method), got


def test_structured_tool_calls_win():
    calls = [{"id": "c1", "type": "function", "function": {"name": "visit_page", "arguments": '{"url": "https://x"}'}}]
    got = classify_reply("some text mentioning web_search", calls)
    assert got["decision"] == "visit_page" and got["method"] == "tool_call" and got["arguments"] == {"url": "https://x"}


def test_echoed_reminder_is_not_a_decision():
    """Small models often parrot the reminder ("...search again with a different query"): not a choice."""
    prompt = SYSTEM_PROMPT + "\n" + REMINDER
    echo = ("You should first consider whether these webpages are helpful for completing the task based on the "
            "summaries. If they are not helpful, you need to search again with a different query.")
    assert classify_reply(echo, None, prompt)["decision"] == "unparseable"
    # without the prompt the same words would read as an intent to search
    assert classify_reply(echo, None, "")["decision"] == "web_search"


def test_api_messages_strip_attnprobe_keys():
    msgs = [{"role": "user", "content": "x", "annotations": [{"start": 0, "end": 1, "role": "task"}], "author": "x"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                                  "function": {"name": "a", "arguments": "{}"}}]}]
    out = api_messages(msgs)
    assert "annotations" not in out[0] and "author" not in out[0] and out[1]["content"] is None
