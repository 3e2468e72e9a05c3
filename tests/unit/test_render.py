"""Segmentation: exact roles, authors and turns for every message part on three template families."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from support.chat_templates import template_tokenizers

import attnprobe
from attnprobe.errors import RenderError
from attnprobe.render.rendering import render
from attnprobe.trajectory.schema import Trajectory


@pytest.fixture(scope="module")
def tokenizers(smol):
    return template_tokenizers(smol.tokenizer)


def expected_parts(traj: Trajectory) -> set[tuple]:
    """(message_index, part, role, author, turn) for every non-empty part, from the messages alone."""
    out, turn, seen = set(), 0, False
    for i, m in enumerate(traj.messages):
        if m["role"] == "assistant":
            turn += seen
            seen = True
            if m.get("reasoning_content"):
                out.add((i, "reasoning_content", "reasoning", "self", turn))
            if (m.get("content") or "").strip():
                out.add((i, "content", "reasoning", "self", turn))
            for j, _ in enumerate(m.get("tool_calls") or []):
                out.add((i, f"tool_calls[{j}]", "tool_call", "self", turn))
        else:
            role = {"system": "system", "user": "task", "tool": "observation"}[m["role"]]
            out.add((i, "content", role, "external", turn))
    return out


def part_text(traj, mi, part):
    m = traj.messages[mi]
    if part.startswith("tool_calls"):
        return m["tool_calls"][int(part[11:-1])]["function"]["name"]
    return m[part] if part == "reasoning_content" else m["content"]


@pytest.mark.parametrize("family,expected_rendering", [
    ("smollm2", {"sample-long-research": "text", "sample-parallel-calls": "text", "sample-reasoning-1": "text"}),
    ("llama3", {"sample-long-research": "native", "sample-parallel-calls": "native",
                "sample-reasoning-1": "native+reasoning-in-content"}),
    ("qwen", {"sample-long-research": "native", "sample-parallel-calls": "native", "sample-reasoning-1": "native"}),
])
def test_every_part_labelled_exactly(tokenizers, samples, family, expected_rendering):
    tok = tokenizers[family]
    for tid, rendering in expected_rendering.items():
        traj = samples[tid]
        r = render(traj, tok)
        assert r.rendering == rendering, (tid, r.tried)
        got = [(s.message_index, s.part, s.role, s.author, s.turn) for s in r.segments if s.role != "template"]
        assert len(got) == len(set(got)), "a part was split into several segments"
        assert set(got) == expected_parts(traj)
        # Segments tile the sequence, and each part's tokens decode to the part's own text.
        assert r.segments[0].start == 0 and r.segments[-1].end == len(r.input_ids)
        assert all(a.end == b.start for a, b in zip(r.segments, r.segments[1:]))
        for s in r.segments:
            if s.role == "template":
                continue
            a, b = r.offsets[s.start][0], r.offsets[s.end - 1][1]
            text = r.text[a:b]
            expected = part_text(traj, s.message_index, s.part).strip()
            assert expected in text or (s.part.startswith("tool_calls") and expected in text), (s, text[:80])
            assert len(text.strip()) <= len(expected) + (400 if s.part.startswith("tool_calls") else 2)
        # Tokenizing the rendered text is what the template + tokenizer would feed the model.
        ids = tok.apply_chat_template(r.messages, tools=traj.tools, tokenize=True,
                                      add_generation_prompt=r.add_generation_prompt, return_dict=False)
        assert list(np.asarray(ids).ravel()) == r.input_ids.tolist()


def test_turns_queries_and_decision(tokenizers, samples):
    traj = samples["sample-reasoning-2"]  # ends on an observation: the next action is pending
    r = render(traj, tokenizers["qwen"])
    assistants = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    assert [q.message_index for q in r.queries_reasoning] == assistants
    assert [q.turn for q in r.queries_reasoning] == list(range(len(assistants)))
    for q in r.queries_reasoning:  # the first token of the message's reasoning
        seg = next(s for s in r.segments if s.start == q.position)
        assert (seg.part, seg.role, seg.author) == ("reasoning_content", "reasoning", "self")
    assert r.add_generation_prompt and r.decision.position == len(r.input_ids) - 1
    tail = r.segments[-1]
    assert (tail.role, tail.turn, tail.message_index) == ("template", len(assistants), -1)
    assert r.text.endswith("<|im_start|>assistant\n")


def test_injected_default_system_prompt_is_template(tokenizers):
    traj = Trajectory(id="x", messages=[{"role": "user", "content": "Task: find the capital of Peru."},
                                        {"role": "assistant", "content": "I will search for it."}])
    r = render(traj, tokenizers["smollm2"])
    first = r.segments[0]
    assert (first.role, first.author) == ("template", "external")
    a, b = r.offsets[first.start][0], r.offsets[first.end - 1][1]
    assert "You are a helpful AI assistant named SmolLM" in r.text[a:b]
    assert r.rendering == "native" and not r.add_generation_prompt


def test_annotations_split_user_content(tokenizers):
    content = "Task: find X.\nSearch results:\n1. [A](https://a.example) alpha\nDecide."
    s = content.index("1. [A]")
    e = content.index(" alpha") + len(" alpha")
    traj = Trajectory.from_dict({"id": "obs", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": content, "annotations": [{"start": s, "end": e, "role": "observation"}]}]})
    r = render(traj, tokenizers["smollm2"])
    labels = [(seg.part, seg.role) for seg in r.segments if seg.role != "template"]
    assert labels == [("content", "system"), ("content", "task"), ("annotation[0]", "observation"),
                      ("content", "task")]
    obs = next(seg for seg in r.segments if seg.role == "observation")
    text = r.text[r.offsets[obs.start][0]:r.offsets[obs.end - 1][1]]
    assert "1. [A](https://a.example) alpha" in text


def test_dropped_part_fails_loudly_with_message_index(tokenizers, samples):
    tok = copy.deepcopy(tokenizers["smollm2"])
    # A template that silently drops tool messages and every user message after the first.
    tok.chat_template = ("{% for m in messages %}{% if m.role in ('system', 'assistant') or loop.index0 == 1 %}"
                         "{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{% endif %}"
                         "{% endfor %}")
    traj = samples["sample-parallel-calls"]
    with pytest.raises(RenderError, match=r"message 2 \(tool_calls\[0\]\)"):
        render(traj, tok, rendering="native")
    with pytest.raises(RenderError, match=r"message 3 \(content\)") as info:
        render(traj, tok)  # auto: every rendering fails, each reason is reported
    assert "native" in str(info.value) and "text" in str(info.value)


def test_no_chat_template(tokenizers, samples):
    tok = copy.deepcopy(tokenizers["smollm2"])
    tok.chat_template = None
    with pytest.raises(RenderError, match="no chat template"):
        render(samples["sample-reasoning-1"], tok)


def test_too_long_refused_or_truncated(smol, samples):
    traj = samples["sample-parallel-calls"]
    with pytest.raises(attnprobe.TooLongError, match=r"renders to \d+ tokens, above the limit of 500 \(max_tokens\)"):
        attnprobe.prepare(smol, traj, max_tokens=500)
    r = attnprobe.prepare(smol, traj, max_tokens=500, truncate=True)
    assert len(r.input_ids) == 500 and r.segments[-1].end == 500 and r.decision.position == 499
    assert all(q.position < 500 for q in r.queries_reasoning)
