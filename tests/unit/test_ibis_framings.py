"""Framing invariants on the rendered token sequences: only ownership changes (matched protocol), and the
paper protocol's appendix E layouts, token by token, on three template families."""

from __future__ import annotations

import copy

import pytest
from support.paths import ROOT  # noqa: E402

from attnprobe.render.rendering import render
from attnprobe.studies.ibis.framings import (
    CATEGORIES,
    FRAMINGS,
    INVARIANT_CATEGORIES,
    REMINDER,
    REMINDER_AGENTIC_PAPER,
    REMINDER_OBSERVER_PAPER,
    SYSTEM_PROMPT,
    IbisProtocol,
    build_framing,
    category_tokens,
    check_invariants,
    segment_categories,
)
from attnprobe.studies.ibis.items import load_items, results_text

ITEMS = load_items(ROOT / "trajectories" / "ibis_items.jsonl")

QWEN_LIKE = """{%- for message in messages %}
{%- if message.role == 'system' %}<|im_start|>system
{{ message.content }}{% if tools %}

# Tools
<tools>{% for t in tools %}
{{ t | tojson }}{% endfor %}
</tools>{% endif %}<|im_end|>
{% elif message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}{% for tc in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3_LIKE = """{{- bos_token }}{%- for message in messages %}<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}<|end_header_id|>

{% if message.tool_calls %}{% for tc in message.tool_calls %}{"name": "{{ tc.function.name }}", "parameters": {{ tc.function.arguments | tojson }}}{% endfor %}{% else %}{{ message.content }}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


@pytest.fixture(scope="module")
def tok(smol):
    return smol.tokenizer


@pytest.fixture(scope="module")
def templated(tok):
    """SmolLM2's tokenizer with Qwen- and Llama-3-style templates (their markers as special tokens)."""
    out = {}
    q = copy.deepcopy(tok)
    q.chat_template = QWEN_LIKE
    out["qwen"] = q
    ll = copy.deepcopy(tok)
    ll.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    ll.chat_template = LLAMA3_LIKE
    out["llama3"] = ll
    return out


def test_invariants_hold_for_every_shipped_item_on_smollm2(tok):
    modes = set()
    for it in ITEMS:
        res = check_invariants(tok, it, protocol="matched")
        assert res["ok"], (it.id, res["problems"])
        modes.add(tuple(sorted(res["rendering"].items())))
    # SmolLM2 drops tool calls: the agentic framing falls back to the smolagents text serialization
    assert modes == {(("agentic", "text"), ("direct", "native"), ("observer", "native"))}


@pytest.mark.parametrize("family", ["qwen", "llama3"])
def test_invariants_hold_with_native_tool_call_templates(templated, family):
    tk = templated[family]
    for it in ITEMS[::7]:
        res = check_invariants(tk, it, protocol="matched")
        assert res["ok"], (family, it.id, res["problems"])
        assert res["rendering"]["agentic"] == "native"


def test_token_level_identity_and_ownership(tok):
    it = ITEMS[0]
    toks, rendered = {}, {}
    for fr in FRAMINGS:
        traj = build_framing(it, fr, "matched")
        rendered[fr] = render(traj, tok, add_generation_prompt=True)
        toks[fr] = category_tokens(rendered[fr], traj)
    for cat in INVARIANT_CATEGORIES:
        assert toks["agentic"][cat] == toks["observer"][cat] == toks["direct"][cat], cat
    # the texts behind the invariant tokens are exactly the shared strings
    assert tok.decode(toks["observer"]["system"]) == SYSTEM_PROMPT
    assert tok.decode(toks["observer"]["reminder"]) == REMINDER
    assert tok.decode(toks["observer"]["results"]) == results_text(it)
    assert tok.decode(toks["observer"]["task"]) == " " + it.task
    # ownership: only the agentic framing has text authored by the model itself, and it is the call
    for fr, r in rendered.items():
        own = [s for s in r.segments if s.author == "self"]
        cats = segment_categories(r.segments, build_framing(it, fr, "matched"))
        q = [s for s, c in zip(r.segments, cats) if c == "query"]
        # the query is one segment of exactly the query's tokens in every framing (length-matched)
        assert len(q) == 1 and q[0].role == "tool_call" and tok.decode(r.input_ids[q[0].start:q[0].end]) == it.query
        if fr == "agentic":
            # own = the call split at its query argument: call text, the query, the rest of the call
            assert [s.role for s in own] == ["tool_call"] * 3 and q[0] == own[1] and q[0].author == "self"
            assert [c for s, c in zip(r.segments, cats) if s.author == "self"] == ["call", "query", "call"]
        else:
            assert not own and q[0].author == "external" and "call" not in cats
        # the decision position is the last token, inside the generation prompt
        assert r.decision.position == len(r.input_ids) - 1 and r.segments[-1].role == "template"


