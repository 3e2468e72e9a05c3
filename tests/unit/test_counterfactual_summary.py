"""Summaries of hand-written step records: means, Wilson intervals, conservation, the study table."""

from __future__ import annotations

import pytest

from attnprobe.cli.study import study_markdown
from attnprobe.counterfactual.run import GROUPS
from attnprobe.counterfactual.summary import markdown_table, summarize


def record(policy, traj, removed, obs, saved, changed, red):
    groups = {g: 0.0 for g in GROUPS}
    q = {"removed_mass": removed, "removed_observation_mass": obs, "redistribution": {**groups, **red},
         "original": {**groups, "past_observation": 0.5}, "counterfactual": groups}
    return {"policy": policy, "trajectory_id": traj, "changed": removed > 0,
            "tokens": {"saved": saved, "saved_share": saved / 1000},
            "decision_exact": {"original": True, "counterfactual": True},
            "queries": {"decision": q, "reasoning": q},
            "action": {"changed": changed, "call_changed": changed,
                       "original": {"decision": "web_search", "text": "a"},
                       "counterfactual": {"decision": "visit_page" if changed else "web_search", "text": "b"}}}


def test_summary_numbers():
    recs = [record("mask:5", "a", 0.1, 0.1, 100, False, {"past_reasoning": 0.06, "placeholder": 0.04}),
            record("mask:5", "a", 0.3, 0.2, 300, True, {"past_reasoning": 0.2, "placeholder": 0.1}),
            record("mask:5", "b", 0.2, 0.15, 200, False, {"past_reasoning": 0.1, "placeholder": 0.1})]
    s = summarize(recs, n_boot=500)["mask:5"]
    assert s["steps"] == 3 and s["trajectories"] == 2 and s["steps_changed"] == 3
    d = s["decision"]
    assert d["removed_mass"]["mean"] == pytest.approx(0.2)
    assert d["removed_mass"]["lo"] <= 0.2 <= d["removed_mass"]["hi"]
    assert d["removed_observation_mass"]["mean"] == pytest.approx(0.15)
    assert d["removed_share_of_observations"]["mean"] == pytest.approx(0.3)  # 0.15 / 0.5 on average
    assert d["redistribution"]["past_reasoning"]["mean"] == pytest.approx(0.12)
    assert d["conservation_error"] == pytest.approx(0.0, abs=1e-12)
    a = s["action"]
    assert (a["changed"], a["n"]) == (1, 3) and a["ci"] == pytest.approx((0.0615, 0.7923), abs=1e-4)  # Wilson
    assert s["tokens_saved"]["mean"] == 200 and a["text_changed"] == 3 and a["unparseable"] == 0
    table = markdown_table({"mask:5": s})
    assert "| mask:5 | 3 | 20.0 [" in table and "past_reasoning +12.0" in table and "1/3 (33% [6, 79]) | 3/3 |" in table


def test_study_markdown_puts_seed_numbers_beside_ours():
    md = study_markdown({"steps": 4, "min_past": 5, "past_reasoning_share": 0.5, "past_observation_share": 0.3,
                         "recent10_observation_share": float("nan")}, {})
    assert "| past reasoning share of per-step attention | 53.7% | 50.0% |" in md
    assert "| observation attention within the newest 10% of past turns | 65.0% | n/a |" in md
