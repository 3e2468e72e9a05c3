"""Position control of the IBIS attentional gap (issue 19 item 7, issue 26 item 7).

The length-matched gap is not position-matched: under the matched protocol the own query sits a
constant 17 tokens (SmolLM2) further from the decision token than the observer's. A placebo taken at
distances both framings share cannot see that offset (a pure-distance model with no ownership gives
gap - placebo != 0), and a regression on a constant difference is not identified. The control is
therefore built into the prompt: the ``observer_shifted`` framing is the matched observer with a
neutral filler after the quoted query, as many tokens as move it to the agentic query's distance
(:func:`shifted_observer`, equal by construction and checked on the token ids). The gap at equal
distance = agentic - observer_shifted query mass, per item. The placebo and the regression stay as
descriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.stats import bootstrap_mean_ci
from attnprobe.stats import rounded as _r

SHIFTED = "observer_shifted"  # capture folder name of the position-control framing

POSITION_CONTROL = (
    "position control of the attentional gap (ours; issue 19 item 7). distance = tokens from the query's last token "
    "to the decision token. placebo = n_q (the query's length) times the mean attention per token on the results "
    "tokens at the SAME distances from the decision token in both framings (the mean over every n_q-token span of "
    "that range): identical, external content in both framings, so its agentic - observer gap is what the framings "
    "differ by at matched position and length without any ownership; gap_minus_placebo = per item (query gap - placebo "
    "gap). regression = the per-item gap regressed on the distance difference (agentic - observer); its intercept is "
    "the gap at equal distance, identified only when the difference varies across items. "
    "at_equal_distance (the position-controlled gap, adjusted_gap; issue 26 item 7) = per item, agentic query mass "
    "- the query mass of the observer_shifted framing: the matched observer with a neutral filler (' .' repeated) "
    "after the quoted query, as many tokens as put the query's last token at the agentic distance from the decision "
    "token (equal by construction, checked on the token ids). Under attention that depends only on distance it is 0; "
    "what it cannot remove: the filler's own tokens (a longer prompt) and the different text between the query and the "
    "decision token")


def placebo_ranges(results_a: tuple[int, int], results_o: tuple[int, int], decision_a: int, decision_o: int,
                   n: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Token ranges [start, end) of the results tokens whose distances from the decision token are common
    to both framings (the same distances in both; the text is the same results block, shifted by the
    framings' tail difference); None when that range holds fewer than ``n`` tokens (the query's length).

    ``results_f`` = [start, end) of the results tokens; ``decision_f`` = the decision token's position.
    Distance of token t = decision - t. The placebo is the mean over every ``n``-token span in the
    range, i.e. ``n`` times the mean attention per token there: no single span's content (a block's
    first tokens draw more attention) decides it."""
    near = max(decision_a - (results_a[1] - 1), decision_o - (results_o[1] - 1))  # smallest common distance
    far = min(decision_a - results_a[0], decision_o - results_o[0])  # largest common distance
    if n < 1 or far - near + 1 < n:
        return None
    return ((decision_a - far, decision_a - near + 1), (decision_o - far, decision_o - near + 1))


def query_distance(rendered, trajectory) -> int:
    """Tokens from the query's last token to the decision token of a rendered IBIS framing."""
    from attnprobe.studies.ibis.framings import segment_categories

    ends = [sg.end for sg, c in zip(rendered.segments, segment_categories(rendered.segments, trajectory))
            if c == "query"]
    if not ends:
        raise AttnprobeError(f"{trajectory.id}: no query segment")
    return int(rendered.decision.position) - (max(ends) - 1)


def shifted_observer(item, tokenizer, protocol=None, *, max_steps: int = 8):
    """The matched observer framing padded so that its query is exactly as far from the decision token as
    the agentic framing's (:data:`POSITION_CONTROL`). Returns (trajectory, pad). The pad count is searched
    on the rendered token ids (a filler unit that merges with its neighbours is corrected for); an item
    whose distances cannot be made equal is refused, naming the distances. ``protocol``: the run's
    :class:`~attnprobe.studies.ibis.framings.IbisProtocol` (the matched protocol; None: its default)."""
    from attnprobe.render.rendering import render
    from attnprobe.studies.ibis.framings import IbisProtocol, build_framing

    protocol = protocol or IbisProtocol("matched")
    if protocol.name != "matched":
        raise ValueError(f"the position control is the matched protocol's, not the {protocol.name} protocol's")
    agentic = build_framing(item, "agentic", protocol)
    target = query_distance(render(agentic, tokenizer, add_generation_prompt=True), agentic)
    pad, seen = 0, {}
    for _ in range(max_steps):
        traj = build_framing(item, "observer", protocol, pad=pad)
        d = query_distance(render(traj, tokenizer, add_generation_prompt=True), traj)
        if d == target:
            traj.id = f"{item.id}/{SHIFTED}"
            traj.meta["ibis"]["framing"] = SHIFTED
            return traj, pad
        seen[pad] = d
        pad = max(0, pad + target - d)
        if pad in seen:
            break
    raise AttnprobeError(f"item {item.id}: the observer query cannot be moved to the agentic distance ({target} "
                         f"tokens) with the filler {{pad: distance}} = {seen}")


