"""A trajectory too long to fit is refused before it is tokenized (issue 22: a 10 MB observation took
2.8 GB and 48 s to tokenize just to be refused)."""

from __future__ import annotations

import pytest

from attnprobe.errors import TooLongError
from attnprobe.render.rendering import check_length, longest_token_chars, render
from attnprobe.trajectory.schema import Trajectory


class CountingTokenizer:
    """The tokenizer, recording the length of every text it is asked to tokenize: "refused before
    tokenizing" is checked by what was tokenized (issue 38), not by a time limit a busy machine breaks."""

    def __init__(self, tok):
        self._tok, self.lengths = tok, []

    def __call__(self, text, *args, **kwargs):
        self.lengths.append(len(text) if isinstance(text, str) else sum(map(len, text)))
        return self._tok(text, *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        return self._tok.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_longest_token_bounds_every_token(smol):
    tok = smol.tokenizer
    longest = longest_token_chars(tok)
    assert 1 < longest < 1000
    text = "The quick brown fox " * 50 + "<|im_start|>assistant\n" + " " * 300 + "https://example.org/" * 20
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert max(b - a for a, b in enc["offset_mapping"]) <= longest  # the bound the early check relies on
    assert len(text) <= len(enc["input_ids"]) * longest


def test_a_10mb_observation_is_refused_quickly(smol):
    tok = smol.tokenizer
    traj = Trajectory.from_dict({"id": "huge", "messages": [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "word " * 2_000_000}]})
    counting = CountingTokenizer(tok)
    with pytest.raises(TooLongError, match=r"trajectory 'huge' renders to 1000\d{4} characters, more than 8192 "
                                           r"tokens can hold .*refused before tokenizing"):
        render(traj, counting, max_tokens=8192)
    assert max(counting.lengths, default=0) < 1000  # nothing long was tokenized (it took 48 s and 2.8 GB)
    short = Trajectory.from_dict({"id": "s", "messages": [{"role": "user", "content": "hi"}]})
    assert len(render(short, tok, max_tokens=8192).input_ids) > 0  # what fits is rendered as before
    check_length("x" * 10, tok, None, "anything")  # no limit: no check


def test_capture_refuses_a_huge_observation_before_tokenizing(smol, monkeypatch):
    """capture's prepare passes its limit to render: a 2 MB observation is refused in well under a
    second (tokenizing it first took seconds and gigabytes), naming the limit; --truncate still works."""
    from attnprobe.capture.api import prepare
    from attnprobe.errors import TooLongError
    from attnprobe.trajectory.schema import Trajectory

    huge = Trajectory(id="huge", messages=[{"role": "user", "content": "find it"},
                                           {"role": "tool", "content": "word " * 400_000}])
    counting = CountingTokenizer(smol.tokenizer)
    monkeypatch.setattr(smol, "tokenizer", counting)
    with pytest.raises(TooLongError, match="refused before tokenizing"):
        prepare(smol, huge, max_tokens=1000)
    assert max(counting.lengths, default=0) < 1000  # the 2 MB text was never tokenized
    assert len(prepare(smol, huge.__class__(id="small", messages=huge.messages[:1]), max_tokens=1000).input_ids) < 100
    assert counting.lengths  # the counter sees what is tokenized: the short trajectory was
