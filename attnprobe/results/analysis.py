"""Analyses of captured scores (seed 002, appendix E): per-step turn x role masses, the per-trajectory
heatmap, 20-bin decay curves and the headline shares. Pure numpy on stored scores: no model needed.

Two conventions for chat-template tokens (docs/methods.md):

- ``"seed002"`` (default): markers belong to the message they open or close (E.3: "chat-template
  markers identify system, user, reasoning, tool-call, and observation segments") and the first
  (sink) token to the system segment, so per-step shares over system, user, past reasoning, tool
  calls, observations and the current step sum to 1 and cumulative past-turn shares stay below 1
  (E.5). Computed from the stored per-token row (the mean over scored layers and heads, exactly
  E.3's "averaged across layers and heads"), so it is not available for one layer or head.
- ``"separate"``: template tokens form their own ``template`` role (segment level, any layer/head).

Steps are the reasoning-start queries of kind ``"reasoning"`` (an assistant message with reasoning
text). Tool-call-only messages give queries of kind ``"action"``, left out unless asked for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from attnprobe.render.segments import ROLES
from attnprobe.results.result import CaptureResult

R = {r: i for i, r in enumerate(ROLES)}
CONVENTIONS = ("seed002", "separate")
STEP_PARTS = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "current_step", "template")
"""A step's categories as :func:`step_breakdown` lists them (:func:`category_shares` with ``template`` its own)."""
STEP_KINDS = ("reasoning",)
# End-of-message markers of the common chat templates (ChatML, Llama 3, Gemma, Mistral, DeepSeek).
END_MARKER = re.compile(r"^\s*(<\|?(im_end|eot_id|eom_id|end_of_turn|end|endoftext|eos)\|?>|</s>|<end_of_turn>"
                        r"|<｜end▁of▁sentence｜>)\s*$")


def _check_convention(convention: str, layer: int | None, head: int | None) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}")
    if convention == "seed002" and (layer is not None or head is not None):
        raise ValueError("the seed002 convention works on the stored per-token row, which is the mean over layers "
                         "and heads; for one layer or head use convention='separate'")


def token_owners(result: CaptureResult) -> tuple[np.ndarray, np.ndarray]:
    """(turn [n], role index [n]) of every token under the seed002 convention.

    In a run of template tokens, the tokens up to and including the last end-of-message marker (and
    whitespace right after it) close the previous message; the rest open the next message. A leading
    run closes the (possibly template-injected) system prompt; a trailing run (the generation prompt)
    opens the current step. Token 0 (the attention sink) is system. Without stored token texts no
    marker can be found and every template run opens the next message.
    """
    segs = result.segments
    texts = result.token_texts()
    n = len(result.input_ids)
    turn = np.zeros(n, dtype=np.int64)
    role = np.zeros(n, dtype=np.int64)
    content = [i for i, s in enumerate(segs) if s.role != "template"]
    for i, s in enumerate(segs):
        if s.role != "template":
            turn[s.start:s.end], role[s.start:s.end] = s.turn, R[s.role]
            continue
        prev = next((segs[j] for j in reversed(content) if j < i), None)
        nxt = next((segs[j] for j in content if j > i), None)
        ends = [p for p in range(s.start, s.end) if END_MARKER.match(texts[p] or "")]
        cut = s.start
        if ends:
            cut = ends[-1] + 1
            while cut < s.end and texts[cut] and not texts[cut].strip():
                cut += 1
        closing = (prev.turn, R[prev.role]) if prev is not None else (0, R["system"])
        opening = (nxt.turn, R[nxt.role]) if nxt is not None else (s.turn, R["reasoning"])
        turn[s.start:cut], role[s.start:cut] = closing
        turn[cut:s.end], role[cut:s.end] = opening
    if n:
        turn[0], role[0] = 0, R["system"]
    return turn, role