def position_control(qa: np.ndarray, qo: np.ndarray, pa: np.ndarray, po: np.ndarray, da: np.ndarray,
                     do: np.ndarray, *, n_boot: int, seed: int, nd: int = 4, qs: np.ndarray | None = None,
                     ds: np.ndarray | None = None) -> dict[str, Any]:
    """The position control beside the attentional gap (:data:`POSITION_CONTROL`), from per-item arrays:
    ``qa``/``qo`` query mass (agentic/observer), ``pa``/``po`` placebo mass (NaN where an item has no
    placebo window), ``da``/``do`` the query's distance to the decision token; ``qs``/``ds`` the same for
    the observer_shifted framing (None when it was not captured: then there is no adjusted gap)."""
    qa, qo, pa, po = (np.asarray(x, dtype=np.float64) for x in (qa, qo, pa, po))
    da, do = np.asarray(da, dtype=np.float64), np.asarray(do, dtype=np.float64)
    dd = da - do
    out: dict[str, Any] = {"definition": POSITION_CONTROL, "n": len(qa),
                           "distance": {"agentic": _r(da.mean(), 2), "observer": _r(do.mean(), 2),
                                        "difference_mean": _r(dd.mean(), 2), "difference_sd": _r(dd.std(), 3),
                                        "difference_range": [_r(dd.min(), 2), _r(dd.max(), 2)]}}
    ok = ~(np.isnan(pa) | np.isnan(po))
    out["placebo"] = {"n": int(ok.sum())}
    if ok.any():
        gp = pa[ok] - po[ok]
        lo, hi = bootstrap_mean_ci(gp, n_boot=n_boot, seed=seed)
        out["placebo"].update(agentic=_r(pa[ok].mean(), nd), observer=_r(po[ok].mean(), nd), gap=_r(gp.mean(), nd),
                              ci95=[_r(lo, nd), _r(hi, nd)])
        diff = (qa[ok] - qo[ok]) - gp
        lo, hi = bootstrap_mean_ci(diff, n_boot=n_boot, seed=seed)
        out["gap_minus_placebo"] = {"gap": _r(diff.mean(), nd), "ci95": [_r(lo, nd), _r(hi, nd)],
                                    "n": int(ok.sum())}
    gap = qa - qo
    if len(gap) >= 3 and dd.std() > 0:
        slope, icept = np.polyfit(dd, gap, 1)
        lo, hi = _intercept_ci(gap, dd, n_boot=min(n_boot, 2000), seed=seed)
        out["regression"] = {"slope_per_token": _r(slope, 6), "intercept": _r(icept, nd),
                             "intercept_ci95": [_r(lo, nd), _r(hi, nd)],
                             "note": "intercept = the gap extrapolated to equal distance; trust it only when the "
                                     "difference range includes or nears 0"}
    else:
        out["regression"] = {"intercept": None, "reason": "the distance difference does not vary across items "
                                                         f"(always {_r(dd.mean(), 2) if len(dd) else None} tokens): "
                                                         "a regression on it is not identified; see the placebo"}
    if qs is not None and ds is not None and len(qs):
        qs, ds = np.asarray(qs, dtype=np.float64), np.asarray(ds, dtype=np.float64)
        off = np.abs(da - ds)
        if off.max() > 0:
            raise AttnprobeError(f"observer_shifted captures are not at the agentic distance (off by up to "
                                 f"{int(off.max())} tokens): recapture them with today's attnprobe")
        g = qa - qs
        lo, hi = bootstrap_mean_ci(g, n_boot=n_boot, seed=seed)
        out["at_equal_distance"] = {"gap": _r(g.mean(), nd), "ci95": [_r(lo, nd), _r(hi, nd)], "n": len(g),
                                    "agentic": _r(qa.mean(), nd), "observer_shifted": _r(qs.mean(), nd),
                                    "distance": _r(ds.mean(), 2),
                                    "share_items_positive": _r(float((g > 0).mean()), 4)}
        out["adjusted_gap"], out["adjusted_gap_ci95"] = out["at_equal_distance"]["gap"], out["at_equal_distance"]["ci95"]
    else:
        out["at_equal_distance"] = None
        out["adjusted_gap"] = out["adjusted_gap_ci95"] = None
        out["adjusted_gap_reason"] = ("no observer_shifted captures in this folder (captured before issue 26): rerun "
                                      "'attnprobe ibis capture --protocol matched' on it (only they are captured)")
    return out


