"""Prefix sharing and generation from the captured cache with the contexts a counterfactual run builds on the
bundled model's tokenizer (successive steps' originals and a policy's contexts of the long trajectory). The
model is the tiny random-weight SmolLM2 (support/tiny_model.py: same tokenizer, template and head layout,
4 layers): sharing and cache reuse do not depend on the weights, and the renders are the bundled model's."""

from __future__ import annotations

import numpy as np
import pytest
from support.paths import TRAJ_DIR
from support.sharing import assert_same

import attnprobe
from attnprobe.agents.policies import parse_policy
from attnprobe.capture.api import make_plan
from attnprobe.counterfactual.contexts import build_context
from attnprobe.counterfactual.steps import choose_steps
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe_hooks.backend import get_backend
from attnprobe_hooks.transformers.generate import GenerationRequest, capture_and_generate

LAYERS = (0, 2, 3)


@pytest.fixture(scope="module")
def contexts(tiny_smol):
    smol = tiny_smol
    """Originals of the first two steps with >= 5 past turns, and their ircot:o contexts."""
    traj = attnprobe.load_trajectories(TRAJ_DIR / "long_research.jsonl")[0]
    policy = parse_policy("ircot:o")
    out = []
    for s in choose_steps(traj)[:2]:
        prefix, msg = traj.messages[: s.message_index], traj.messages[s.message_index]
        out.append((prefix, build_context(smol, traj, prefix, msg, f"{s.key}:o", rendering="auto", max_tokens=None)))
        cf = policy(prefix).messages
        out.append((cf, build_context(smol, traj, cf, msg, f"{s.key}:cf", rendering="auto", max_tokens=None)))
    return traj, out


def test_shared_capture_equals_independent_on_the_smollm2_contexts(tiny_smol, contexts):
    smol = tiny_smol
    _, ctx = contexts
    # add the reasoning starts of every earlier turn: queries deep inside the shared prefix
    plans = [make_plan(c.rendered, sorted({q.position: q for q in [*c.rendered.queries_reasoning, *c.points]}.values(),
                                          key=lambda q: q.position), LAYERS) for _, c in ctx]
    backend = get_backend("transformers")
    alone = backend.run(smol, plans, chunk_size=300, share_prefixes=False)
    shared = backend.run(smol, plans, chunk_size=300, share_prefixes=True)
    worst = assert_same(shared, alone, plans)
    print("max |diff|", worst)
    st = shared.sharing
    assert st.plan_tokens == sum(p.n for p in plans) == alone.sharing.prefilled_tokens
    # step 2's original extends step 1's; the ircot:o contexts branch off them (measured: 3,116 of 5,911 tokens)
    assert max(p.n for p in plans) < st.prefilled_tokens == st.trie_tokens < 0.6 * st.plan_tokens


def test_generation_from_the_captured_cache_equals_greedy_generation(tiny_smol, contexts):
    smol = tiny_smol
    traj, ctx = contexts
    chosen = [ctx[0], ctx[3]]  # step 1's original, step 2's ircot:o context
    assert all(c.decision_exact for _, c in chosen)
    plans = [make_plan(c.rendered, c.points, LAYERS) for _, c in chosen]
    chat = TransformersChat(smol, stop_at_call=False)
    tok = smol.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    requests = [GenerationRequest(i, c.prefix_tokens, 24, {"pad_token_id": pad}) for i, (_, c) in enumerate(chosen)]
    outs, new, counts = capture_and_generate(smol, plans, requests, chunk_size=512)
    assert [o.scorer.per_layer[LAYERS[0]].shape[0] for o in outs] == [2, 2]  # (the restored cache: tiny-model tests)
    for i, (messages, c) in enumerate(chosen):
        reply = chat.complete(messages, traj.tools, max_new_tokens=24, temperature=0.0)
        assert reply.prompt.ids == np.asarray(c.rendered.input_ids[: c.prefix_tokens]).tolist()
        assert tok.decode(new[i], skip_special_tokens=True) == reply.raw_text
        assert len(new[i]) == reply.output_tokens
        assert counts[i].prompt_tokens == c.prefix_tokens and counts[i].prefilled_tokens == 1
