"""One meaning of "decision" (DESIGN.md §10, issue 26 item 2): the last token before the model's reply.

For every recorded call of a scripted-agent study (seed002 scaffold, with a tool-call-only reply among them)
the decision that capture queries is the reasoning start - 1 (the action start - 1 for a tool-call-only
reply), and it is the counterfactual's decision of the same step; a trajectory that awaits the model's turn
decides at its last token (the generation prompt's)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support.chat_templates import template_tokenizers
from support.fixed_search import FixedSearch
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.capture.api import select_queries
from attnprobe.counterfactual.contexts import build_context
from attnprobe.render.rendering import render
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.trajectory.schema import Trajectory

Q = {"id": "q1", "question": "Who discovered holmium?", "answers": ["Per Teodor Cleve"]}


def script(messages, tools):
    """Reasoning + search, a tool-call-only search, reasoning + search, then the answer (4 calls)."""
    turns = sum(m["role"] == "assistant" for m in messages)
    if turns == 1:
        return "", [tool_call("c1", "search", query="q2 Cleve")]
    if turns >= 3:
        return "Explanation: known.\nExact Answer: Per Teodor Cleve\nConfidence: 90%"
    return f"<think>Step {turns}: search.</think>", [tool_call(f"c{turns}", "search", query="q1 holmium")]


@pytest.fixture(scope="module")
def calls():
    """The recorded calls (as ``study interference`` writes them to calls.jsonl) per setting."""
    out = {}
    for spec in ("none", "mask:1"):
        _, recs, _ = run_question(ScriptedChat(script), FixedSearch(), parse_setting(spec),
                                  LoopConfig("seed002", max_turns=6, top_k=1), Q, run_id=f"run/{spec}", scorer=Scorer())
        out[spec] = [Trajectory.from_dict(r) for r in recs]
    return out


@pytest.fixture(scope="module")
def tokenizers(smol):
    return template_tokenizers(smol.tokenizer)


@pytest.mark.parametrize("family", ["smollm2", "llama3", "qwen"])
def test_every_recorded_call_decides_just_before_its_reply(calls, tokenizers, family):
    kinds = []
    for setting, trajs in calls.items():
        assert len(trajs) == 4
        for t in trajs:
            r = render(t, tokenizers[family])
            reply = len(t.messages) - 1
            start = next(q for q in r.queries_reasoning if q.message_index == reply)
            kinds.append(start.kind)
            if start.kind == "reasoning":  # item 2's check: the reasoning start - 1, or before the template's
                # own markup that opens reasoning_content (the Qwen stand-in's "<think>\n", issue 26 item 2)
                gap = r.text[int(r.offsets[r.decision.position][1]):int(r.offsets[start.position][0])]
                thinks = family == "qwen" and "reasoning_content" in t.messages[-1]
                assert gap == ("<think>\n" if thinks else ""), (setting, t.id)
                if not thinks:
                    assert r.decision.position == start.position - 1, (setting, t.id)
            else:  # a tool-call-only reply: before the template's call markup ("Calling tools:" in text rendering)
                assert r.decision.position <= start.position - 1
            assert (r.decision.message_index, r.decision.turn) == (reply, start.turn)
            # what capture queries: the decision and every reasoning start, in position order
            qs = select_queries(r, "reasoning+decision")
            assert [q.position for q in qs] == sorted(q.position for q in qs)
            assert [q.position for q in qs if q.kind == "decision"] == [r.decision.position]
            # a recorded call without its reply awaits the model: the generation prompt's last token
            pending = render(Trajectory(id=t.id, messages=t.messages[:-1], tools=t.tools), tokenizers[family])
            assert pending.add_generation_prompt and pending.decision.position == len(pending.input_ids) - 1
            if family != "llama3":  # Llama 3 merges the prompt's "\n\n" with the reply's first characters
                assert pending.decision.position == r.decision.position
                assert list(pending.input_ids) == list(r.input_ids[:len(pending.input_ids)])
    assert kinds == ["reasoning", "action", "reasoning", "reasoning"] * 2  # the tool-call-only reply is an action


def test_capture_and_counterfactual_agree(calls, tokenizers):
    model = SimpleNamespace(tokenizer=tokenizers["smollm2"], max_positions=None)
    for t in calls["none"]:
        k = len(t.messages) - 1
        ctx = build_context(model, t, t.messages[:k], t.messages[k], "o", rendering="auto", max_tokens=None)
        r = render(t, tokenizers["smollm2"])
        assert ctx.points[0].position == r.decision.position and ctx.decision_exact
        assert ctx.points[1].position == next(q.position for q in r.queries_reasoning if q.message_index == k)


def test_a_template_that_opens_the_reply_decides_before_its_markup(tokenizers):
    """Qwen renders reasoning_content as "<think>\\n..." after the generation prompt: the model decided at the
    prompt's last token, before the markup, not at the token before the reasoning text."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}]
    r = render(Trajectory(id="t", messages=msgs), tokenizers["qwen"])
    pending = render(Trajectory(id="t", messages=msgs[:2]), tokenizers["qwen"])
    start = r.queries_reasoning[-1].position
    assert r.decision.position == len(pending.input_ids) - 1 < start - 1
    assert r.text[r.offsets[r.decision.position + 1][0]:r.offsets[start][0]] == "<think>\n"
    assert json.dumps(r.text[:int(r.offsets[r.decision.position][1])]) == json.dumps(pending.text)


def test_truncation_keeps_a_decision_it_does_not_cut(calls, smol):
    """--truncate: a recorded call cut inside its reply keeps its decision (before the reply); one cut before
    the reply has no decision left, and the last token kept stands in for it (as before issue 26)."""
    from attnprobe.capture.api import prepare

    t = calls["none"][-1]
    full = prepare(smol, t)
    start = next(q.position for q in full.queries_reasoning if q.message_index == len(t.messages) - 1)
    inside = prepare(smol, t, max_tokens=start + 2, truncate=True)
    assert inside.decision.position == full.decision.position == start - 1
    before = prepare(smol, t, max_tokens=start - 5, truncate=True)
    assert before.decision.position == start - 6 == len(before.input_ids) - 1
