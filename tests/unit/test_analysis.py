"""Heatmap, decay curves and headline shares against hand-computed values on constructed results.

`chatml()` builds a capture by hand: ChatML-style marker tokens around every message, token-level
attention rows chosen by the test, and segment sums derived from them exactly as capture stores
them (so both conventions can be checked against numbers worked out here).
"""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results import analysis
from attnprobe.results.result import CaptureResult

ROLE_HEADER = {"system": "system", "task": "user", "reasoning": "assistant", "call": "assistant", "observation": "tool"}


def chatml(messages, queries, rows, *, bos=True):
    """messages: [(role, turn, [token texts])] where role is a segment role (tool calls are a second
    role inside the assistant message: give ("reasoning+call", turn, [reasoning tokens], [call tokens])).
    queries: [(kind, message index)] -> query at the first token of that message's content.
    rows: function(query index, token texts, token (role, turn) labels) -> attention row (sums to 1)."""
    toks: list[tuple[str, str, int, int]] = []  # (text, role, turn, message index)
    if bos:
        toks.append(("<s>", "template", 0, 0))
    firsts = {}
    for mi, msg in enumerate(messages):
        role, turn = msg[0], msg[1]
        header = ROLE_HEADER["reasoning" if role.startswith("reasoning") else role]
        toks += [("<|im_start|>", "template", turn, mi), (f"{header}\n", "template", turn, mi)]
        firsts[mi] = len(toks)
        if role == "reasoning+call":
            toks += [(x, "reasoning", turn, mi) for x in msg[2]] + [(x, "tool_call", turn, mi) for x in msg[3]]
        elif role == "call":
            toks += [(x, "tool_call", turn, mi) for x in msg[2]]
        else:
            toks += [(x, role, turn, mi) for x in msg[2]]
        toks += [("<|im_end|>", "template", turn, mi), ("\n", "template", turn, mi)]
    text, offsets = "", []
    for x, *_ in toks:
        offsets.append((len(text), len(text) + len(x)))
        text += x
    # Segments: maximal runs; a template run takes the turn/message of the next part (as render does).
    for i in range(len(toks) - 1, -1, -1):
        if toks[i][1] == "template":
            nxt = next((x for x in toks[i + 1:] if x[1] != "template"), None)
            if nxt is not None:
                toks[i] = (toks[i][0], "template", nxt[2], nxt[3])
    segs, start = [], 0
    for i in range(1, len(toks) + 1):
        if i == len(toks) or toks[i][1:] != toks[start][1:]:
            role, turn, mi = toks[start][1:]
            segs.append(Segment(role, "self" if role in ("reasoning", "tool_call") else "external", turn, mi,
                                start, i, "template" if role == "template" else "content"))
            start = i
    qpoints = [QueryPoint(firsts[mi], kind, messages[mi][1], mi) for kind, mi in queries]
    labels = [(r, t) for _, r, t, _ in toks]
    tok = np.stack([np.asarray(rows(k, [x for x, *_ in toks], labels), dtype=np.float64)
                    for k in range(len(qpoints))])
    for k, q in enumerate(qpoints):
        assert np.all(tok[k, q.position + 1:] == 0) and tok[k].sum() == pytest.approx(1.0)
    seg = np.stack([[tok[k, s.start:s.end].sum() for s in segs] for k in range(len(qpoints))])
    lh = np.repeat(seg[:, None, None, :], 2, axis=1).repeat(3, axis=2)
    return CaptureResult("hand", np.arange(len(toks)), segs, qpoints, [0, 1], seg, lh, tok.astype(np.float32),
                         meta={"model": "m"}, text=text, offsets=np.asarray(offsets))


def uniform_rows(k, texts, labels, positions):
    row = np.zeros(len(texts))
    row[: positions[k] + 1] = 1.0 / (positions[k] + 1)
    return row


def trajectory(T):
    """system, task, then per turn t: assistant (reasoning + call), tool observation."""
    msgs = [("system", 0, ["S1", "S2"]), ("task", 0, ["Q"])]
    for t in range(T):
        msgs.append(("reasoning+call", t, [f"r{t}a", f"r{t}b"], [f"c{t}"]))
        msgs.append(("observation", t, [f"o{t}a", f"o{t}b", f"o{t}c"]))
    return msgs


