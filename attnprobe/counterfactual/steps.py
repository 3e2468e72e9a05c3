"""Which steps of a trajectory a counterfactual run looks at (seed 002 E.5's filter by default)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnprobe.agents.policies import policy_name
from attnprobe.agents.tagtext import agent_view
from attnprobe.errors import AttnprobeError
from attnprobe.render.rendering import message_turns
from attnprobe.trajectory.schema import Trajectory, message_text


@dataclass(frozen=True)
class Step:
    """Step t of a trajectory: the assistant message at ``message_index``, in turn ``turn``."""

    trajectory: Trajectory
    message_index: int
    turn: int

    @property
    def key(self) -> str:
        return f"step_{self.message_index:04d}"


def is_reasoning_message(msg: dict) -> bool:
    """Seed 002: a reasoning step is an assistant message with reasoning text (not only tool calls)."""
    return msg["role"] == "assistant" and bool(
        message_text(msg.get("content")).strip() or (msg.get("reasoning_content") or "").strip())


def choose_steps(traj: Trajectory, *, min_past: int = 5, include_actions: bool = False,
                 turns: Sequence[int] | None = None, max_steps: int | None = None) -> list[Step]:
    """Steps with at least ``min_past`` past turns (reasoning steps only unless ``include_actions``),
    or exactly the given ``turns``; at most ``max_steps`` (the first ones). The steps hold the trajectory
    as its agent saw it (:func:`attnprobe.agents.tagtext.agent_view`: an IRCoT loop's history as tag text)."""
    traj = agent_view(traj)
    tt = message_turns(traj.messages)
    out = []
    for i, m in enumerate(traj.messages):
        if m["role"] != "assistant" or i == 0:
            continue
        if not (include_actions or is_reasoning_message(m)):
            continue
        if (tt[i] in turns) if turns is not None else tt[i] >= min_past:
            out.append(Step(traj, i, tt[i]))
    return out[:max_steps] if max_steps is not None else out


def plan_steps(trajectories: Sequence[Trajectory], policies: Sequence, *, min_past: int = 5,
               include_actions: bool = False, turns: Sequence[int] | None = None,
               max_steps: int | None = None) -> tuple[list[str], list[Step]]:
    """(policy names, chosen steps) of a run; refuses no policy, duplicate names and no step at all.
    ``policies``: policy objects or specs (``"mask:5"``)."""
    from attnprobe.agents.policies import parse_policy

    if not policies:
        raise ValueError("no policy given")
    names = [policy_name(parse_policy(p) if isinstance(p, str) else p) for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be distinct: {names}")
    steps = [s for t in trajectories for s in choose_steps(t, min_past=min_past, include_actions=include_actions,
                                                           turns=turns, max_steps=max_steps)]
    if not steps:
        what = f"turns {list(turns)}" if turns is not None else f"reasoning steps with >= {min_past} past turns"
        raise AttnprobeError(f"no step qualifies ({what}); lower --min-past or pick --turns")
    return names, steps