def _intercept_ci(y: np.ndarray, x: np.ndarray, *, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap (items resampled) of the OLS intercept of y on x; resamples in which x does
    not vary (no line) are skipped."""
    idx = np.random.default_rng(seed).integers(0, len(y), (n_boot, len(y)))
    xs, ys = x[idx], y[idx]
    xm, ym = xs.mean(1, keepdims=True), ys.mean(1, keepdims=True)
    sxx = ((xs - xm) ** 2).sum(1)
    ok = sxx > 0
    slope = ((xs - xm) * (ys - ym)).sum(1)[ok] / sxx[ok]
    icept = ym[ok, 0] - slope * xm[ok, 0]
    return (float(np.percentile(icept, 2.5)), float(np.percentile(icept, 97.5))) if ok.any() else (np.nan, np.nan)


def position_inputs(folder: Path, item_ids: list[str]) -> dict[str, np.ndarray]:
    """The per-item arrays of :func:`position_control`, read from the captures (captures/<item>/<framing>/):
    query and placebo mass from the stored per-token row (the mean over scored layers and heads, the same
    average the gap uses), the distances from the segments. ``qs``/``ds`` (the observer_shifted framing)
    only when every item has that capture."""
    from attnprobe.results.result import META_FILE, CaptureResult
    from attnprobe.studies.ibis.layout import ModelFolderLayout

    layout = ModelFolderLayout(Path(folder))
    shifted = bool(item_ids) and all((layout.capture(i, SHIFTED) / META_FILE).is_file() for i in item_ids)
    cols: dict[str, list[float]] = {k: [] for k in ("qa", "qo", "pa", "po", "da", "do", "qs", "ds")}
    for iid in item_ids:
        info = {}
        for fr in ("agentic", "observer") + ((SHIFTED,) if shifted else ()):
            res = CaptureResult.load(layout.capture(iid, fr))
            cats = res.meta.get("ibis", {}).get("categories") or []
            row = np.asarray(res.token_attention[-1], dtype=np.float64)
            decision = len(res.input_ids) - 1
            q = [(sg.start, sg.end) for sg, c in zip(res.segments, cats) if c == "query"]
            r = [(sg.start, sg.end) for sg, c in zip(res.segments, cats) if c == "results"]
            if not q or not r:
                raise AttnprobeError(f"{layout.capture(iid, fr)}: no query or results segment")
            info[fr] = {"row": row, "decision": decision, "q": (q[0][0], q[-1][1]), "r": (r[0][0], r[-1][1])}
        a, o = info["agentic"], info["observer"]
        n_q = a["q"][1] - a["q"][0]
        cols["qa"].append(float(a["row"][a["q"][0]:a["q"][1]].sum()))
        cols["qo"].append(float(o["row"][o["q"][0]:o["q"][1]].sum()))
        cols["da"].append(a["decision"] - (a["q"][1] - 1))
        cols["do"].append(o["decision"] - (o["q"][1] - 1))
        if shifted:
            sh = info[SHIFTED]
            cols["qs"].append(float(sh["row"][sh["q"][0]:sh["q"][1]].sum()))
            cols["ds"].append(sh["decision"] - (sh["q"][1] - 1))
        win = placebo_ranges(a["r"], o["r"], a["decision"], o["decision"], n_q)
        if win is None:
            cols["pa"].append(float("nan"))
            cols["po"].append(float("nan"))
        else:  # n_q times the mean attention per token over the common-distance range
            cols["pa"].append(n_q * float(a["row"][win[0][0]:win[0][1]].mean()))
            cols["po"].append(n_q * float(o["row"][win[1][0]:win[1][1]].mean()))
    out = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    if not shifted:
        out["qs"] = out["ds"] = None
    return out
