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
    # the paper's own call format (seed 001 appendix E): a Python-repr list, not JSON
    ("Calling tools:\n[{'id': 'call_2', 'type': 'function', 'function': {'name': 'visit_page', "
     "'arguments': {'url': 'https://a.org/it\\'s'}}}]", "visit_page", "parsed"),
    ("[{'function': {'name': 'web_search', 'arguments': {'query': 'gallium melting point'}}}]", "web_search",
     "parsed"),
    # negation: a tool named only under a negation is no decision; the affirmed one wins
    ("I should not use visit_page.", "unparseable", "negated"),
    ("There is no need to call web_search here", "unparseable", "negated"),
    ("I won't use visit_page; web_search with a better query is needed.", "web_search", "name-mention"),
    ("Instead of web_search, I will use visit_page.", "visit_page", "name-mention"),
    ("I will not search again with a new query.", "unparseable", "negated"),
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


def test_direct_mode_is_read_as_the_filter_module():
    """Paper protocol, direct framing = the NIS-Agent filter prompt: "No" (+ query) -> web_search,
    1-2 of the results' sites (URL or number) -> visit_page, a site not among the results or prose ->
    unparseable (seed 000 B.1)."""
    from attnprobe.resources import data_path
    from attnprobe.studies.ibis.behaviour import classify_filter_reply
    from attnprobe.studies.ibis.framings import build_framing
    from attnprobe.studies.ibis.items import load_items

    it = load_items(data_path("ibis_items.jsonl"))[0]
    urls = [r["url"] for r in it.results]

    def dec(text):
        return classify_filter_reply(it, {"tool_calls": [], "raw_text": text})

    assert dec("No\nQuery: gallium melting point")["decision"] == "web_search"
    assert dec("No")["arguments"] == {"chosen_urls": [], "new_query": None}
    d = dec(f"{urls[2]}\n{urls[0]}")
    assert d["decision"] == "visit_page" and d["arguments"]["chosen_urls"] == [urls[2], urls[0]]
    assert dec("2")["arguments"]["chosen_urls"] == [urls[1]]
    assert dec("https://not-a-result.example/x")["decision"] == "unparseable"
    assert dec("The melting point of gallium is 29.76 C.")["decision"] == "unparseable"
    # the framing is the runner's filter call: same prompt, and no tools offered
    traj = build_framing(it, "direct", "paper")
    assert traj.tools == [] and "answer No" in traj.messages[1]["content"]
