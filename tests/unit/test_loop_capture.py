"""Capture in the loop, the generator's side (issue 40): the rows a batched, KV-reusing, left-padded
generation scores while it runs equal transformers' own eager attention on the same tokens (an independent
reference: explicit softmax, full sequence, no attnprobe code)."""

import numpy as np
import pytest
import torch

from attnprobe.generation.capturing import CaptureSpec
from attnprobe.generation.chat import ChatRequest
from attnprobe.generation.transformers_chat import TransformersChat
from tests.support.eager import eager_output_attentions
from tests.support.scripted_chat import ScriptedChat


def _check_rows(model, cap, tol=1e-5):
    """Every scored row (per layer, per head, per key) against eager attention on ``cap.token_ids``."""
    pos = cap.scorer.qpos.tolist()
    ref = eager_output_attentions(model, cap.token_ids, pos)  # [nq, L, H, n]
    layers = sorted(cap.scorer.per_layer)
    got = np.stack([cap.scorer.per_layer[li].numpy() for li in layers], axis=1)  # [nq, L, H, n] (per-key segments)
    assert got.shape == ref[:, layers].shape
    assert np.abs(got - ref[:, layers]).max() < tol
    lh = len(layers) * got.shape[2]
    assert np.abs(cap.scorer.token_sum.numpy() - ref[:, layers].sum(axis=(1, 2))).max() < tol * lh
    assert np.allclose(got.sum(-1), 1.0, atol=1e-5)  # every row is a whole softmax: padding is no key


def test_batched_rows_with_reuse_and_left_padding_equal_eager(tiny_smol):
    chat = TransformersChat(tiny_smol, stop_at_call=False)
    conv = {"a": [{"role": "user", "content": "Name a colour."}],
            "b": [{"role": "system", "content": "You answer in one word, always, and you never explain anything."},
                  {"role": "user", "content": "What is the capital of France? Think first."}]}
    for turn in range(2):  # the second turn reuses each episode's kept cache (prefix) and pads "a" on the left
        reqs = []
        for ep, msgs in conv.items():
            n = len(chat.prompt(msgs).ids)
            reqs.append(ChatRequest(msgs, max_tokens=5, episode=ep,
                                    capture=CaptureSpec(positions=(n // 2, n - 1), layers=(0, 2, 3))))
        replies = chat.complete_batch(reqs)
        if turn == 1:
            assert chat.last_stats["prefilled"] < chat.last_stats["sent"]  # the kept caches were used
        for req, rep in zip(reqs, replies):
            cap = rep.capture
            n = len(rep.prompt.ids)
            assert cap.token_ids[:n] == rep.prompt.ids and len(cap.token_ids) == n + 1
            assert cap.scorer.qpos.tolist() == [n // 2, n - 1, n]
            assert sorted(cap.scorer.per_layer) == [0, 2, 3]
            _check_rows(tiny_smol.model, cap)
            conv[req.episode] = req.messages + [rep.as_message(), {"role": "user", "content": "And then?"}]


def test_a_reply_of_one_token_is_fed_once_to_score_its_start(tiny_smol):
    chat = TransformersChat(tiny_smol, stop_at_call=False)
    msgs = [{"role": "user", "content": "Say nothing."}]
    n = len(chat.prompt(msgs).ids)
    other = [{"role": "user", "content": "Write a long story about a dog and a cat."}]
    reps = chat.complete_batch([ChatRequest(msgs, max_tokens=1, capture=CaptureSpec(positions=(n - 1,))),
                                ChatRequest(other, max_tokens=4, capture=CaptureSpec(positions=()))])
    assert reps[0].output_tokens == 1 and reps[0].capture.scorer.qpos.tolist() == [n - 1, n]
    for r in reps:
        _check_rows(tiny_smol.model, r.capture)


def test_capture_needs_an_in_process_backend():
    chat = ScriptedChat(lambda messages, tools: "x")
    with pytest.raises(ValueError, match="cannot capture attention while generating"):
        chat.complete_batch([ChatRequest([{"role": "user", "content": "x"}], capture=CaptureSpec(positions=(0,)))])


def test_the_spec_checks_its_positions():
    with pytest.raises(ValueError, match="strictly increasing"):
        CaptureSpec(positions=(3, 3))
    with pytest.raises(ValueError, match="outside the prompt"):
        CaptureSpec(positions=(5,)).query_positions(5)
    assert CaptureSpec(positions=(1, 4)).query_positions(5) == [1, 4, 5]
    assert torch.equal(torch.as_tensor(CaptureSpec(positions=()).segments(3)[0]), torch.arange(4))
