"""TransformersChat.complete_batch (issue 30): one padded batch with a hand-written decode loop, per-row
stop rules, grammar masks and per-episode prefix reuse, on the tiny random-weight SmolLM2 (fp32)."""

from __future__ import annotations

import pytest

from attnprobe.generation import decode
from attnprobe.generation.chat import ActionFormat, ChatRequest
from attnprobe.generation.transformers_chat import TransformersChat

TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the web",
                                            "parameters": {"type": "object",
                                                           "properties": {"query": {"type": "string"}}}}}]
CALL = '{"name": "search", "arguments": {"query": "x"}}'


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def sequential(chat: TransformersChat, reqs: list[ChatRequest]):
    return [chat.complete(r.messages, r.tools, max_new_tokens=r.max_new_tokens, temperature=r.temperature) for r in reqs]


class FixedText:
    """A test-only grammar (the real one: attnprobe.generation.structured.token_constraint): only the tokens
    of ``text`` in order; then finished, or (``then_free``) anything, never finished."""

    def __init__(self, ids: list[int], then_free: bool = False):
        self.ids, self.then_free, self.n = ids, then_free, 0

    def start(self):
        return FixedText(self.ids, self.then_free)

    def allowed(self, vocab_size: int):
        import torch

        if self.n >= len(self.ids):
            return torch.ones(vocab_size, dtype=torch.bool)
        out = torch.zeros(vocab_size, dtype=torch.bool)
        out[self.ids[self.n]] = True
        return out

    def accept(self, token_id: int) -> None:
        assert self.n >= len(self.ids) or token_id == self.ids[self.n]
        self.n += 1

    @property
    def finished(self) -> bool:
        return not self.then_free and self.n >= len(self.ids)


def test_greedy_batch_equals_sequential_replies_in_one_call(tiny_smol):
    """Eight prompts of different lengths and token limits: each batched reply (every ChatReply field,
    prompt ids included) is the one ``complete`` gives for that request, from one batch."""
    chat = TransformersChat(tiny_smol)
    reqs = [ChatRequest(user("word " * (3 * i) + f"question {i}?"), max_new_tokens=2 + i) for i in range(6)]
    replies = chat.complete_batch(reqs)
    assert replies == sequential(chat, reqs)
    assert [r.output_tokens for r in replies] == [2 + i for i in range(6)]  # eos never comes first here
    lens = [len(r.prompt.ids) for r in replies]
    assert len(set(lens)) == 6
    assert chat.last_stats == {"calls": 1, "requests": 6, "sent": sum(lens), "prefilled": sum(lens),
                               "generated": sum(2 + i for i in range(6))}


def test_prefix_reuse_over_three_turns_equals_fresh_prefill_and_counts_saved_tokens(tiny_smol):
    """Turn 2 extends turn 1 (its reply and an observation): only the new tokens are prefilled. Turn 3
    changes an earlier message (as masking does): the prefill restarts at the first changed token."""
    chat, fresh = TransformersChat(tiny_smol), TransformersChat(tiny_smol, max_kept_episodes=0)
    m1 = [{"role": "system", "content": "You answer questions."}, *user("Who wrote Dune?")]
    r1 = chat.complete_batch([ChatRequest(m1, max_new_tokens=1, episode="e")])[0]  # cache = turn 1's prompt exactly
    m2 = [*m1, {"role": "assistant", "content": "Let me look."}, *user("Observation: Frank Herbert wrote it.")]
    m3 = [*m1[:1], *user("Who wrote [masked]?"), *m2[2:]]
    p1, p2, p3 = (chat.prompt(m).ids for m in (m1, m2, m3))
    assert p2[:len(p1)] == p1 and p3[:len(p1)] != p1
    reqs2 = [ChatRequest(m2, max_new_tokens=4, episode="e"), ChatRequest(user("Other episode?"), max_new_tokens=4, episode="f")]
    r2 = chat.complete_batch(reqs2)
    assert r2 == fresh.complete_batch(reqs2) == sequential(fresh, reqs2)
    n_other = len(r2[1].prompt.ids)
    assert chat.last_stats["sent"] == len(p2) + n_other
    assert chat.last_stats["prefilled"] == len(p2) - len(p1) + n_other  # turn 1's prompt came from the cache
    d = decode.common_prefix(p2, p3)
    assert 0 < d < len(p1)
    r3 = chat.complete_batch([ChatRequest(m3, max_new_tokens=4, episode="e")])
    assert r3 == sequential(fresh, [ChatRequest(m3, max_new_tokens=4)])
    assert chat.last_stats["prefilled"] == len(p3) - d
    assert chat.stats == {"calls": 3, "requests": 4, "sent": len(p1) + len(p2) + n_other + len(p3),
                          "prefilled": len(p1) + len(p2) - len(p1) + n_other + len(p3) - d,
                          "generated": 1 + 4 + 4 + 4}
    assert r1.output_tokens == 1
    assert fresh.stats["prefilled"] == fresh.stats["sent"]  # no reuse without kept episodes


def test_kept_episodes_are_bounded_and_end_episode_frees(tiny_smol, caplog):
    chat = TransformersChat(tiny_smol, max_kept_episodes=2)
    with caplog.at_level("INFO", logger="attnprobe.generation.transformers_chat"):
        for e in "abc":
            chat.complete_batch([ChatRequest(user(f"episode {e}"), max_new_tokens=2, episode=e)])
    n = len(chat.prompt(user("episode c")).ids)
    assert caplog.messages[-1] == f"generation batch: 1 requests; sent {n} tokens, prefilled {n} (reused 0); generated 2"
    assert list(chat._kept) == ["b", "c"]  # least recently used dropped
    chat.end_episode("b")
    chat.end_episode("zz")  # unknown: nothing to free
    assert list(chat._kept) == ["c"]
    ids, kv = chat._kept["c"]
    assert len(ids) == n + 2 - 1  # prompt + all new tokens but the last
    assert kv[0][0].shape[0] == 1 and kv[0][0].shape[-2] == len(ids)