def test_every_token_gets_a_category(tok):
    it = ITEMS[5]
    for fr in FRAMINGS:
        traj = build_framing(it, fr, "matched")
        r = render(traj, tok, add_generation_prompt=True)
        cats = segment_categories(r.segments, traj)
        assert set(cats) <= set(CATEGORIES)
        assert sum(s.length for s in r.segments) == len(r.input_ids)
        assert {"query", "results", "reminder", "task", "system", "template"} <= set(cats)


def test_framings_are_valid_trajectories(tmp_path):
    from attnprobe.trajectory.schema import load_trajectories, save_trajectories

    for proto in ("paper", "matched"):
        trajs = [build_framing(it, fr, proto) for it in ITEMS[:3] for fr in FRAMINGS]
        save_trajectories(trajs, tmp_path / f"{proto}.jsonl")
        back = load_trajectories(tmp_path / f"{proto}.jsonl")
        assert [t.id for t in back] == [t.id for t in trajs] and back[0].framing == "agentic"
        assert [t.messages for t in back] == [t.messages for t in trajs]
    with pytest.raises(ValueError, match="framing must be one of"):
        build_framing(ITEMS[0], "masked")


def test_broken_invariant_is_detected(tok):
    """A template that glues the end of the results to its own marker changes the last token: caught."""
    glued = copy.deepcopy(tok)
    glued.chat_template = LLAMA3_LIKE  # markers NOT added as special tokens: '.<|' merges into one token
    res = check_invariants(glued, ITEMS[0], protocol="matched")
    assert not res["ok"] and any("results tokens differ" in p for p in res["problems"])


# ------------------------------------------------------------------ paper protocol (seed 001, appendix E)
@pytest.fixture(scope="module")
def families(tok, templated):
    return {"smollm2": tok, **templated}


@pytest.mark.parametrize("family", ["smollm2", "qwen", "llama3"])
def test_paper_layouts_token_by_token(families, family):
    tk = families[family]
    it = ITEMS[0]
    res_text = results_text(it)
    out = {}
    for fr in ("observer", "agentic", "direct"):
        traj = build_framing(it, fr, "paper")
        r = render(traj, tk, add_generation_prompt=True)
        cats = segment_categories(r.segments, traj)
        assert set(cats) <= set(CATEGORIES) and sum(s.length for s in r.segments) == len(r.input_ids)
        out[fr] = (traj, r, category_tokens(r, traj))
    # observer: one user message; no query anywhere in the prompt; fenced results; the observer reminder
    traj, r, toks = out["observer"]
    assert [m["role"] for m in traj.messages] == ["system", "user"]
    assert traj.messages[1]["content"] == (
        f"Task: {it.task}\nHere are some search results that may help you with this task:\n```\n{res_text}\n```\n"
        f"{REMINDER_OBSERVER_PAPER}")
    assert it.query not in r.text and not toks["query"]
    assert tk.decode(toks["results"]) == res_text and tk.decode(toks["reminder"]) == REMINDER_OBSERVER_PAPER
    # agentic: the Python-repr call as the model's own text, then one user message with the fenced
    # results and the agentic reminder
    traj, r, toks = out["agentic"]
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "user"]
    assert traj.messages[2]["content"] == ("Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': "
                                           "{'name': 'web_search', 'arguments': {'query': '" + it.query + "'}}}]")
    assert traj.messages[3]["content"] == f"Call id: call_1\nObservation:\n```\n{res_text}\n```\n{REMINDER_AGENTIC_PAPER}"
    assert tk.decode(toks["query"]).strip(" '") == it.query  # the own query tokens, labelled on their own
    own = [s for s in r.segments if s.author == "self"]
    assert own and all(s.role == "tool_call" for s in own)  # the whole call is the model's own action
    assert "Calling tools:" in tk.decode(toks["call"]) and tk.decode(toks["reminder"]) == REMINDER_AGENTIC_PAPER
    # direct: the runner's isolated filter prompt, with the query shown
    traj, r, toks = out["direct"]
    assert traj.messages[1]["content"].startswith(f"Task: {it.task}\n\nSearch query: {it.query}\n")
    assert tk.decode(toks["query"]).strip() == it.query
    # what must be identical is identical; the reminders differ as the paper's two listings do
    for a, b in (("observer", "agentic"), ("observer", "direct"), ("agentic", "direct")):
        assert out[a][2]["results"] == out[b][2]["results"] and out[a][2]["task"] == out[b][2]["task"], (a, b)
    assert out["observer"][2]["system"] == out["agentic"][2]["system"]
    assert REMINDER_OBSERVER_PAPER != REMINDER_AGENTIC_PAPER
    res = check_invariants(tk, it, protocol="paper")
    assert res["ok"], res["problems"]


def test_protocol_is_validated_and_recorded():
    with pytest.raises(ValueError, match="protocol must be one of"):
        build_framing(ITEMS[0], "observer", "other")
    assert build_framing(ITEMS[0], "observer").meta["ibis"]["protocol"] == "paper"
    assert CATEGORIES[-1] == "call"  # one category list for both protocols


