"""Analyses of captured scores (seed 002, appendix E): per-step turn x role views, the per-trajectory
heatmap, 20-bin decay curves and the headline shares. Pure numpy on stored scores: no model needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from attnprobe.render.segments import ROLES
from attnprobe.results.result import CaptureResult

R = {r: i for i, r in enumerate(ROLES)}


def reasoning_steps(result: CaptureResult, layer: int | None = None, head: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(turns [k], turn_role [k, T, R]) for the reasoning-start queries, one per reasoning step."""
    tr = result.turn_role_attention(layer, head)
    idx = [i for i, q in enumerate(result.queries) if q.kind == "reasoning"]
    turns = np.asarray([result.queries[i].turn for i in idx], dtype=np.int64)
    return turns, tr[idx]


@dataclass
class Heatmap:
    """reasoning[t, j] (j < t): attention from step t to turn j's reasoning (lower triangle);
    observation[j, t] (j < t): attention from step t to turn j's observations (upper triangle,
    transposed). Diagonal and unused cells are NaN; colour limits exclude the diagonal."""

    reasoning: np.ndarray
    observation: np.ndarray
    reasoning_clim: tuple[float, float]
    observation_clim: tuple[float, float]
    steps: np.ndarray


def _clim(m: np.ndarray) -> tuple[float, float]:
    vals = m[np.isfinite(m)]
    return (0.0, float(vals.max())) if vals.size else (0.0, 1.0)


def heatmap(result: CaptureResult, layer: int | None = None, head: int | None = None,
            reasoning_roles: Sequence[str] = ("reasoning",),
            observation_roles: Sequence[str] = ("observation",)) -> Heatmap:
    turns, tr = reasoning_steps(result, layer, head)
    T = result.num_turns
    rea = np.full((T, T), np.nan)
    obs = np.full((T, T), np.nan)
    if len(turns):
        rsum = tr[:, :, [R[r] for r in reasoning_roles]].sum(-1)  # [steps, T]
        osum = tr[:, :, [R[r] for r in observation_roles]].sum(-1)
        kk, jj = np.nonzero(np.arange(T)[None, :] < turns[:, None])  # every (step, past turn) pair
        rea[turns[kk], jj] = rsum[kk, jj]
        obs[jj, turns[kk]] = osum[kk, jj]
    return Heatmap(rea, obs, _clim(rea), _clim(obs), turns)


def decay_curves(results: Iterable[CaptureResult], *, bins: int = 20, min_past: int = 5,
                 roles: Sequence[str] = ("reasoning", "tool_call", "observation"),
                 layer: int | None = None, head: int | None = None) -> dict:
    """Mean role attention per normalised past-turn position, and the mean cumulative share.

    Past turn j of step t sits at x = j / (t - 1) (0 oldest, 1 most recent) in ``bins`` equal-width
    bins; only steps with at least ``min_past`` past turns count. The cumulative share of a step is
    the attention to past turns in bins <= b; it stays below 1 because system, task and the
    current step take the rest.
    """
    sums = {r: np.zeros(bins) for r in roles}
    counts = np.zeros(bins)
    cum = {r: [] for r in (*roles, "all")}
    n_steps = 0
    for res in results:
        turns, tr = reasoning_steps(res, layer, head)
        for t, row in zip(turns, tr):
            if t < min_past:
                continue
            n_steps += 1
            js = np.arange(t)
            x = js / (t - 1) if t > 1 else np.ones(1)
            b = np.minimum((x * bins).astype(int), bins - 1)
            np.add.at(counts, b, 1)
            per_bin_all = np.zeros(bins)
            for r in roles:
                vals = row[js, R[r]]
                np.add.at(sums[r], b, vals)
                per_bin = np.zeros(bins)
                np.add.at(per_bin, b, vals)
                per_bin_all += per_bin
                cum[r].append(np.cumsum(per_bin))
            cum["all"].append(np.cumsum(per_bin_all))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = {r: np.where(counts > 0, sums[r] / counts, np.nan) for r in roles}
    cumulative = {r: (np.mean(v, axis=0) if v else np.full(bins, np.nan)) for r, v in cum.items()}
    centers = (np.arange(bins) + 0.5) / bins
    return {"centers": centers, "mean": mean, "cumulative": cumulative, "counts": counts, "num_steps": n_steps,
            "bins": bins, "min_past": min_past}


def headline(results: Iterable[CaptureResult], *, min_past: int = 5, recent_fraction: float = 0.1,
             layer: int | None = None, head: int | None = None) -> dict:
    """The paper-style headline numbers over every reasoning step.

    past_reasoning / past_observation: mean per-step attention mass to all past turns' reasoning
    (and tool calls) vs observations; reasoning_vs_observation: the reasoning share of their sum.
    recent_observation_share: of the attention to past observations, the share on the most recent
    ceil(10%) of past turns (steps with >= min_past past turns).
    """
    past_r, past_c, past_o, recent = [], [], [], []
    for res in results:
        turns, tr = reasoning_steps(res, layer, head)
        for t, row in zip(turns, tr):
            if t < 1:
                continue
            past_r.append(row[:t, R["reasoning"]].sum())
            past_c.append(row[:t, R["tool_call"]].sum())
            obs = row[:t, R["observation"]]
            past_o.append(obs.sum())
            if t >= min_past and obs.sum() > 0:
                k = max(1, math.ceil(recent_fraction * t))
                recent.append(obs[t - k:].sum() / obs.sum())
    pr, pc, po = (float(np.mean(v)) if v else float("nan") for v in (past_r, past_c, past_o))
    return {
        "num_steps": len(past_r),
        "past_reasoning": pr, "past_tool_call": pc, "past_observation": po,
        "reasoning_vs_observation": pr / (pr + po) if (pr + po) > 0 else float("nan"),
        "recent_observation_share": float(np.mean(recent)) if recent else float("nan"),
        "recent_steps": len(recent), "recent_fraction": recent_fraction,
    }


def step_breakdown(result: CaptureResult, layer: int | None = None, head: int | None = None) -> dict:
    """Per reasoning step: attention to system, task, past reasoning / tool calls / observations,
    the current turn, and template text (shares of the full softmax row; they sum to 1)."""
    turns, tr = reasoning_steps(result, layer, head)
    rows = []
    for t, row in zip(turns, tr):
        past = row[:t]
        rows.append({
            "turn": int(t),
            "system": float(row[:, R["system"]].sum()),
            "task": float(row[:, R["task"]].sum()),
            "past_reasoning": float(past[:, R["reasoning"]].sum()),
            "past_tool_call": float(past[:, R["tool_call"]].sum()),
            "past_observation": float(past[:, R["observation"]].sum()),
            "current_step": float(row[t:, [R["reasoning"], R["tool_call"], R["observation"]]].sum()),
            "template": float(row[:, R["template"]].sum()),
        })
    return {"steps": rows}
