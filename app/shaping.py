"""What a context policy did, as every page draws it (no Streamlit): placeholders and refined text as
their own roles with one legend, the turns a policy changed as tick labels, and the turn heatmap's cells
(steps with enough past turns, sequential ranges where zero is white, blank cells where no observation
exists). The Study and Trajectory pages and ``common``'s role bars share these."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from attnprobe_app.study_data import Step

HEATMAP_MIN_PAST = 2  # a turn heatmap of one call needs >= 2 past turns to show anything but one cell
KEY_COLUMNS = ("setting", "placeholder", "refined", "current step")  # what masking and refining are about
EXTRA_ROLES = ("placeholder", "refined")  # history messages a policy replaced: their own role on every page
EXTRA_ROLE_COLORS = {"placeholder": "#e377c2", "refined": "#bcbd22"}
ROLE_LEGEND = ("placeholder: an observation the policy replaced by a short note (masking); refined: text the "
               "policy rewrote (refinement); removed: messages the policy dropped (not in the context, so "
               "never attended; counted per step).")


def past_turns(num_turns: int) -> int:
    """Past turns of a recorded call's capture: every turn before the reply's own (the last)."""
    return max(int(num_turns) - 1, 0)


def heatmap_steps(steps: list[Step], min_past: int = HEATMAP_MIN_PAST) -> list[int]:
    """The captured steps that get a turn heatmap: those whose capture has at least ``min_past`` past turns
    (a first call's 1x1 heatmap says nothing)."""
    return [s.step for s in steps if s.capture and s.num_turns is not None and past_turns(s.num_turns) >= min_past]


def sequential_range(*arrays) -> tuple[float, float]:
    """Colour limits (0, max) over the finite cells of ``arrays``: a sequential scale where zero is white;
    (0, 1) when nothing is above zero (so an all-zero map stays white, never a full colour)."""
    vals = [np.asarray(a, dtype=np.float64) for a in arrays]
    finite = np.concatenate([v[np.isfinite(v)].ravel() for v in vals]) if vals else np.zeros(0)
    hi = float(finite.max()) if finite.size else 0.0
    return (0.0, hi if hi > 0 else 1.0)


def observation_cells(observation: np.ndarray, has_observation: list[bool]) -> np.ndarray:
    """The heatmap's observation triangle with the rows of turns that have no observation blanked (NaN):
    a zero there is no attention to an observation that does not exist, not low attention."""
    out = np.array(observation, dtype=np.float64, copy=True)
    for j, has in enumerate(has_observation[: out.shape[0]]):
        if not has:
            out[j, :] = np.nan
    return out


def message_status(meta: dict) -> dict[int, str]:
    """Message index (of the messages a recorded call sent) -> ``placeholder`` / ``refined`` for the
    messages the context policy replaced, from the capture's ``trajectory_meta.history`` (``source``: the
    full-history index of each sent message; ``changes``: full-history index -> kind)."""
    hist = ((meta or {}).get("trajectory_meta") or {}).get("history") or {}
    source, changes = hist.get("source") or [], hist.get("changes") or {}
    refined = {str(i) for i in hist.get("refined") or []}
    out = {}
    for i, src in enumerate(source):
        kind = changes.get(str(src)) if isinstance(changes, dict) else None
        if kind in EXTRA_ROLES:
            out[i] = kind
        elif str(src) in refined:
            out[i] = "refined"
    return out


def removed_count(meta: dict) -> int:
    """Full-history messages the policy dropped from this call's context (``removed`` / ``calls_removed``)."""
    changes = ((((meta or {}).get("trajectory_meta") or {}).get("history") or {}).get("changes") or {})
    return sum(1 for k in changes.values() if k in ("removed", "calls_removed")) if isinstance(changes, dict) else 0


def segment_roles(segments, meta: dict) -> list[str]:
    """Each segment's role for display: ``placeholder`` / ``refined`` for segments of a message the policy
    replaced (:func:`message_status`), else its own role (system, task, reasoning, ...)."""
    status = message_status(meta)
    return [status.get(getattr(s, "message_index", -1), s.role) for s in segments]


def token_roles_with_policy(token_roles, segments, meta: dict, names=None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per-token role indices into ``names`` (the capture's roles, then :data:`EXTRA_ROLES`), the tokens of a
    message the policy replaced (:func:`segment_roles`) under placeholder / refined: the token strip draws
    them in their own colours, never as observations."""
    from attnprobe.render.segments import ROLES

    names = tuple(names or (*ROLES, *EXTRA_ROLES))
    out = np.array(token_roles, dtype=np.int64, copy=True)
    for seg, role in zip(segments, segment_roles(segments, meta)):
        if role in EXTRA_ROLES:
            out[seg.start:seg.end] = names.index(role)
    return out, names


def turn_role_mass(att_row, segments, roles: list[str], num_turns: int) -> dict[str, np.ndarray]:
    """Attention of one query summed per (role, turn), roles as :func:`segment_roles` gives them; only
    roles that occur."""
    out: dict[str, np.ndarray] = {}
    for s, r, v in zip(segments, roles, np.asarray(att_row, dtype=np.float64)):
        out.setdefault(r, np.zeros(num_turns))[s.turn] += v
    return out


def key_columns_first(rows: list[dict]) -> list[dict]:
    """The same rows with :data:`KEY_COLUMNS` (those present) first, so a wide table shows them unscrolled."""
    if not rows:
        return rows
    first = [c for c in KEY_COLUMNS if c in rows[0]]
    return [{**{c: r[c] for c in first}, **{k: v for k, v in r.items() if k not in first}} for r in rows]


def turn_status(segments, meta: dict) -> dict[int, str]:
    """Turn -> ``placeholder`` / ``refined`` for the turns holding a message the policy replaced (the
    heatmap's tick labels say so)."""
    status = message_status(meta)
    return {s.turn: status[s.message_index] for s in segments if getattr(s, "message_index", -1) in status}


def turn_ticks(num_turns: int, status: dict[int, str]) -> list[str]:
    """Integer turn labels, ``3 (placeholder)`` where the turn's observation was replaced."""
    return [f"{t} ({status[t]})" if t in status else str(t) for t in range(num_turns)]