def test_markers_belong_to_the_message_they_open_or_close():
    msgs = [("task", 0, ["Q"]), ("reasoning+call", 0, ["r"], ["c"]), ("observation", 0, ["o"]),
            ("call", 1, ["c1"])]

    def rows(k, texts, labels):
        row = np.zeros(len(texts))
        row[:8] = 1 / 8
        return row

    res = chatml(msgs, [("reasoning", 1)], rows)
    turn, role = analysis.token_owners(res)
    texts = res.token_texts()
    got = [(x, analysis.ROLES[r], int(t)) for x, r, t in zip(texts, role, turn)]
    assert got[:12] == [
        ("<s>", "system", 0),  # the sink token is system
        ("<|im_start|>", "task", 0), ("user\n", "task", 0), ("Q", "task", 0),
        ("<|im_end|>", "task", 0), ("\n", "task", 0),  # the closing marker and its newline: the message it closes
        ("<|im_start|>", "reasoning", 0), ("assistant\n", "reasoning", 0),  # the opening marker: the next message
        ("r", "reasoning", 0), ("c", "tool_call", 0), ("<|im_end|>", "tool_call", 0), ("\n", "tool_call", 0)]
    # a tool-call-only assistant message opens with tool_call tokens
    assert got[-4][1:] == ("tool_call", 1)
    # under seed002 no mass is left on "template"; under separate the 7 marker tokens of the row are template
    _, m = analysis.step_masses(res, convention="seed002")
    assert m[0, :, analysis.R["template"]].sum() == 0
    assert m[0, 0, analysis.R["task"]] == pytest.approx(5 / 8) and m[0, 0, analysis.R["system"]] == pytest.approx(1 / 8)
    _, s = analysis.step_masses(res, convention="separate")
    assert s[0, :, analysis.R["template"]].sum() == pytest.approx(7 / 8)


def test_headline_shares_by_hand():
    # Steps at turns 5 and 6 (>= 5 past turns); a step at turn 2 must not enter any number.
    T = 7
    msgs = trajectory(T)
    reasoning_msgs = [2 + 2 * t for t in range(T)]
    queries = [("reasoning", reasoning_msgs[t]) for t in (2, 5, 6)]
    pos = {}

    def rows(k, texts, labels):
        t_step = (2, 5, 6)[k]
        row = np.zeros(len(texts))
        # Put mass by (role, turn) exactly: system 0.1, user 0.1, current step 0.1,
        # past reasoning 0.4 (0.1 on turn t-1, 0.3 on turn 0), past observations 0.3 (0.2 on turn t-1, 0.1 on turn 1).
        def put(role, turn, w):
            idx = [i for i, (r, tt) in enumerate(labels) if r == role and tt == turn]
            row[idx] += w / len(idx)
        put("system", 0, 0.1)
        put("task", 0, 0.1)
        q = next(i for i, (r, tt) in enumerate(labels) if r == "reasoning" and tt == t_step)
        row[q] += 0.1  # the query token itself = current step
        pos[k] = q
        put("reasoning", t_step - 1, 0.1)
        put("reasoning", 0, 0.3)
        put("observation", t_step - 1, 0.2)
        put("observation", 1, 0.1)
        return row

    res = chatml(msgs, queries, rows, bos=False)
    for conv in ("seed002", "separate"):
        h = analysis.headline(res, convention=conv)
        assert h["steps"] == 2
        assert h["system_share"] == pytest.approx(0.1) and h["user_share"] == pytest.approx(0.1)
        assert h["past_reasoning_share"] == pytest.approx(0.4)
        assert h["past_observation_share"] == pytest.approx(0.3)
        assert h["past_tool_call_share"] == pytest.approx(0.0)
        assert h["current_step_share"] == pytest.approx(0.1)
        total = sum(v for k, v in h.items() if k.endswith("_share") and k.startswith(
            ("system", "user", "past_", "current", "template")))
        assert total == pytest.approx(1.0)
        # Within-role from the newest turn back, turn j of step t on [j/t, (j+1)/t): observations 0.2 on
        # the newest past turn, 0.1 on turn 1 (older half). Newest 10%: half of turn 4 at t = 5 (0.1 / 0.3),
        # 0.6 of turn 5 at t = 6 (0.12 / 0.3); the same totals, so both aggregations agree.
        assert h["recent10_observation_share"] == pytest.approx((1 / 3 + 0.4) / 2)
        assert h["recent10_observation_share_pooled"] == pytest.approx(0.22 / 0.6)
        assert h["recent10_observation_share_bins"] == pytest.approx(2 / 3)  # old: the whole newest turn
        assert h["midpoint_observation_share"] == pytest.approx(2 / 3)
        # reasoning: 0.1 on the newest past turn, 0.3 on turn 0: 0.25 by midpoint.
        assert h["midpoint_reasoning_share"] == pytest.approx(0.25)
        assert h["recency"]["aggregation"] == "mean of per-step ratios"
        assert h["reasoning_vs_observation"] == pytest.approx(0.4 / 0.7)