def step_masses(result: CaptureResult, *, convention: str = "seed002", kinds: Sequence[str] = STEP_KINDS,
                layer: int | None = None, head: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(turns [k], mass [k, T, len(ROLES)]) for the queries of the given kinds, in query order.

    mass[q, j, r]: attention from query q to the tokens of turn j and role r (the ``template``
    column is zero under seed002)."""
    _check_convention(convention, layer, head)
    idx = [i for i, q in enumerate(result.queries) if q.kind in kinds]
    turns = np.asarray([result.queries[i].turn for i in idx], dtype=np.int64)
    if convention == "separate":
        return turns, result.turn_role_attention(layer, head)[idx]
    T = result.num_turns
    tok_turn, tok_role = token_owners(result)
    keys = tok_turn * len(ROLES) + tok_role
    rows = np.asarray(result.token_attention, dtype=np.float64)[idx]
    out = np.zeros((len(idx), T * len(ROLES)))
    for k in range(len(idx)):
        out[k] = np.bincount(keys, weights=rows[k], minlength=T * len(ROLES))[: T * len(ROLES)]
    return turns, out.reshape(len(idx), T, len(ROLES))


PAST = {"past_reasoning": "reasoning", "past_tool_call": "tool_call", "past_observation": "observation"}
"""The past-turn categories and the role each takes from turns before the step's."""
STEP_ROLES = ("reasoning", "tool_call", "observation", "template")
"""Roles whose tokens at the step's own turn (or later) are the current step, unless a category of their own."""


def category_masks(turn: np.ndarray, role: np.ndarray, step_turn: int, roles: Sequence[str] = ROLES, *,
                   own: Sequence[str] = ("template",)) -> dict[str, np.ndarray]:
    """Seed 002's split of what a step attends to (section 5.3.1, E.3), the one grouping every study uses:
    per category a boolean over the cells (tokens, or (turn, role) cells) given by ``turn`` and ``role``
    (indices into ``roles``): system, task, past reasoning / tool calls / observations (turns before
    ``step_turn``), every role in ``own`` as its own category (all turns: ``template`` under the
    "separate" convention; ``placeholder`` and ``refined`` in counterfactual contexts), and the current
    step (the other :data:`STEP_ROLES` at ``step_turn`` and after). The categories are disjoint."""
    ix = {r: i for i, r in enumerate(roles)}
    past = turn < step_turn
    out = {"system": role == ix["system"], "task": role == ix["task"]}
    out.update({name: past & (role == ix[r]) for name, r in PAST.items()})
    out.update({r: role == ix[r] for r in own})
    now = [ix[r] for r in STEP_ROLES if r in ix and r not in own]
    out["current_step"] = ~past & np.isin(role, now)
    return out


def category_shares(mass: np.ndarray, step_turn: int, roles: Sequence[str] = ROLES, *,
                    own: Sequence[str] = ("template",)) -> dict[str, float]:
    """:func:`category_masks`' categories summed over one step's ``mass[turn, role]`` table (columns in
    ``roles`` order): the attention share of each, float."""
    mass = np.asarray(mass)
    ix = {r: i for i, r in enumerate(roles)}
    past = mass[:step_turn]
    out = {"system": float(mass[:, ix["system"]].sum()), "task": float(mass[:, ix["task"]].sum())}
    out.update({name: float(past[:, ix[r]].sum()) for name, r in PAST.items()})
    out.update({r: float(mass[:, ix[r]].sum()) for r in own})
    now = [ix[r] for r in STEP_ROLES if r in ix and r not in own]
    out["current_step"] = float(mass[step_turn:, now].sum())
    return out


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
            observation_roles: Sequence[str] = ("observation",), *, convention: str | None = None) -> Heatmap:
    """convention: default seed002 for the layer/head mean, separate for one layer or head."""
    convention = convention or ("seed002" if layer is None and head is None else "separate")
    turns, tr = step_masses(result, convention=convention, layer=layer, head=head)
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


def _past_bins(t: int, bins: int) -> np.ndarray:
    """Bin (0 oldest .. bins-1 newest) of each past turn j < t at x = j / (t - 1)."""
    x = np.arange(t) / (t - 1) if t > 1 else np.ones(1)
    return np.minimum((x * bins).astype(int), bins - 1)


