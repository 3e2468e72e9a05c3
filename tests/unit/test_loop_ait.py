"""AIT per episode in a batched study (issue 37): each model call counts its share of the batch call's wall
time, not the whole batch's, plus the episode's own steps (tools, retrieval). A fake clock makes the answer
exact."""

from __future__ import annotations

import pytest

from attnprobe.generation.chat import ChatReply
from attnprobe.studies.loop import rollout as R


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BatchChat:
    """Every batch call takes 12 s of the clock, whatever its size."""

    def __init__(self, clock):
        self.clock, self.ended = clock, []

    def complete_batch(self, requests):
        self.clock.now += 12.0
        return [ChatReply(content="r", output_tokens=1) for _ in requests]

    def end_episode(self, run_id):
        self.ended.append(run_id)


class Episode:
    """``calls`` model calls; after each reply but the last, a tool step of ``tool_s`` seconds."""

    def __init__(self, run_id, calls, tool_s, clock):
        self.run_id, self.calls, self.tool_s, self.clock = run_id, calls, tool_s, clock

    def steps(self):
        for k in range(self.calls):
            yield f"request {k}"
            if k < self.calls - 1:
                self.clock.now += self.tool_s


def test_ait_is_the_episode_share_of_each_batch_call_plus_its_own_steps(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(R.time, "perf_counter", clock)
    chat = BatchChat(clock)
    eps = [Episode("a", 1, 0.0, clock), Episode("b", 2, 3.0, clock), Episode("c", 3, 1.0, clock)]
    done = {}
    R.rollout(chat, eps, on_done=lambda lp, s: done.__setitem__(lp.run_id, s))
    # turn 1: 3 episodes share 12 s (4 each); b's tool 3 s, c's 1 s. turn 2: b and c share 12 s (6 each);
    # c's tool 1 s. turn 3: c alone, 12 s.
    assert done["a"] == pytest.approx(4.0)            # the wall time to its end would be 12
    assert done["b"] == pytest.approx(4 + 3 + 6)      # 13; wall time 12 + 3 + 1 + 12 = 28
    assert done["c"] == pytest.approx(4 + 1 + 6 + 1 + 12)
    # the shares add up to the batch calls' wall time: no second is counted twice
    assert done["a"] + done["b"] + done["c"] == pytest.approx(3 * 12 + 3 + 1 + 1)
    assert chat.ended == ["a", "b", "c"]


def test_alone_the_ait_is_the_wall_time(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(R.time, "perf_counter", clock)
    done = []
    R.rollout(BatchChat(clock), [Episode("a", 3, 2.0, clock)], on_done=lambda lp, s: done.append(s))
    assert done == [pytest.approx(3 * 12 + 2 * 2.0)]
