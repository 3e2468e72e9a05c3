"""The driver that steps a study's episodes together (Search-R1's generation manager does the same).

Every :class:`~attnprobe.studies.loop.agents.Loop` is a generator of model calls. Each turn the driver
gathers the one pending :class:`~attnprobe.generation.chat.ChatRequest` of every active episode, sends
them to the backend in one :meth:`~attnprobe.generation.chat.ChatBackend.complete_batch` call, and
hands each episode its reply; the episode then runs its tools, refiner and bookkeeping up to its next
call, or finishes. A finished episode drops out at once: the backend frees what it kept for it
(``end_episode``) and ``on_done`` gets it (the job writes its records there, so a killed batch keeps
the episodes that finished). One episode at a time is the same driver with a batch of one.

Episodes never see one another: an episode's replies depend only on what it sends, so a batched study
writes the records a sequential one does (timings aside) whenever the backend answers a request the
same way in any batch (a scripted or served model; in-process batching pads, see docs/loop.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnprobe.agents.recorder import call_note
from attnprobe.generation.chat import ChatReply, ChatRequest


@dataclass
class _Active:
    loop: Any  # a Loop
    steps: Any  # its generator
    request: ChatRequest
    seconds: float  # this episode's own time so far (AIT, docs/methods.md): its share of each batch call + its steps
    calls: int = 0
    finished: bool = False


def rollout(chat, loops: Sequence[Any], *, on_done: Callable[[Any, float], None] | None = None,
            note: Callable[[str], None] | None = None, on_call: Callable[[Any], None] | None = None) -> None:
    """Run ``loops`` to the end together, one batched model call per turn.

    ``on_done(loop, seconds)`` is called as each episode finishes (``seconds``: the episode's own inference
    time, AIT in docs/methods.md: per model call the batch call's wall time divided by the episodes in that
    batch, plus the wall time of its own steps between calls (tools, retrieval, refiner); alone, its wall
    time); ``note`` is told of every turn
    ("turn 3: 5 episodes", then its output tokens per second), or, when run alone, of its calls ("call N",
    as a sequential run always was); ``on_call(loop)`` of every reply an episode is handed (progress in model
    calls). When a call or an episode fails, the
    exception goes up (the executor redoes the batch item by item) and the backend is told that every
    unfinished episode has ended."""
    active: list[_Active] = []
    try:
        for loop in loops:
            t0 = time.perf_counter()
            gen = loop.steps()
            try:
                request = next(gen)
                active.append(_Active(loop, gen, request, time.perf_counter() - t0))
            except StopIteration:  # an episode that needs no model call (none today)
                _finish(chat, loop, time.perf_counter() - t0, on_done)
        _turns(chat, active, on_done, note, on_call, alone=len(loops) == 1)
    finally:  # a failed batch (its episodes are redone): free what the backend kept for the unfinished ones
        for a in active:
            if not a.finished:
                chat.end_episode(a.loop.run_id)


def _turns(chat, active: list[_Active], on_done, note, on_call, *, alone: bool) -> None:
    turn = 0
    while active:
        turn += 1
        label = (f"call {active[0].calls + 1}" if alone
                 else f"turn {turn}: {len(active)} episode{'s' if len(active) > 1 else ''}")
        if note is not None:
            note(label)
        t0 = time.perf_counter()
        replies = chat.complete_batch([a.request for a in active])
        share = (time.perf_counter() - t0) / len(active)  # each call's part of the batch call (issue 37: not the batch's)
        if len(replies) != len(active):
            raise RuntimeError(f"{type(chat).__name__}.complete_batch answered {len(replies)} of {len(active)} "
                               "requests")
        if note is not None:
            note(call_note(label, sum(r.output_tokens for r in replies), time.perf_counter() - t0))
        for a, reply in zip(active, replies):
            a.calls += 1
            if on_call is not None:
                on_call(a.loop)
            t1 = time.perf_counter()
            more = _step(a, reply)
            a.seconds += share + time.perf_counter() - t1
            if not more:
                a.finished = True
                _finish(chat, a.loop, a.seconds, on_done)
        active[:] = [a for a in active if not a.finished]


def _step(a: _Active, reply: ChatReply) -> bool:
    """Send the episode its reply; False when it has finished."""
    try:
        a.request = a.steps.send(reply)
    except StopIteration:
        return False
    return True


def _finish(chat, loop, seconds: float, on_done) -> None:
    chat.end_episode(loop.run_id)
    if on_done is not None:
        on_done(loop, seconds)


