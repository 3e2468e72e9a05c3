"""The numbers of one (step, policy): removed mass, where it went, by original turn and role.

Two masses of the original row (issue 26 item 8; docs/methods.md):

- ``removed_mass``: on the original tokens ABSENT from the counterfactual context (:func:`absent_tokens`):
  what the model can no longer read. A refiner's kept sentences and the markers of a masked message
  are still there, so they are not in it.
- ``changed_message_mass``: on every token of every message the policy changed (removed, masked,
  refined), markers included, on dropped tool calls, and on every other absent token (a token of a
  message whose calls were dropped that tokenizes differently without them): the mass the
  redistribution is measured against (it sums to this one by identity). So the removed mass is part
  of it by construction (issue 37). Before issue 26 this number was called the removed mass.

Every token of both contexts is owned by one ORIGINAL message under the seed-002 convention
(:func:`attnprobe.results.analysis.token_owners`: markers belong to the message they delimit, token 0
to the system prompt) and takes that message's original turn; tokens of a placeholder or a refined
observation get role ``placeholder`` / ``refined`` (:data:`CF_ROLES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from difflib import SequenceMatcher

import numpy as np

from attnprobe.agents.policies import Counterfactual
from attnprobe.counterfactual.steps import Step
from attnprobe.render.segments import ROLES
from attnprobe.results.analysis import category_shares, token_owners
from attnprobe.results.result import CaptureResult

CF_ROLES = (*ROLES, "placeholder", "refined")
RI = {r: i for i, r in enumerate(CF_ROLES)}
QUERY_NAMES = ("decision", "reasoning")
GROUPS = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "placeholder", "refined",
          "current_step")
REMOVING = ("removed", "placeholder", "refined")


def token_messages(result: CaptureResult) -> np.ndarray:
    """Message index owning every token under the seed-002 convention (-1: the trailing generation
    prompt); :func:`token_owners` run on segments whose turn is their message index."""
    segs = [replace(s, turn=s.message_index) for s in result.segments]
    owner, _ = token_owners(replace(result, segments=segs))
    return owner


def absent_tokens(original: CaptureResult, counterfactual: CaptureResult, source: Sequence[int],
                  changes: Mapping[int, str]) -> np.ndarray:
    """Per original token: True when it is absent from the counterfactual context.

    A message the policy kept is present whole. A changed message's tokens are aligned with the tokens
    of the counterfactual messages built from it (``source[k] == i``; its placeholder, refined text or
    call-less copy) by :class:`difflib.SequenceMatcher` on token ids (matching blocks, in order, no junk
    heuristic); the tokens left unmatched are absent. A removed message has no counterpart: all of its
    tokens, markers included, are absent."""
    o_owner, c_owner = token_messages(original), token_messages(counterfactual)
    o_ids, c_ids = np.asarray(original.input_ids), np.asarray(counterfactual.input_ids)
    src = np.asarray(list(source), dtype=np.int64)
    absent = np.zeros(len(o_ids), dtype=bool)
    for i, status in changes.items():
        if status == "kept":
            continue
        idx = np.nonzero(o_owner == int(i))[0]
        if not len(idx):
            continue
        local = np.nonzero(src == int(i))[0]
        b = c_ids[np.isin(c_owner, local)].tolist() if len(local) else []
        matched = np.zeros(len(idx), dtype=bool)
        for blk in SequenceMatcher(None, o_ids[idx].tolist(), b, autojunk=False).get_matching_blocks():
            matched[blk.a:blk.a + blk.size] = True
        absent[idx[~matched]] = True
    return absent


def token_labels(result: CaptureResult, source: Sequence[int], step_index: int, statuses: dict[int, str],
                 orig_turns: Sequence[int], *, counterfactual: bool = True) -> dict[str, np.ndarray]:
    """Per token: original message, original turn, role in :data:`CF_ROLES`, and whether it belongs
    to a removed span (its message was removed / masked / refined, or it is a dropped tool call).

    ``source[k]`` is the original index of local message k; a local index past ``source`` (the
    appended step message) or -1 (the generation prompt) maps to ``step_index``. In a counterfactual
    context the tokens of placeholder / refined messages get those roles; in the original they keep
    their own (observation)."""
    local = token_messages(result)
    _, role = token_owners(result)
    src = np.asarray([*source, step_index], dtype=np.int64)
    orig = np.where((local >= 0) & (local < len(src)), src[np.clip(local, 0, len(src) - 1)], step_index)
    turns = np.asarray(orig_turns, dtype=np.int64)[orig]
    status = np.asarray([statuses.get(int(m), "kept") for m in orig], dtype=object)
    role = role.copy()
    if counterfactual:
        role[status == "placeholder"] = RI["placeholder"]
        role[status == "refined"] = RI["refined"]
    removed = np.isin(status, REMOVING) | ((status == "calls_removed") & (role == RI["tool_call"]))
    return {"message": orig, "turn": turns, "role": role, "removed": removed, "status": status}


def turn_role_mass(rows: np.ndarray, turn: np.ndarray, role: np.ndarray, num_turns: int) -> np.ndarray:
    """[nq, T, len(CF_ROLES)] sums of the per-token rows (float64)."""
    keys = turn * len(CF_ROLES) + role
    size = num_turns * len(CF_ROLES)
    out = np.stack([np.bincount(keys, weights=r, minlength=size)[:size] for r in np.asarray(rows, np.float64)])
    return out.reshape(len(rows), num_turns, len(CF_ROLES))


def groups(mass: np.ndarray, turn: int) -> dict[str, float]:
    """Coarse destinations of one [T, R] table for step ``turn`` (seed 002's headline split, plus
    placeholder and refined text)."""
    return category_shares(mass, turn, CF_ROLES, own=("placeholder", "refined"))


def step_analysis(original: CaptureResult, counterfactual: CaptureResult, cf: Counterfactual, step: Step,
                  orig_turns: Sequence[int]) -> tuple[dict, dict[str, np.ndarray]]:
    """The per-query numbers of one (step, policy): removed mass (absent tokens), mass on changed messages,
    redistribution (against the changed messages' mass), conservation. ``removed_by_status`` and
    ``removed_by_message`` split the mass on changed messages."""
    T = step.turn + 1
    n_all = len(step.trajectory.messages)
    lo = token_labels(original, list(range(n_all)), step.message_index, cf.changes, orig_turns, counterfactual=False)
    lc = token_labels(counterfactual, cf.source, step.message_index, cf.changes, orig_turns)
    absent = absent_tokens(original, counterfactual, cf.source, cf.changes)
    # Removed (absent) tokens are changed tokens by construction (issue 37): a message whose calls were dropped
    # counts its tool-call tokens as changed, and also any other token of it that the counterfactual no longer
    # holds (text at the edge of the dropped call that tokenizes differently without it). Before, such a token
    # was in the removed mass but not in the changed one (shipped ircot:oq: removed 6.71% > changed 6.34%).
    lo["removed"] = lo["removed"] | absent
    # Tokens after the step belong to later turns; causal attention gives them exactly zero mass.
    ro, rc = np.asarray(original.token_attention, np.float64), np.asarray(counterfactual.token_attention, np.float64)
    to, tc = np.minimum(lo["turn"], T - 1), np.minimum(lc["turn"], T - 1)
    m_orig = turn_role_mass(ro, to, lo["role"], T)
    kept_w = ro * ~lo["removed"][None, :]
    m_kept = turn_role_mass(kept_w, to, lo["role"], T)
    m_cf = turn_role_mass(rc, tc, lc["role"], T)
    obs = lo["role"] == RI["observation"]
    queries = {}
    for q, name in enumerate(QUERY_NAMES):
        changed = float(ro[q][lo["removed"]].sum())
        by_status = {s: float(ro[q][lo["removed"] & (lo["status"] == s)].sum())
                     for s in (*REMOVING, "calls_removed") if np.any(lo["removed"] & (lo["status"] == s))}
        by_msg = {}
        for m in np.unique(lo["message"][lo["removed"]]):
            by_msg[str(int(m))] = float(ro[q][lo["removed"] & (lo["message"] == m)].sum())
        g_orig, g_kept, g_cf = groups(m_orig[q], step.turn), groups(m_kept[q], step.turn), groups(m_cf[q], step.turn)
        queries[name] = {
            "original_total": float(ro[q].sum()), "counterfactual_total": float(rc[q].sum()),
            "removed_mass": float(ro[q][absent].sum()), "changed_message_mass": changed,
            "kept_mass": float(kept_w[q].sum()),
            "removed_observation_mass": float(ro[q][absent & obs].sum()),
            "changed_observation_mass": float(ro[q][lo["removed"] & obs].sum()),
            "removed_by_status": by_status, "removed_by_message": by_msg,
            "original": g_orig, "original_kept": g_kept, "counterfactual": g_cf,
            "redistribution": {k: g_cf[k] - g_kept[k] for k in GROUPS},
        }
    arrays = {"mass_original": m_orig.astype(np.float32), "mass_original_kept": m_kept.astype(np.float32),
              "mass_counterfactual": m_cf.astype(np.float32),
              "removed_tokens": lo["removed"].astype(np.int8), "absent_tokens": absent.astype(np.int8),
              "counterfactual_roles": lc["role"].astype(np.int8),
              "counterfactual_turns": lc["turn"].astype(np.int64)}
    return queries, arrays