def test_action_steps_are_kept_out_unless_asked_for():
    T = 7
    msgs = trajectory(T) + [("call", T, ["c_only"])]
    queries = [("reasoning", 2 + 2 * 5), ("action", len(msgs) - 1)]
    positions = {}

    def rows(k, texts, labels):
        q = [i for i, (r, t) in enumerate(labels) if (r, t) == (("reasoning", 5) if k == 0 else ("tool_call", T))][0]
        positions[k] = q
        return uniform_rows(k, texts, labels, positions)

    res = chatml(msgs, queries, rows)
    assert analysis.headline(res)["steps"] == 1
    assert analysis.headline(res, include_actions=True)["steps"] == 2
    assert len(analysis.step_breakdown(res)["steps"]) == 1


def test_decay_cumulative_runs_from_the_newest_turn_back():
    T = 8
    msgs = trajectory(T)
    qs = [("reasoning", 2 + 2 * t) for t in (5, 7)]
    positions = {}

    def rows(k, texts, labels):
        t = (5, 7)[k]
        positions[k] = next(i for i, (r, tt) in enumerate(labels) if r == "reasoning" and tt == t)
        return uniform_rows(k, texts, labels, positions)

    res = chatml(msgs, qs, rows)
    d = analysis.decay_curves([res], bins=20, min_past=5)
    turns, m = analysis.step_masses(res)
    assert d["num_steps"] == 2 and d["convention"] == "seed002"
    obs = analysis.R["observation"]
    # cumulative[0]: the newest bin only = the newest past turn of each step
    assert d["cumulative"]["observation"][0] == pytest.approx(np.mean([m[k, t - 1, obs] for k, t in enumerate(turns)]))
    # cumulative[-1]: all past turns; below 1 (system, user and the current step take the rest)
    whole = np.mean([m[k, :t, obs].sum() for k, t in enumerate(turns)])
    assert d["cumulative"]["observation"][-1] == pytest.approx(whole)
    assert d["cumulative"]["all"][-1] < 1 and np.all(np.diff(d["cumulative"]["all"]) >= 0)
    assert d["cumulative_x"][0] == pytest.approx(0.05) and d["cumulative_x"][-1] == pytest.approx(1.0)
    # mean per bin: bin 19 holds the newest past turn of each step
    assert d["mean"]["reasoning"][19] == pytest.approx(np.mean([m[k, t - 1, analysis.R["reasoning"]]
                                                                for k, t in enumerate(turns)]))


def test_heatmap_by_hand_and_layer_head_views():
    T = 7
    msgs = trajectory(T)
    qs = [("reasoning", 2 + 2 * t) for t in range(T)]
    positions = {}

    def rows(k, texts, labels):
        positions[k] = next(i for i, (r, tt) in enumerate(labels) if r == "reasoning" and tt == k)
        return uniform_rows(k, texts, labels, positions)

    res = chatml(msgs, qs, rows)
    hm = analysis.heatmap(res)
    turns, m = analysis.step_masses(res)
    assert hm.reasoning[5, 2] == pytest.approx(m[5, 2, analysis.R["reasoning"]])
    assert hm.observation[2, 5] == pytest.approx(m[5, 2, analysis.R["observation"]])  # transposed
    assert np.isnan(np.diag(hm.reasoning)).all() and np.isnan(hm.reasoning[2, 5])
    # one layer / head: segment level ("separate"); here every head equals the mean
    hl = analysis.heatmap(res, layer=1, head=2)
    tr = res.turn_role_attention()
    assert hl.reasoning[5, 2] == pytest.approx(tr[5, 2, analysis.R["reasoning"]])
    with pytest.raises(ValueError, match="mean over layers"):
        analysis.step_masses(res, convention="seed002", layer=1)
    for row in analysis.step_breakdown(res)["steps"]:
        assert sum(v for k, v in row.items() if k != "turn") == pytest.approx(1.0)
        assert row["template"] == 0.0