# ------------------------------------------------------------------ the reminders, against the seed's text
def test_paper_reminders_are_the_seed_listings_verbatim():
    """Seed 001 appendix E prints one listing per mode; each mode's reminder is that listing's text,
    character for character (read from ../shared/seeds/001_*.txt, not from our constants)."""
    from support.seeds import appendix_e_listings, listing_reminder

    from attnprobe.studies.ibis.framings import paper_reminder

    listings = appendix_e_listings()
    assert paper_reminder("observer") == REMINDER_OBSERVER_PAPER == listing_reminder(listings["observer"])
    assert paper_reminder("agentic") == REMINDER_AGENTIC_PAPER == listing_reminder(listings["agentic"])
    assert "search with a different query" in REMINDER_OBSERVER_PAPER  # no "again" (issue 19, item 3)
    # the observer's wrapper sentence too
    assert "Here are some search results that may help you with this task:" in listings["observer"]
    it = ITEMS[0]
    for fr in ("observer", "agentic"):
        content = build_framing(it, fr, "paper").messages[-1]["content"]
        assert content.endswith("\n" + listing_reminder(listings[fr])), fr


def test_identical_reminder_option(tok):
    """reminder="identical" (the appendix prose: "an identical <system-reminder> is appended in both
    modes") appends the observer listing's text in both modes; the invariant check then compares it."""
    from support.seeds import appendix_e_listings, listing_reminder

    from attnprobe.studies.ibis.framings import resolve_reminder

    observer_text = listing_reminder(appendix_e_listings()["observer"])
    it = ITEMS[3]
    a = build_framing(it, "agentic", IbisProtocol("paper", "identical"))
    o = build_framing(it, "observer", IbisProtocol("paper", "identical"))
    assert a.messages[-1]["content"].endswith("\n" + observer_text)
    assert o.messages[-1]["content"].endswith("\n" + observer_text)
    assert a.meta["ibis"]["reminder"] == o.meta["ibis"]["reminder"] == "identical"
    assert build_framing(it, "agentic", "paper").meta["ibis"]["reminder"] == "listing"
    assert build_framing(it, "agentic", "matched").meta["ibis"]["reminder"] == "identical"
    res = check_invariants(tok, it, protocol=IbisProtocol("paper", "identical"))
    assert res["ok"] and res["reminder"] == "identical", res["problems"]
    # the reminder tokens are now identical between agentic and observer (and compared)
    ta = category_tokens(render(a, tok, add_generation_prompt=True), a)["reminder"]
    to = category_tokens(render(o, tok, add_generation_prompt=True), o)["reminder"]
    assert ta == to and tok.decode(ta) == observer_text
    assert resolve_reminder("paper", None) == "listing" and resolve_reminder("matched", None) == "identical"
    with pytest.raises(ValueError, match="paper protocol only"):
        IbisProtocol("matched", "listing")
    with pytest.raises(ValueError, match="reminder must be one of"):
        IbisProtocol("paper", "both")


@pytest.mark.parametrize("family", ["smollm2", "qwen", "llama3"])
def test_shifted_observer_puts_the_query_at_the_agentic_distance(tok, templated, family):
    """Issue 26 item 7: the position control's observer query is exactly as far from the decision token as
    the own query, every labelled token is the observer's, and only the filler was added."""
    from attnprobe.studies.ibis.position import SHIFTED, query_distance, shifted_observer

    tk = tok if family == "smollm2" else templated[family]
    for it in ITEMS[::9]:
        traj, pad = shifted_observer(it, tk)
        agentic, observer = build_framing(it, "agentic", "matched"), build_framing(it, "observer", "matched")
        r_s, r_a, r_o = (render(t, tk, add_generation_prompt=True) for t in (traj, agentic, observer))
        d_a, d_o = query_distance(r_a, agentic), query_distance(r_o, observer)
        assert query_distance(r_s, traj) == d_a and pad == d_a - d_o > 0  # one token per filler unit
        if family == "smollm2":
            assert (d_a, d_o, pad) == (d_a, d_a - 17, 17)  # the shipped report's constant offset
        assert traj.id == f"{it.id}/{SHIFTED}" and traj.meta["ibis"]["pad"] == pad
        ts, to = category_tokens(r_s, traj), category_tokens(r_o, observer)
        for cat in ("query", "results", "reminder", "task", "system"):
            assert ts[cat] == to[cat], cat
        assert len(r_s.input_ids) == len(r_o.input_ids) + pad
        assert tk.decode(ts["framing"]).count(" .") == pad


def test_pad_is_refused_outside_the_matched_observer():
    for fr, proto in (("agentic", "matched"), ("observer", "paper"), ("direct", "matched")):
        with pytest.raises(ValueError, match="pad applies to the matched observer"):
            build_framing(ITEMS[0], fr, proto, pad=3)
