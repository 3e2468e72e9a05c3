"""Counterfactual summaries (issue 19 item 4, issue 22 item 5): malformed records are skipped with their
reason, the own-tool change rate over steps parseable on both sides, the log-probability difference and
the refined split, on hand-written records with known answers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from attnprobe.counterfactual.analysis import GROUPS
from attnprobe.counterfactual.layout import iter_record_files
from attnprobe.counterfactual.records import record_problem
from attnprobe.counterfactual.summary import markdown_table, summarize, summarize_dir


def record(policy="mask:5", traj="a", removed=0.2, own=None, logprob=None, split=None):
    groups = {g: 0.0 for g in GROUPS}
    q = {"removed_mass": removed, "changed_message_mass": removed, "removed_observation_mass": removed, "redistribution": {**groups, "system": removed},
         "original": {**groups, "past_observation": 0.5}, "counterfactual": groups}
    if split is not None:
        q["refined_split"] = split
    r = {"policy": policy, "trajectory_id": traj, "changed": True, "tokens": {"saved": 10, "saved_share": 0.1},
         "decision_exact": {"original": True, "counterfactual": True}, "queries": {"decision": q, "reasoning": q}}
    if own is not None:
        r["action"] = {"changed": False, "call_changed": False, "own": own,
                       "original": {"decision": "unparseable", "text": "a"},
                       "counterfactual": {"decision": "unparseable", "text": "b"}}
    if logprob is not None:
        r["logprob"] = {"original": {"sum": logprob[0], "mean": logprob[0] / 4},
                        "counterfactual": {"sum": logprob[1], "mean": logprob[1] / 4}}
    return r


def own(o, c):
    both = o != "unparseable" and c != "unparseable"
    return {"original": {"action": o}, "counterfactual": {"action": c}, "parseable_both": both,
            "changed": (o != c) if both else None}


def test_malformed_records_are_skipped_with_their_reason():
    good = record()
    bad_mass = record()
    bad_mass["queries"]["decision"]["removed_mass"] = "0.2"
    no_policy = {k: v for k, v in record().items() if k != "policy"}
    nan_mass = record()
    nan_mass["queries"]["reasoning"]["removed_mass"] = float("nan")
    skipped = []
    s = summarize([("ok", good), ("str", bad_mass), ("empty", {}), ("nopolicy", no_policy), ("list", [1]),
                   ("nan", nan_mass)], n_boot=200, skipped=skipped)
    assert list(s) == ["mask:5"] and s["mask:5"]["steps"] == 1
    reasons = dict(skipped)
    assert list(reasons) == ["str", "empty", "nopolicy", "list", "nan"]
    assert reasons["str"] == "'queries.decision.removed_mass' is str '0.2', not a finite number"
    assert reasons["empty"] == "missing 'policy'" and reasons["nopolicy"] == "missing 'policy'"
    assert reasons["list"] == "the record is list, not an object"
    assert "not a finite number" in reasons["nan"]
    assert summarize([{}], n_boot=200) == {}  # without a list to fill, still no KeyError
    assert record_problem(record()) is None


def test_summarize_dir_lists_unreadable_and_symlinked_steps(tmp_path):
    run = tmp_path / "cf"
    for i, r in enumerate([record(), record(removed=0.4), {}]):
        d = run / "a" / "mask_5" / f"step_{i:04d}"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(r))
    (run / "a" / "mask_5" / "step_0009").mkdir()
    (run / "a" / "mask_5" / "step_0009" / "record.json").write_text("{torn")
    outside = tmp_path / "elsewhere" / "step_0100"
    outside.mkdir(parents=True)
    (outside / "record.json").write_text(json.dumps(record(removed=0.9)))
    os.symlink(outside, run / "a" / "mask_5" / "step_0100")
    skipped = []
    s = summarize_dir(run, skipped=skipped, n_boot=200)
    assert s["mask:5"]["steps"] == 2 and s["mask:5"]["decision"]["removed_mass"]["mean"] == pytest.approx(0.3)
    reasons = {os.path.basename(os.path.dirname(p)): why for p, why in skipped}
    assert reasons["step_0002"] == "missing 'policy'"
    assert reasons["step_0100"] == "a symlinked step folder (not followed)"
    assert "step_0009" in reasons
    assert [p.parent.name for p, rec, _ in iter_record_files(run) if rec is not None] == [
        "step_0000", "step_0001", "step_0002"]


def test_own_tool_change_rate_logprob_difference_and_refined_split():
    split = {"dropped": 0.05, "kept_again": 0.15, "other": 0.01, "split_messages": 2, "unsplit": {}}
    recs = [record(own=own("web_search", "find_in_page"), logprob=(-40.0, -36.0), split=split),
            record(own=own("web_search", "web_search"), logprob=(-40.0, -42.0),
                   split={**split, "dropped": 0.15, "kept_again": 0.05}),
            record(own=own("unparseable", "web_search"), logprob=(-20.0, -20.0)),
            record(own=own("unparseable", "unparseable"), logprob=(-30.0, -28.0))]
    s = summarize(recs, n_boot=500)["mask:5"]
    a = s["action_own"]
    assert (a["steps"], a["parseable_both"], a["changed"], a["rate"]) == (4, 2, 1, 0.5)
    lp = s["logprob"]
    assert lp["n"] == 4 and lp["diff_sum"]["mean"] == pytest.approx((4 - 2 + 0 + 2) / 4)
    assert lp["diff_mean"]["mean"] == pytest.approx(0.25) and lp["diff_mean"]["lo"] <= 0.25 <= lp["diff_mean"]["hi"]
    sp = s["decision"]["refined_split"]
    assert sp["dropped"]["mean"] == pytest.approx(0.1) and sp["kept_again"]["mean"] == pytest.approx(0.1)
    assert sp["dropped"]["n"] == 2  # only steps with a split
    table = markdown_table({"mask:5": s})
    row = next(line for line in table.splitlines() if line.startswith("| mask:5"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # one column more since issue 26 (mass on changed messages), and the cell counts every step
    assert cells[9] == ("1/2 of 4 (50% [9, 91]); both changed 1, both same 1, one-sided 0 (original only 0, "
                        "counterfactual only 0), neither 2")
    assert cells[10].startswith("+0.250 [") and cells[10].endswith("(n = 4)")
    assert cells[11] == "10.0 / 10.0 (n = 2)"
    plain = markdown_table(summarize([record()], n_boot=200))
    assert plain.strip().splitlines()[-1].endswith("| not run | not run | - |")
    assert np.isfinite(s["decision"]["conservation_error"])
