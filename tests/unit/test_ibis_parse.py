"""The next-action parser across tool-call syntaxes of the main template families and plain text."""

from __future__ import annotations

import pytest

from attnprobe.studies.ibis.behaviour import api_messages, classify_reply
from attnprobe.studies.ibis.framings import REMINDER, SYSTEM_PROMPT, IbisProtocol

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


# ------------------------------------------------------------------ primary (call-only) vs secondary (prose)
CALL_ONLY = [
    # calls in any syntax are the primary readout
    ('<tool_call>\n{"name": "web_search", "arguments": {"query": "x"}}\n</tool_call>', "web_search", "parsed"),
    ("Calling tools:\n[{'id': 'call_2', 'type': 'function', 'function': {'name': 'visit_page', "
     "'arguments': {'url': 'https://a.org'}}}]", "visit_page", "parsed"),
    ('{"name": "search", "arguments": {"query": "x"}}', "web_search", "parsed-alias"),
    # prose never counts there: a name mention, an intent phrase, a truncated call
    ("I should use web_search with another query.", "unparseable", "none"),
    ("None of these pages is about the element. I need a different query.", "unparseable", "none"),
    ('{"name": "visit_page", "arguments": {"url": "https://en.wiki', "unparseable", "none"),
    ("The final answer is 29.76 degrees.", "unparseable", "none"),
]


@pytest.mark.parametrize("text, decision, method", CALL_ONLY)
def test_call_only_readout(text, decision, method):
    from attnprobe.studies.ibis.behaviour import classify_call

    got = classify_call(text, None)
    assert (got["decision"], got["method"]) == (decision, method), got


def _item(label="should_research"):
    from attnprobe.studies.ibis.items import IbisItem

    return IbisItem(id="i1", task="melting point of gallium", query="gallium festival", label=label, domain="science",
                    results=[{"title": "Gallium Festival", "url": "https://galliumfest.example/", "snippet": "music"}])


def _backend(budget=None):
    from types import SimpleNamespace

    return SimpleNamespace(kind="transformers", name="m", no_call_tokens=budget)


def _out(text):
    return {"raw_text": text, "tool_calls": [], "prompt_text": "", "finish_reason": "stop", "input_tokens": 10,
            "output_tokens": 5, "rendering": "native"}


def test_records_carry_both_readouts_on_hand_written_replies():
    """A reply that only *says* it will search is correct in the secondary prose readout and wrong
    (unparseable) in the primary call-only one; a written call is correct in both."""
    from attnprobe.studies.ibis.behaviour import _record

    prose = _record(_backend(), _item(), "observer", _out("These are about a festival. I need a different query."),
                    0.1, 64, IbisProtocol("paper"))
    assert (prose["decision"], prose["method"], prose["correct"]) == ("unparseable", "none", False)
    assert (prose["decision_prose"], prose["method_prose"], prose["correct_prose"]) == ("web_search", "intent", True)
    assert prose["readout"] == "call" and prose["reminder"] == "listing"
    call = _record(_backend(), _item(), "agentic", _out('{"name": "web_search", "arguments": {"query": "Ga mp"}}'),
                   0.1, 64, IbisProtocol("paper"))
    assert call["correct"] and call["correct_prose"] and call["method"] == call["method_prose"] == "parsed"
    assert call["generation"] == {"max_new_tokens": 64, "decoding": "greedy", "protocol": "paper",
                                  "reminder": "listing", "no_call_tokens": None}
    # a budget below the limit is part of the settings; at or above it, it can never bite: recorded as off
    assert _record(_backend(16), _item(), "agentic", _out("x"), 0, 64, IbisProtocol("paper"))["generation"]["no_call_tokens"] == 16
    assert _record(_backend(64), _item(), "agentic", _out("x"), 0, 64, IbisProtocol("paper"))["generation"]["no_call_tokens"] is None


def test_old_records_are_split_into_both_readouts():
    """Records written before call-only parsing held the prose readout in ``decision``."""
    from attnprobe.studies.ibis.behaviour import readouts

    old_intent = {"decision": "web_search", "method": "intent", "correct": True, "expected": "web_search"}
    r = readouts(old_intent)
    assert (r["decision"], r["correct"], r["decision_prose"], r["correct_prose"]) == ("unparseable", False,
                                                                                      "web_search", True)
    old_call = {"decision": "visit_page", "method": "parsed", "correct": False, "expected": "web_search"}
    r = readouts(old_call)
    assert (r["decision"], r["method"], r["decision_prose"]) == ("visit_page", "parsed", "visit_page")
    old_filter = {"decision": "web_search", "method": "filter-no", "correct": True, "expected": "web_search"}
    assert readouts(old_filter)["decision"] == "web_search"


def test_resume_with_other_generation_settings_is_refused(tmp_path):
    """One line naming the folder and the setting that differs; the same settings pass."""
    import json

    from attnprobe.errors import AttnprobeError
    from attnprobe.studies.ibis.behaviour import _record, check_generation_settings, generation_settings

    rec = _record(_backend(), _item(), "agentic", _out("x"), 0.1, 64, IbisProtocol("paper"))
    (tmp_path / "decisions.jsonl").write_text(json.dumps(rec) + "\n")
    same = generation_settings(_backend(), max_new_tokens=64, protocol=IbisProtocol("paper"))
    check_generation_settings(tmp_path, same)  # no error
    with pytest.raises(AttnprobeError) as e:
        check_generation_settings(tmp_path, {**same, "max_new_tokens": 4096})
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg and "max_new_tokens=64" in msg and "max_new_tokens=4096" in msg
    with pytest.raises(AttnprobeError, match="reminder='listing', this run asks for reminder='identical'"):
        check_generation_settings(tmp_path, generation_settings(_backend(), max_new_tokens=64,
                                                                protocol=IbisProtocol("paper", "identical")))
    # a record from before the generation field, paper protocol: made with the old observer reminder
    old = {k: v for k, v in rec.items() if k not in ("generation", "readout", "reminder")}
    (tmp_path / "decisions.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(AttnprobeError, match="before the verbatim observer reminder"):
        check_generation_settings(tmp_path, same)
    check_generation_settings(tmp_path / "empty", same)  # a new folder: nothing to compare
