"""Summaries of hand-written step records: means, Wilson intervals, conservation, the study table."""

from __future__ import annotations

import pytest

from attnprobe.counterfactual.analysis import GROUPS
from attnprobe.counterfactual.summary import markdown_table, summarize
from attnprobe.studies.masking import study_markdown


def record(policy, traj, removed, obs, saved, changed, red):
    groups = {g: 0.0 for g in GROUPS}
    q = {"removed_mass": removed, "changed_message_mass": removed, "removed_observation_mass": obs, "redistribution": {**groups, **red},
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


def test_report_has_a_counterfactual_section_with_the_summary_tables(tmp_path):
    """`attnprobe report` over a folder holding only counterfactual step records: one section per run
    folder with both query tables (the same rows as summary.md); a corrupt record is listed as skipped
    and left out of the numbers."""
    import json

    from attnprobe.counterfactual.report import SECTION
    from attnprobe.results.report import write_report

    recs = [record("mask:5", "a", 0.1, 0.1, 100, False, {"past_reasoning": 0.06, "placeholder": 0.04}),
            record("mask:5", "a", 0.3, 0.2, 300, True, {"past_reasoning": 0.2, "placeholder": 0.1}),
            record("ircot:oq", "b", 0.2, 0.15, 200, False, {"past_reasoning": 0.1, "system": 0.1})]
    run = tmp_path / "runs" / "cf"
    for i, r in enumerate(recs):
        d = run / r["trajectory_id"] / r["policy"].replace(":", "_") / f"step_{i:04d}"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(r))
    bad = run / "a" / "mask_5" / "step_0099"
    bad.mkdir()
    (bad / "record.json").write_text("{not json")
    html = write_report(tmp_path, extra=[SECTION]).read_text(encoding="utf-8")
    assert "<h2 id=\"counterfactual\">Counterfactuals</h2>" in html and "<h3 id=\"cf0\">runs/cf</h3>" in html
    assert "Attention at the decision position" in html and "Attention at the step&#39;s reasoning start" in html
    want = summarize(recs)
    assert "<td>mask:5</td><td>2</td><td>20.0 [" in html and "<td>1/2 (50% [9, 91])</td>" in html
    assert f"<td>ircot:oq</td><td>1</td><td>{100 * want['ircot:oq']['decision']['removed_mass']['mean']:.1f}" in html
    assert "step_0099" in html and "Skipped: 1 unreadable" in html


def test_removed_mass_and_mass_on_changed_messages_are_both_summarised():
    """Issue 26 item 8: a refiner's record (removed 0.06 of 0.22 on its changed messages) and a record written
    before the split (its removed_mass was the changed messages' mass): the latter counts only there."""
    new = record("refine", "a", 0.06, 0.05, 10, False, {"refined": 0.12, "past_reasoning": 0.10})
    for q in new["queries"].values():
        q["changed_message_mass"] = 0.22
    old = record("refine", "b", 0.30, 0.2, 10, False, {"refined": 0.30})
    for q in old["queries"].values():
        q.pop("changed_message_mass", None)
    d = summarize([new, old], n_boot=200)["refine"]["decision"]
    assert d["removed_mass"]["mean"] == pytest.approx(0.06) and d["removed_mass"]["n"] == 1
    assert d["changed_message_mass"]["mean"] == pytest.approx(0.26) and d["changed_message_mass"]["n"] == 2
    assert d["removed_mass_missing"] == 1
    assert d["conservation_error"] == pytest.approx(0.0, abs=1e-12)  # redistribution sums to the changed mass
    assert "| refine | 2 | 6.0 [6.0, 6.0] | 26.0 [" in markdown_table({"refine": summarize([new, old])["refine"]})
