"""Capture in the loop: what a request asks an in-process generator to score while it generates, and what
the reply brings back (issue 40).

A closed-loop study generates every call; ``study attention`` used to prefill every recorded call again to
score it. An in-process generator already runs every query and key of the call through the model's
attention, so it can score the two queries the study uses from its own forward passes:

- the **decision**: the last prompt token, scored in the call's prefill;
- the **reasoning start**: the reply's first token, scored at the decode step that feeds it back (one more
  single-token step when the reply ended at that token: a reply of one token is never fed back otherwise);
- and any other prompt position the caller lists (past reasoning starts that a post-hoc capture of the
  same call scores too).

Backend-neutral rules (transformers: :mod:`attnprobe.generation.decode`; vLLM: its capture extension):

- Every key of the call's context is scored: keys reused from the episode's kept cache (KV reuse between
  turns) and the keys of this call alike; the padding of a left-padded batch is never a key.
- Every position in :attr:`CaptureSpec.positions` is computed in this call: a backend that would take it
  from a kept or prefix cache recomputes from that position (the reuse is cut there; the prefill count
  says so). A caller that kept an earlier call's rows for a position does not list it.
- The scores are a :class:`attnprobe_hooks.scoring.QueryScorer` (kept on the device while generating,
  one copy to the host at the end of the call), so the result has the form every capture backend
  returns: ``per_layer[layer]`` [queries, heads, segments], ``token_sum`` [queries, keys] summed over
  scored layers and heads. With ``token_segment=None`` every key position is its own segment, so
  ``per_layer`` holds each head's full row and the caller sums it into the segments of its own
  rendering of the recorded call (the rows are then exactly those a post-hoc prefill of the same tokens
  computes: no segmentation has to be known before the reply exists).

**Side plans** (:class:`SidePlan`, ``CaptureSpec.before``): a recorded call is rendered afterwards, and its
rendering may hold tokens the model never ran where the reply begins (seed 002's release keeps no content in
a tool-call turn, so the rendered reply starts at the template's call markup, not at the text the model wrote
first). Those rows are scored on the episode's kept cache before the request's own prefill: the plan's tokens
are run from their first difference with the kept cache (a few tokens: the rendered reply up to its first own
token), never the whole context again; the counts say how many.

A backend that cannot capture (a served model, a scripted chat) refuses a request with ``capture`` in one
line; served generators stay post-hoc (docs/loop.md, "Captured in the loop").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads only when a capture runs
    from attnprobe_hooks.scoring import QueryScorer

CAPTURED_IN_THE_LOOP = "captured in the loop"  # the stamp a capture made this way carries (meta "captured")


@dataclass(frozen=True)
class SidePlan:
    """Token ids to score at ``positions`` (strictly increasing, each < ``len(ids)``) without generating,
    from the episode's kept cache: the kept tokens they share are not run again (module docstring)."""

    ids: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class CaptureSpec:
    """What to score while generating one request (see the module docstring).

    ``positions``: prompt positions (strictly increasing, each < the prompt's length) whose query rows are
    scored in this call's prefill (the decision is the last prompt position, ``len(prompt) - 1``).
    ``reply_start``: also score the reply's first token, at position ``len(prompt)``.
    ``layers``: model layers to score (None: every attention layer).
    ``token_segment``: the segment of every key position ``0 .. len(prompt)`` (the last one: the reply's
    first token), with ``num_segments`` segments; None: one segment per key position (per-key rows).
    """

    positions: tuple[int, ...]
    reply_start: bool = True
    layers: tuple[int, ...] | None = None
    token_segment: tuple[int, ...] | None = None
    num_segments: int = 0
    before: tuple[SidePlan, ...] = ()  # scored first, from the episode's kept cache (per-key rows)

    def __post_init__(self) -> None:
        pos = [int(p) for p in self.positions]
        if any(b <= a for a, b in zip(pos, pos[1:])) or (pos and pos[0] < 0):
            raise ValueError(f"capture positions must be non-negative and strictly increasing; got {pos}")
        if self.token_segment is not None and self.num_segments < 1:
            raise ValueError("a capture spec with token_segment needs num_segments >= 1")

    def query_positions(self, prompt_length: int, replied: bool = True) -> list[int]:
        """Every position scored for a prompt of ``prompt_length`` tokens: the listed ones, then the reply's
        first token (when asked and a token was generated)."""
        if self.positions and self.positions[-1] >= prompt_length:
            raise ValueError(f"capture position {self.positions[-1]} is outside the prompt of {prompt_length} tokens")
        return [*map(int, self.positions), *([prompt_length] if self.reply_start and replied else [])]

    def segments(self, prompt_length: int) -> tuple[list[int], int]:
        """(segment of every key position 0 .. ``prompt_length``, number of segments) for the scorer."""
        n = prompt_length + 1
        if self.token_segment is None:
            return list(range(n)), n
        if len(self.token_segment) != n:
            raise ValueError(f"token_segment has {len(self.token_segment)} entries for {n} key positions "
                             f"(the prompt's {prompt_length} and the reply's first token)")
        return [int(s) for s in self.token_segment], int(self.num_segments)


@dataclass
class LoopCapture:
    """What a request's capture brought back (:attr:`attnprobe.generation.chat.ChatReply.capture`).

    ``scorer``: on the host; its ``query_positions`` are :meth:`CaptureSpec.query_positions` (the reply
    start only when a token was generated). ``token_ids``: the tokens the rows saw (the prompt, then the
    reply's first token), so a caller checks them against its rendering of the recorded call.
    ``prefilled``: prompt tokens run in this call (the rest came from the episode's kept cache);
    ``info``: backend notes recorded with the capture (``attention_calls``, ``num_key_value_heads``,
    ``head_dim``, ``batch_rows``: rows in the decode step that scored the reply start). ``side``: the side
    plans' captures (their ``token_ids`` are the plan's ids, ``prefilled`` the tokens run for it).
    """

    scorer: QueryScorer
    token_ids: list[int]
    prefilled: int
    info: dict[str, Any] = field(default_factory=dict)
    side: list[LoopCapture] = field(default_factory=list)  # one per CaptureSpec.before, in order