def test_a_row_stops_at_its_call_while_the_other_goes_on(tiny_smol, monkeypatch):
    """Row 0 is steered (test grammar) to write a complete call and then left free: the stop-at-call
    rule ends it right at the call; row 1 (no call) runs to its own limit and equals ``complete``."""
    tok = tiny_smol.tokenizer
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(decode, "token_constraint", lambda tokenizer, fmt: FixedText(call_ids, then_free=True))
    chat = TransformersChat(tiny_smol, stop_check_every=1)
    reqs = [ChatRequest(user("Find x."), tools=TOOLS, max_new_tokens=40, actions=ActionFormat("seed002")),
            ChatRequest(user("Say something long."), tools=TOOLS, max_new_tokens=len(call_ids) + 5)]
    called, other = chat.complete_batch(reqs)
    assert called.raw_text == CALL and called.output_tokens == len(call_ids)
    assert called.finish_reason == "tool_calls" and called.stopped_by == "other"
    assert called.tool_calls[0]["function"] == {"name": "search", "arguments": '{"query": "x"}'}
    assert other == sequential(chat, reqs[1:])[0]
    assert other.output_tokens == len(call_ids) + 5 and other.stopped_by == "length"


def test_a_finished_grammar_stops_its_row_only(tiny_smol, monkeypatch):
    tok = tiny_smol.tokenizer
    text = "<search>dune author</search>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(decode, "token_constraint", lambda tokenizer, fmt: FixedText(ids))
    chat = TransformersChat(tiny_smol)
    reqs = [ChatRequest(user("Plain."), max_new_tokens=len(ids) + 3),
            ChatRequest(user("Search."), max_new_tokens=50, actions=ActionFormat("ircot"))]
    free, forced = chat.complete_batch(reqs)
    assert forced.raw_text == text and forced.stopped_by == "grammar" and forced.output_tokens == len(ids)
    assert free == sequential(chat, reqs[:1])[0]


def test_sampling_is_reproducible_per_seed_and_independent_of_the_batch(tiny_smol):
    """seed + the CRC-32 of a row's prompt ids seed that row's generator: the same seed draws the same
    replies, alone or in any batch; another seed draws others."""
    reqs = [ChatRequest(user(f"Tell me {w}."), max_new_tokens=4, temperature=1.0) for w in ("a", "more", "things")]
    a = TransformersChat(tiny_smol, seed=7).complete_batch(reqs)
    b = TransformersChat(tiny_smol, seed=7).complete_batch(reqs[::-1])[::-1]
    alone = TransformersChat(tiny_smol, seed=7).complete_batch(reqs[1:2])
    other = TransformersChat(tiny_smol, seed=8).complete_batch(reqs)
    assert [r.raw_text for r in a] == [r.raw_text for r in b]
    assert alone[0].raw_text == a[1].raw_text
    assert [r.raw_text for r in other] != [r.raw_text for r in a]
    greedy = TransformersChat(tiny_smol).complete_batch([ChatRequest(r.messages, max_new_tokens=4) for r in reqs])
    assert [r.raw_text for r in a] != [r.raw_text for r in greedy]


def test_bad_max_new_tokens_is_one_clear_error(tiny_smol):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1; got 0"):
        TransformersChat(tiny_smol).complete_batch([ChatRequest(user("x"), max_new_tokens=0)])


def test_no_call_budget_stops_only_the_row_without_a_call_opening(tiny_smol, monkeypatch):
    """Budget 3: the free row (prose) stops at 3 tokens with ``no_call``, as ``complete`` stops it; the row
    steered to open a call (``{``) is left to its limit."""
    brace = tiny_smol.tokenizer("{", add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(decode, "token_constraint", lambda tokenizer, fmt: FixedText(brace, then_free=True))
    chat = TransformersChat(tiny_smol, stop_at_call=False, no_call_tokens=3)
    reqs = [ChatRequest(user("Prose."), max_new_tokens=6), ChatRequest(user("Call."), max_new_tokens=6, actions=ActionFormat("x"))]
    prose, opened = chat.complete_batch(reqs)
    assert prose == sequential(chat, reqs[:1])[0]
    assert prose.stopped_by == "no_call" and prose.output_tokens == 3
    assert opened.raw_text.startswith("{") and opened.output_tokens == 6 and opened.stopped_by == "length"


def test_a_cache_that_cannot_be_stitched_falls_back_to_one_by_one(tiny_smol, monkeypatch):
    """A recurrent or hybrid model's cache is not per-layer keys and values: the batch is answered one
    request after another (no reuse), and structured actions are refused in one line."""
    def unsupported(*a, **k):
        raise decode.Unsupported("MambaCache is not a per-layer key/value cache")

    monkeypatch.setattr(decode, "decode", unsupported)
    chat = TransformersChat(tiny_smol)
    reqs = [ChatRequest(user("One."), max_new_tokens=2, episode="e"), ChatRequest(user("Two words."), max_new_tokens=3)]
    assert chat.complete_batch(reqs) == sequential(chat, reqs)
    assert chat._kept == {} and chat.stats["calls"] == 0
    monkeypatch.setattr(decode, "token_constraint", lambda tokenizer, fmt: FixedText([1]))
    with pytest.raises(ValueError, match="structured actions need a per-layer key/value cache: MambaCache"):
        chat.complete_batch([ChatRequest(user("x"), actions=ActionFormat("ircot"))])
