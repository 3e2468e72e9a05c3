"""Issue 19 item 4: the next action read against the trajectory's own tools and tags, the change rate over
steps parseable on both sides, and the teacher-forced log-probability of the recorded step (against a
brute-force computation on the tiny random-weight SmolLM2: the bundled tokenizer and template, 4 layers;
support/tiny_model.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.messages import call

from attnprobe.counterfactual.actions import (
    change_rate,
    classify_action,
    classify_stored,
    compare_actions,
    logprob_block,
    recorded_logprob,
    step_span,
    tool_vocabulary,
)

TOOLS = [{"type": "function", "function": {"name": "web_search", "parameters": {}}},
         {"type": "function", "function": {"name": "final_answer", "parameters": {}}}]
HISTORY = [{"role": "assistant", "content": "x", "tool_calls": [call("c0", "find_in_page", pattern="born")]}]
VOCAB = tool_vocabulary(TOOLS, HISTORY)


def test_vocabulary_joins_declared_tools_and_history_calls():
    assert VOCAB == ["final_answer", "find_in_page", "web_search"]
    assert tool_vocabulary([{"name": "open"}], []) == ["open"]
    assert tool_vocabulary(None, [{"role": "user", "content": "hi"}]) == []


@pytest.mark.parametrize("text, calls, want", [
    ("", [call("c1", "find_in_page", pattern="1970")], ("find_in_page", "call", {"pattern": "1970"})),
    ("", [call("c1", "browse", url="u")], ("?browse", "unknown_tool", {"url": "u"})),
    ('I look. <tool_call>{"name": "find_in_page", "arguments": {"pattern": "son"}}</tool_call>', None,
     ("find_in_page", "call", {"pattern": "son"})),
    ('Next: web_search(query="Ulf von Euler")', None, ("web_search", "call", {"query": "Ulf von Euler"})),
    ("<think>hm</think><search> holmium discoverer </search>", None, ("<search>", "tag",
                                                                      {"search": "holmium discoverer"})),
    ("So <answer>1970</answer>", None, ("<answer>", "tag", {"answer": "1970"})),
    ("I will use find_in_page to look for the name.", None, ("unparseable", "unparseable", {})),  # prose
    ('{"name": "visit_page", "arguments": {"url": "x"}}', None, ("unparseable", "unparseable", {})),  # not its tool
])
def test_classify_action(text, calls, want):
    got = classify_action(text, calls, VOCAB)
    assert (got["action"], got["kind"], got["arguments"]) == want


def test_compare_and_change_rate_over_steps_parseable_on_both_sides():
    def act(text, c=None):
        return {"text": text, "call": c}

    same = compare_actions(act("<search>a</search>"), act("<search>b</search>"), VOCAB)
    assert same["parseable_both"] and same["changed"] is False and same["call_changed"] is True
    changed = compare_actions(act("", {"name": "web_search", "arguments": {"query": "q"}}),
                              act('find_in_page(pattern="x")'), VOCAB)
    assert changed["changed"] is True and changed["original"]["action"] == "web_search"
    one_side = compare_actions(act("prose"), act("<answer>1</answer>"), VOCAB)
    assert one_side["parseable_both"] is False and one_side["changed"] is None
    neither = compare_actions(act("prose"), act("more prose"), VOCAB)
    r = change_rate([same, changed, one_side, neither])
    assert (r["steps"], r["parseable_both"], r["changed"], r["rate"]) == (4, 2, 1, 0.5)
    assert r["ci"] == pytest.approx((0.0945, 0.9055), abs=1e-4)  # Wilson, 1 of 2
    empty = change_rate([neither])
    assert empty["parseable_both"] == 0 and np.isnan(empty["rate"])
    assert classify_stored({"text": "", "call": {"name": "final_answer", "arguments": "{\"a\": 1}"}},
                           VOCAB)["arguments"] == {"a": 1}
    block = logprob_block({"sum": -10.0, "mean": -2.0, "tokens": 5}, {"sum": -7.5, "mean": -1.5, "tokens": 5})
    assert block["diff_sum"] == 2.5 and block["diff_mean"] == 0.5


TINY = [
    {"role": "system", "content": "You are a search agent. Use the tools."},
    {"role": "user", "content": "Task: who named holmium?"},
    {"role": "assistant", "content": "I will search.", "tool_calls": [call("c0", "web_search", query="holmium")]},
    {"role": "tool", "tool_call_id": "c0", "content": "Holmium was named by Per Teodor Cleve in 1879."},
]
STEP = {"role": "assistant", "content": "Cleve named it; I will confirm the year.",
        "tool_calls": [call("c1", "web_search", query="Cleve holmium 1879")]}


def test_recorded_logprob_matches_a_brute_force_forward_per_token(tiny_smol):
    import torch

    smol = tiny_smol
    r, start, end, exact = step_span(smol, TINY, STEP)
    assert exact
    cont = r.text[int(r.offsets[start][0]):int(r.offsets[end - 1][1])]
    assert cont.startswith(STEP["content"]) and "Cleve holmium 1879" in cont
    assert "<|im_end|>" not in cont and r.text[int(r.offsets[end][0]):].startswith("<|im_end|>")
    got = recorded_logprob(smol, TINY, STEP)
    ids = [int(x) for x in r.input_ids]
    from attnprobe_hooks.transformers.prefill import cache_kw

    kw = cache_kw(smol.model)
    want = []
    with torch.inference_mode():
        # Token by token through the KV cache (another code path than the one full forward scored):
        # the prefix once, then each continuation token scored from the logits before it.
        out = smol.model(torch.tensor([ids[:start]]), use_cache=True)
        for p in range(start, end):
            logp = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
            want.append(float(logp[ids[p]]))
            cache = out["cache"] if "cache" in out.keys() else out.past_key_values
            out = smol.model(torch.tensor([[ids[p]]]), use_cache=True, **{kw: cache})
    assert got["tokens"] == end - start == len(want) > 10
    assert got["sum"] == pytest.approx(sum(want), abs=1e-4)
    assert got["mean"] == pytest.approx(np.mean(want), abs=1e-4)
    # A context with another observation changes the probability of the same recorded step.
    other = recorded_logprob(smol, TINY[:3] + [{**TINY[3], "content": "No results."}], STEP)
    assert other["tokens"] == got["tokens"] and other["sum"] != pytest.approx(got["sum"], abs=1e-3)
    json.dumps(logprob_block(got, other))  # JSON-ready


def test_change_rate_counts_both_changed_both_same_and_one_sided_steps():
    """Issue 26 item 9: a step parseable on one side only is no longer dropped silently: 2 both changed, 1 both
    same, 3 parseable in the original only, 1 in the counterfactual only, 1 neither (8 steps)."""
    def act(text, c=None):
        return {"text": text, "call": c}

    s, a, p = act("<search>a</search>"), act("<answer>1</answer>"), act("prose")
    blocks = [compare_actions(*pair, VOCAB) for pair in
              [(s, a), (a, s), (s, s), (s, p), (a, p), (s, p), (p, a), (p, p)]]
    r = change_rate(blocks)
    assert {k: r[k] for k in ("steps", "parseable_both", "both_changed", "both_same", "one_sided_original",
                              "one_sided_counterfactual", "one_sided", "neither", "parseable_any_side")} == {
        "steps": 8, "parseable_both": 3, "both_changed": 2, "both_same": 1, "one_sided_original": 3,
        "one_sided_counterfactual": 1, "one_sided": 4, "neither": 1, "parseable_any_side": 7}
    assert r["rate"] == pytest.approx(2 / 3) and r["rate_any_side"] == pytest.approx(6 / 7)
    from attnprobe.counterfactual.summary import _own_cell

    assert _own_cell(r) == ("2/3 of 8 (67% [21, 94]); both changed 2, both same 1, one-sided 4 (original only 3, "
                            "counterfactual only 1), neither 1")
