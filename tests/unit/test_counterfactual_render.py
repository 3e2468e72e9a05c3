"""Counterfactual contexts on the three template families (SmolLM2/ChatML, Llama 3, Qwen): they render
and segment exactly, untouched messages keep their tokens, and every token maps to its original turn."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attnprobe.agents.policies import ircot, mask_observations, refine_latest
from attnprobe.agents.refiners import bm25_refiner
from attnprobe.counterfactual.analysis import CF_ROLES, token_labels
from attnprobe.counterfactual.contexts import build_context
from attnprobe.counterfactual.steps import choose_steps
from attnprobe.render.rendering import message_turns
from attnprobe.results.result import CaptureResult

TEMPLATES = Path(__file__).parents[1] / "support" / "templates"
POLICIES = [mask_observations(2), ircot("o"), ircot("oq"), ircot("oqp"), refine_latest(bm25_refiner(1))]


@pytest.fixture(scope="module")
def models(smol):
    out = {"smollm2": SimpleNamespace(tokenizer=smol.tokenizer, max_positions=None)}
    for name in ("llama3", "qwen"):
        tok = copy.deepcopy(smol.tokenizer)
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        out[name] = SimpleNamespace(tokenizer=tok, max_positions=None)
    return out


def tokens_by_part(rendered, message_map) -> dict[tuple[int, str], list[int]]:
    out: dict[tuple[int, str], list[int]] = {}
    for s in rendered.segments:
        if s.role != "template" and s.message_index >= 0:
            out.setdefault((message_map(s.message_index), s.part), []).extend(rendered.input_ids[s.start:s.end].tolist())
    return out


def fake_result(rendered) -> CaptureResult:
    n = len(rendered.input_ids)
    return CaptureResult("x", rendered.input_ids, rendered.segments, [], [0], np.zeros((0, len(rendered.segments))),
                         np.zeros((0, 1, 1, len(rendered.segments))), np.zeros((0, n)), text=rendered.text,
                         offsets=rendered.offsets)


@pytest.mark.parametrize("family", ["smollm2", "llama3", "qwen"])
@pytest.mark.parametrize("sample", ["sample-long-research", "sample-parallel-calls", "sample-reasoning-1"])
def test_counterfactual_renders_and_segments_exactly(models, samples, family, sample):
    model, traj = models[family], samples[sample]
    steps = choose_steps(traj, min_past=2) or choose_steps(traj, min_past=1)
    assert steps, "sample has no step to test"
    step = steps[-1]
    i = step.message_index
    turns = message_turns(traj.messages)
    orig = build_context(model, traj, traj.messages[:i], traj.messages[i], "o", rendering="auto", max_tokens=None)
    # Llama 3's tokenizer merges the header's "\n\n" with the next text, so there the prefix's last token is
    # not a token of the full rendering: the decision falls back to the token before the step (flagged).
    assert orig.decision_exact == (family != "llama3")
    orig_parts = tokens_by_part(orig.rendered, lambda k: k)
    for policy in POLICIES:
        cf = policy(traj.messages[:i])
        ctx = build_context(model, traj, cf.messages, traj.messages[i], "c", rendering=orig.rendered.rendering,
                            max_tokens=None)
        assert ctx.decision_exact == orig.decision_exact
        src = [*cf.source, i]
        cf_parts = tokens_by_part(ctx.rendered, src.__getitem__)
        for (m, part), ids in cf_parts.items():
            status = cf.changes.get(m, "kept")
            if status == "kept":
                assert ids == orig_parts[(m, part)], (policy.name, m, part)  # untouched message: same tokens
            elif status == "calls_removed":  # same text; its last token may merge differently without the call
                assert not part.startswith("tool_calls")
                assert ids[:-1] == orig_parts[(m, part)][:-1], (policy.name, m, part)
            else:
                assert status in ("placeholder", "refined") and part == "content"
        # every kept part is still there, nothing removed survives
        expected = {(m, p) for (m, p) in orig_parts if cf.changes.get(m, "kept") in ("kept", "placeholder", "refined")
                    or (cf.changes.get(m) == "calls_removed" and not p.startswith("tool_calls"))}
        assert set(cf_parts) == expected, policy.name
        # turn mapping: each token's original turn is its message's original turn; placeholder tokens keep it
        lab = token_labels(fake_result(ctx.rendered), cf.source, i, cf.changes, turns)
        for s in ctx.rendered.segments:
            if s.role == "template" or s.message_index < 0:
                continue
            m = src[s.message_index]
            assert set(lab["turn"][s.start:s.end].tolist()) == {turns[m]}
            want = {"placeholder": "placeholder", "refined": "refined"}.get(cf.changes.get(m, "kept"), s.role)
            assert {CF_ROLES[r] for r in lab["role"][s.start:s.end]} == {want}
        assert ctx.prefix_tokens <= orig.prefix_tokens
