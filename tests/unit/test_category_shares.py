"""One category-share function (issue 28): seed 002's split of a step's attention, used by the headline,
the step breakdown, the counterfactual groups and the loop's per-call shares."""

from __future__ import annotations

import numpy as np

from attnprobe.render.segments import ROLES
from attnprobe.results.analysis import category_masks, category_shares

R = {r: i for i, r in enumerate(ROLES)}


def _table():
    """[3 turns, roles]: every (turn, role) cell a distinct power of two, so each sum names its cells."""
    m = np.zeros((3, len(ROLES)))
    for t in range(3):
        for r in ("system", "task", "reasoning", "tool_call", "observation", "template"):
            m[t, R[r]] = 2.0 ** (t * 8 + R[r])
    return m


def test_shares_split_past_and_current_and_template_by_choice():
    m = _table()
    s = category_shares(m, 2)
    assert s["past_observation"] == m[0, R["observation"]] + m[1, R["observation"]]
    assert s["current_step"] == m[2, R["reasoning"]] + m[2, R["tool_call"]] + m[2, R["observation"]]
    assert s["template"] == m[:, R["template"]].sum()
    assert sum(s.values()) == m.sum()  # disjoint and complete
    # the counterfactual and loop reading: template tokens of the step's turn are the current step
    s2 = category_shares(m, 2, own=())
    assert "template" not in s2 and s2["current_step"] == s["current_step"] + m[2, R["template"]]
    assert s2["past_reasoning"] == s["past_reasoning"]


def test_token_masks_agree_with_the_table_sums():
    rng = np.random.default_rng(0)
    roles = (*ROLES, "placeholder", "refined")
    turn = rng.integers(0, 4, 200)
    role = rng.integers(0, len(roles), 200)
    w = rng.random(200)
    masks = category_masks(turn, role, 2, roles, own=("placeholder", "refined"))
    table = np.zeros((4, len(roles)))
    np.add.at(table, (turn, role), w)
    shares = category_shares(table, 2, roles, own=("placeholder", "refined"))
    assert list(masks) == list(shares) == ["system", "task", "past_reasoning", "past_tool_call", "past_observation",
                                           "placeholder", "refined", "current_step"]
    for k, mask in masks.items():
        assert np.isclose(w[mask].sum(), shares[k], rtol=1e-12, atol=1e-12)
    assert not np.any(sum(m.astype(int) for m in masks.values()) > 1)  # disjoint