def decay_curves(results: Iterable[CaptureResult], *, bins: int = 20, min_past: int = 5,
                 roles: Sequence[str] = ("reasoning", "tool_call", "observation"), convention: str = "seed002",
                 kinds: Sequence[str] = STEP_KINDS, layer: int | None = None, head: int | None = None) -> dict:
    """Seed 002 E.5: mean role attention per normalised past-turn position, and the cumulative share.

    Past turn j of step t sits at x = j / (t - 1) (0 oldest, 1 newest) in ``bins`` equal-width bins;
    only steps with at least ``min_past`` past turns count. ``mean[r][b]``: mean attention to role r
    of a past turn in bin b. ``cumulative[r][b]``: mean over steps of the attention to role r in the
    newest b + 1 bins, accumulated from the newest turn back (x axis ``cumulative_x`` = fraction of
    past turns counted from the newest); it stays below 1 because system, user and the current step
    take the rest.
    """
    sums = {r: np.zeros(bins) for r in roles}
    counts = np.zeros(bins)
    cum = {r: [] for r in (*roles, "all")}
    n_steps = 0
    for res in results:
        turns, tr = step_masses(res, convention=convention, kinds=kinds, layer=layer, head=head)
        for t, row in zip(turns, tr):
            if t < min_past:
                continue
            n_steps += 1
            b = _past_bins(int(t), bins)
            np.add.at(counts, b, 1)
            per_bin_all = np.zeros(bins)
            for r in roles:
                vals = row[:t, R[r]]
                np.add.at(sums[r], b, vals)
                per_bin = np.zeros(bins)
                np.add.at(per_bin, b, vals)
                per_bin_all += per_bin
                cum[r].append(np.cumsum(per_bin[::-1]))
            cum["all"].append(np.cumsum(per_bin_all[::-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = {r: np.where(counts > 0, sums[r] / counts, np.nan) for r in roles}
    cumulative = {r: (np.mean(v, axis=0) if v else np.full(bins, np.nan)) for r, v in cum.items()}
    centers = (np.arange(bins) + 0.5) / bins
    return {"centers": centers, "mean": mean, "cumulative": cumulative, "cumulative_x": (np.arange(bins) + 1) / bins,
            "counts": counts, "num_steps": n_steps, "bins": bins, "min_past": min_past, "convention": convention}


def window_weights(t: int, fraction: float) -> np.ndarray:
    """Share of each past turn j < t inside the newest ``fraction`` of past turns.

    Turn j occupies the fractional interval [j/t, (j+1)/t) of the normalised past (0 oldest, 1
    newest); its weight is the part of that interval inside [1 - fraction, 1], as a share of the
    interval (in [0, 1]). At t = 5 the newest 10% is half of the latest turn; the weights sum to
    ``fraction * t`` turns."""
    j = np.arange(t, dtype=np.float64)
    lo = np.maximum(j / t, 1.0 - fraction)
    return np.clip(((j + 1) / t - lo) * t, 0.0, 1.0)


def _bins_window(t: int, bins: int, newest_bins: int) -> np.ndarray:
    """The old reading (kept for comparison): 1 for past turns whose 20-bin position x = j/(t-1)
    falls in the newest ``newest_bins`` bins, else 0."""
    return (_past_bins(t, bins) >= bins - newest_bins).astype(np.float64)


RECENCY = {"recent10_observation": ("observation", None), "midpoint_observation": ("observation", 0.5),
           "midpoint_reasoning": ("reasoning", 0.5)}
"""Within-role recency shares: (role, window fraction; None = ``recent_fraction``)."""
RECENCY_AGGREGATIONS = {"": "mean of per-step ratios", "_pooled": "ratio of aggregated mass"}


def headline(results: CaptureResult | Iterable[CaptureResult], *, convention: str = "seed002", min_past: int = 5,
             bins: int = 20, recent_fraction: float = 0.1, include_actions: bool = False,
             layer: int | None = None, head: int | None = None) -> dict:
    """Seed 002 section 5.3.1's numbers, every one over the same steps.

    ``steps``: reasoning steps with >= ``min_past`` past turns (tool-call-only action steps too when
    ``include_actions``). Per step, the attention mass to system, user, past reasoning, past tool
    calls, past observations and the current step (plus ``template`` under "separate") sums to 1;
    the ``*_share`` values are their means over the steps.

    Within-role recency (``recent10_observation``: the newest ``recent_fraction`` of past turns;
    ``midpoint_*``: the newest half), over steps where the role has any past attention. Each past
    turn j of step t covers [j/t, (j+1)/t) and counts with the part of it inside the window
    (:func:`window_weights`). Two aggregations: ``<name>_share`` = mean over steps of the per-step
    ratio window mass / role mass (the primary: every step weighs the same, as in the other shares);
    ``<name>_share_pooled`` = summed window mass / summed role mass (steps weighted by their role
    mass; what a cumulative curve of the aggregated mass reads). ``<name>_share_bins``: the old
    reading from the 20-bin positions x = j/(t-1), for comparison; ``window_turns_bins``: the mean
    share of past turns that reading counted (the nominal share is the fraction itself).
    """
    if isinstance(results, CaptureResult):
        results = [results]
    kinds = ("reasoning", "action") if include_actions else STEP_KINDS
    keys = ("system", "user", "past_reasoning", "past_tool_call", "past_observation", "current_step", "template")
    per: dict[str, list[float]] = {k: [] for k in keys}
    fracs = {name: recent_fraction if f is None else f for name, (_, f) in RECENCY.items()}
    win: dict[str, list[tuple[float, float, float]]] = {name: [] for name in RECENCY}  # (window, total, bins window)
    coverage: dict[str, list[float]] = {name: [] for name in RECENCY}
    for res in results:
        turns, tr = step_masses(res, convention=convention, kinds=kinds, layer=layer, head=head)
        for t, row in zip(turns, tr):
            t = int(t)
            if t < min_past:
                continue
            shares = category_shares(row, t)
            for k in keys:
                per[k].append(shares["task" if k == "user" else k])
            for name, (role, _) in RECENCY.items():
                past = np.asarray(row[:t, R[role]], dtype=np.float64)
                old = _bins_window(t, bins, max(1, math.ceil(fracs[name] * bins)))
                coverage[name].append(float(old.mean()))
                if past.sum() > 0:
                    win[name].append((float(past @ window_weights(t, fracs[name])), float(past.sum()),
                                      float(past @ old)))

    def mean(v):
        return float(np.mean(v)) if len(v) else float("nan")

    out = {"steps": len(per["system"]), "convention": convention, "min_past": min_past,
           "include_actions": include_actions}
    for k in keys:
        if k == "template" and convention == "seed002":
            continue
        out[f"{k}_share"] = mean(per[k])
    for name, v in win.items():
        w, tot, old = (np.asarray(x) for x in zip(*v)) if v else (np.zeros(0),) * 3
        out[f"{name}_share"] = mean(w / tot) if len(tot) else float("nan")
        out[f"{name}_share_pooled"] = float(w.sum() / tot.sum()) if len(tot) else float("nan")
        out[f"{name}_share_bins"] = mean(old / tot) if len(tot) else float("nan")
    out.update({
        "within_role_steps": {name: len(v) for name, v in win.items()},
        "window_turns_bins": {name: mean(v) for name, v in coverage.items()},
        "recency": {"positions": "fractional: past turn j of step t covers [j/t, (j+1)/t)",
                    "aggregation": RECENCY_AGGREGATIONS[""], "pooled": RECENCY_AGGREGATIONS["_pooled"],
                    "fractions": fracs},
        "recent_fraction": recent_fraction, "bins": bins,
    })
    pr, po = out["past_reasoning_share"], out["past_observation_share"]
    out["reasoning_vs_observation"] = pr / (pr + po) if (pr + po) > 0 else float("nan")
    return out


def step_breakdown(result: CaptureResult, layer: int | None = None, head: int | None = None, *,
                   convention: str | None = None, include_actions: bool = False) -> dict:
    """Per step: attention to system, task, past reasoning / tool calls / observations, the current
    turn, and template text (zero under seed002); shares of the full softmax row, they sum to 1."""
    convention = convention or ("seed002" if layer is None and head is None else "separate")
    kinds = ("reasoning", "action") if include_actions else STEP_KINDS
    turns, tr = step_masses(result, convention=convention, kinds=kinds, layer=layer, head=head)
    rows = []
    for t, row in zip(turns, tr):
        shares = category_shares(row, int(t))
        rows.append({"turn": int(t), **{k: shares[k] for k in STEP_PARTS}})
    return {"steps": rows, "convention": convention}
