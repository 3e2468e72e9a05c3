"""The batch seam every generation backend shares (attnprobe.generation.chat)."""

import pytest

from attnprobe.generation.chat import ActionFormat, ChatRequest
from tests.support.scripted_chat import ScriptedChat


def test_one_by_one_answers_in_order_and_refuses_grammars():
    chat = ScriptedChat(lambda messages, tools: f"echo {messages[-1]['content']}")
    reqs = [ChatRequest([{"role": "user", "content": t}], episode=f"e{i}") for i, t in enumerate(["a", "b c", "d"])]
    replies = chat.complete_batch(reqs)
    assert [r.content for r in replies] == ["echo a", "echo b c", "echo d"]
    assert [m[-1]["content"] for m in chat.sent] == ["a", "b c", "d"]
    assert chat.end_episode("e0") is None
    with pytest.raises(ValueError, match="cannot constrain"):
        chat.complete_batch([ChatRequest([{"role": "user", "content": "x"}], actions=ActionFormat("ircot"))])
