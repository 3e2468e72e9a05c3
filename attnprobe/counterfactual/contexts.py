"""One rendered context of a step (prefix + the step's own message) and its two query positions."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from attnprobe.capture.api import prepare
from attnprobe.capture.models import LoadedModel
from attnprobe.errors import AttnprobeError
from attnprobe.render.rendering import Rendered
from attnprobe.render.segments import QueryPoint
from attnprobe.trajectory.schema import Trajectory


@dataclass
class Context:
    """One rendered context (prefix + the step's message) and its two query positions."""

    trajectory: Trajectory
    rendered: Rendered
    points: list[QueryPoint]  # [decision, reasoning start]
    decision_exact: bool  # the prefix's own rendering is a token prefix of this one
    prefix_tokens: int  # tokens the model reads before generating step t


def build_context(model: LoadedModel, base: Trajectory, prefix: list[dict], step_msg: dict, tag: str, *,
                  rendering: str, max_tokens: int | None) -> Context:
    """Render ``prefix + [step_msg]`` and find the decision and reasoning-start positions.

    The decision position is the rendering's own (:func:`attnprobe.render.rendering.decision_point`):
    the last token of the generation prompt before the step, else the token just before the step's first
    own token; the same position ``attnprobe capture`` and ``study attention`` query on a recorded call.
    ``decision_exact`` says that the prefix rendered with the generation prompt on its own is a token prefix
    of this rendering ending at that position (False for a template that re-renders history when a message
    follows, or a tokenizer that merges the prompt's last characters with the step's first: Llama 3)."""
    k = len(prefix)
    full = Trajectory(id=f"{base.id}#{tag}", messages=[*prefix, step_msg], task=base.task, model=base.model,
                      framing=base.framing, tools=base.tools, labels=base.labels, meta=base.meta)
    r = prepare(model, full, rendering=rendering, max_tokens=max_tokens)
    starts = [q for q in r.queries_reasoning if q.message_index == k]
    if not starts:
        raise AttnprobeError(f"trajectory {base.id!r}, message {k}: the step message has no reasoning or "
                             f"tool-call tokens to query")
    rs = starts[0]
    pre = prepare(model, replace(full, messages=list(prefix)), rendering=r.rendering, max_tokens=max_tokens)
    n = len(pre.input_ids)
    dpos = r.decision.position
    if r.decision.message_index != k or not 0 <= dpos < rs.position:  # decision_point's rule, checked
        raise AttnprobeError(f"trajectory {base.id!r}, message {k}: the rendering's decision "
                             f"({r.decision.position}) is not before the step ({rs.position})")
    exact = n - 1 == dpos and np.array_equal(r.input_ids[:n], pre.input_ids)
    dec = QueryPoint(int(dpos), "decision", rs.turn, k)
    return Context(full, r, [dec, QueryPoint(rs.position, "reasoning", rs.turn, k)], bool(exact), int(dpos + 1))