def test_window_weights_are_the_fractional_overlap():
    np.testing.assert_allclose(analysis.window_weights(5, 0.1), [0, 0, 0, 0, 0.5])  # half of the latest turn
    np.testing.assert_allclose(analysis.window_weights(3, 0.5), [0, 0.5, 1])
    np.testing.assert_allclose(analysis.window_weights(20, 0.1), [0] * 18 + [1, 1])
    np.testing.assert_allclose(analysis.window_weights(4, 1.0), [1, 1, 1, 1])
    for t in range(1, 40):
        for f in (0.1, 0.5):
            assert analysis.window_weights(t, f).sum() == pytest.approx(f * t)


def test_recency_uniform_masses_and_both_aggregations():
    # Uniform rows: every token up to the query gets the same mass, so each past turn's observation
    # (3 tokens) holds the same mass; the share in a window is then its nominal fraction of past turns.
    T = 9
    msgs = trajectory(T)
    steps = (5, 8)
    positions = {}

    def rows(k, texts, labels):
        positions[k] = next(i for i, (r, tt) in enumerate(labels) if r == "reasoning" and tt == steps[k])
        return uniform_rows(k, texts, labels, positions)

    res = chatml(msgs, [("reasoning", 2 + 2 * t) for t in steps], rows)
    h = analysis.headline(res)
    assert h["recent10_observation_share"] == pytest.approx(0.1)
    assert h["recent10_observation_share_pooled"] == pytest.approx(0.1)
    assert h["midpoint_observation_share"] == pytest.approx(0.5)
    assert h["midpoint_reasoning_share"] == pytest.approx(0.5)
    # The old 20-bin reading counts the whole newest turn at t = 5 (1 of 5) and t = 8 (1 of 8) as "10%",
    # and turns with x = j/(t-1) >= 0.5 as the half (3 of 5: j = 2, 3, 4; 4 of 8: j = 4..7).
    assert h["recent10_observation_share_bins"] == pytest.approx((1 / 5 + 1 / 8) / 2)
    assert h["midpoint_observation_share_bins"] == pytest.approx((3 / 5 + 4 / 8) / 2)
    assert h["window_turns_bins"]["recent10_observation"] == pytest.approx((1 / 5 + 1 / 8) / 2)


def test_pooled_and_mean_of_ratios_differ_when_role_totals_differ():
    T = 6
    msgs = trajectory(T)

    def rows(k, texts, labels):
        row = np.zeros(len(texts))
        q = next(i for i, (r, tt) in enumerate(labels) if r == "reasoning" and tt == 5)

        def put(role, turn, w):
            idx = [i for i, (r, tt) in enumerate(labels) if r == role and tt == turn]
            row[idx] += w / len(idx)
        # step 0: observation mass 0.1 all on turn 4; step 1: 0.4 all on turn 0. Newest half of t = 5:
        # turns 3 and 4 whole, turn 2 half.
        put("observation", 4 if k == 0 else 0, 0.1 if k == 0 else 0.4)
        row[q] += 1 - row.sum()
        return row

    res = chatml(msgs, [("reasoning", 2 + 2 * 5), ("reasoning", 2 + 2 * 5)], rows)
    h = analysis.headline(res)
    assert h["midpoint_observation_share"] == pytest.approx(0.5)  # ratios 1 and 0
    assert h["midpoint_observation_share_pooled"] == pytest.approx(0.1 / 0.5)
    assert h["recent10_observation_share"] == pytest.approx(0.25)  # ratios 0.5 and 0
    assert h["recent10_observation_share_pooled"] == pytest.approx(0.05 / 0.5)
