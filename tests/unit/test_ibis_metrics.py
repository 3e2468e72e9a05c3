"""IBIS metrics on hand-built arrays and decisions whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe.studies.ibis.framings import CATEGORIES
from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.metrics import attention_metrics, forced_choice_metrics

C = {c: i for i, c in enumerate(CATEGORIES)}


def _index(n, protocol="matched", labels=None):
    return {"labels": labels or ["should_research"] * n, "categories": list(CATEGORIES),
            "framings": ["agentic", "observer"], "layers": [0, 1], "num_heads": 2, "protocol": protocol}


def _arrays(n):
    """Agentic: query 0.02 on 4 tokens, rest of the call 0.10 on 26 tokens; observer: the same 4
    query tokens hold 0.03. Whole call vs query is +0.09 in mass, but the length-matched gap is -0.01."""
    mass = {fr: np.zeros((n, len(CATEGORIES), 2, 2), dtype=np.float32) for fr in ("agentic", "observer")}
    tokens = {fr: np.zeros((n, len(CATEGORIES)), dtype=np.int32) for fr in ("agentic", "observer")}
    mass["agentic"][:, C["query"]] = 0.02
    mass["agentic"][:, C["call"]] = 0.10
    mass["agentic"][:, C["results"]] = 0.88
    mass["observer"][:, C["query"]] = 0.03
    mass["observer"][:, C["results"]] = 0.97
    tokens["agentic"][:, C["query"]] = 4
    tokens["agentic"][:, C["call"]] = 26
    tokens["observer"][:, C["query"]] = 4
    for fr in mass:
        tokens[fr][:, C["results"]] = 100
    # one head of layer 1 carries an extra own-query preference of +0.04 (and the mean follows)
    mass["agentic"][:, C["query"], 1, 1] += 0.04
    return {**{f"mass.{k}": v for k, v in mass.items()}, **{f"tokens.{k}": v for k, v in tokens.items()}}


def test_primary_gap_is_length_matched_and_the_whole_call_gap_is_secondary():
    m = attention_metrics(_index(6), _arrays(6), n_boot=200, seed=0, top_k=2)
    g, w = m["attentional_gap"], m["whole_call_gap"]
    assert g["measure"] == "query_tokens" and g["length_matched"] is True
    # mean over 2 layers x 2 heads: agentic 0.02 + 0.04 / 4 = 0.03 -> gap 0.0 exactly; one head +0.04
    assert g["agentic"] == pytest.approx(0.03, abs=1e-6) and g["observer"] == pytest.approx(0.03, abs=1e-6)
    assert g["gap"] == pytest.approx(0.0, abs=1e-6)
    assert g["per_token"]["gap"] == pytest.approx(0.0, abs=1e-6)
    # the whole call (30 tokens) collects 0.13 against 0.03: +0.10 in mass, though per token it is lower
    assert w["measure"] == "whole_call" and w["gap"] == pytest.approx(0.10, abs=1e-6)
    assert w["tokens"] == {"agentic_whole_call": 30.0, "observer_query": 4.0}
    assert w["per_token"]["gap"] == pytest.approx(0.13 / 30 - 0.03 / 4, abs=1e-6) and w["per_token"]["gap"] < 0
    assert "SECONDARY" in w["definition"] and "~30 tokens" in w["definition"]
    # per layer and head: -0.01 everywhere but (layer 1, head 1) at +0.03, so the mean hides a head
    assert m["per_layer_gap"]["query"]["gap"] == pytest.approx([-0.01, 0.01], abs=1e-6)
    top = m["heads"]["query"]["top"][0]
    assert (top["layer"], top["head"]) == (1, 1) and top["gap"] == pytest.approx(0.03, abs=1e-6)
    assert m["heads"]["query"]["share_heads_positive"] == 0.25
    # the category table shows tokens and attention per token beside mass
    q = m["by_category"]["headline"]["query"]
    assert q["tokens"] == {"agentic": 4.0, "observer": 4.0} and q["per_token"]["observer"] == pytest.approx(0.0075)


def test_paper_protocol_has_no_query_gap_and_says_why():
    m = attention_metrics(_index(4, "paper"), _arrays(4), n_boot=100, seed=0)
    assert m["attentional_gap"]["gap"] is None and "shows no query" in m["attentional_gap"]["reason"]
    assert m["whole_call_gap"]["gap"] is None and "query" not in m["heads"]


def test_old_arrays_without_token_counts_are_refused():
    arr = {k: v for k, v in _arrays(2).items() if not k.startswith("tokens.")}
    with pytest.raises(Exception, match="token counts"):
        attention_metrics(_index(2), arr, n_boot=10, seed=0)


def _items(n):
    return [IbisItem(id=f"i{k}", task="t", query=f"q{k}", label="should_research", domain="d",
                     results=[{"title": "a", "url": "https://a.org", "snippet": "s"}]) for k in range(n)]


def _fc(lo):
    return {"choice": "visit_page" if lo > 0 else "web_search", "log_odds_visit": lo}


def test_copy_control_flags_a_gap_that_is_copying():
    """Observer always right (log-odds -1); agentic wrong (+1) as is, but right (-1) once its own call is
    renamed: the whole forced-choice gap is copying, and the control must say so."""
    items = _items(8)
    dec = {}
    for it in items:
        dec[(it.id, "observer")] = {"item_id": it.id, "framing": "observer", "expected": "web_search",
                                    "forced_choice": _fc(-1.0)}
        dec[(it.id, "agentic")] = {"item_id": it.id, "framing": "agentic", "expected": "web_search",
                                   "forced_choice": _fc(1.0), "forced_choice_control": _fc(-1.0)}
    fc = forced_choice_metrics(items, dec, ["agentic", "observer"], n_boot=200, seed=0, n_perm=5)
    assert fc["inertia_gap"]["gap"] == pytest.approx(1.0)
    cc = fc["copy_control"]
    assert cc["inertia_gap"]["gap"] == pytest.approx(0.0) and cc["gap_moved_by"] == pytest.approx(1.0)
    assert cc["moves_gap_beyond_ci"] is True and "copying" in cc["warning"]
    assert cc["log_odds_shift_original_minus_renamed"]["mean"] == pytest.approx(2.0)
    assert cc["log_odds_visit_agentic_should_research"] == {"original": 1.0, "renamed": -1.0, "n": 8}
    # a control that changes nothing leaves the gap where it was, and no warning
    for it in items:
        dec[(it.id, "agentic")]["forced_choice_control"] = _fc(1.0)
    cc = forced_choice_metrics(items, dec, ["agentic", "observer"], n_boot=200, seed=0, n_perm=5)["copy_control"]
    assert cc["inertia_gap"]["gap"] == pytest.approx(1.0) and cc["moves_gap_beyond_ci"] is False
    assert "warning" not in cc


# ------------------------------------------------------------------ call-only readout, parseable-both, warnings
def test_call_only_gap_parseable_both_and_prose_readout_on_hand_built_decisions():
    from support.ibis_decisions import six_item_decisions

    from attnprobe.studies.ibis.metrics import behaviour_metrics

    items, decs = six_item_decisions()
    b = behaviour_metrics(items, decs, n_boot=200, seed=0, n_perm=5)
    # primary: agentic correct on i2, i4 (2/6), observer on i0, i1, i2 (3/6)
    g = b["inertia_gap"]
    assert g["n_pairs"] == 6 and g["gap"] == pytest.approx(1 / 6, abs=1e-4) and g["n_parseable_both"] == 4
    assert g["warning"] == ("small sample (n = 6 < 30, 4 of 6 parseable in both framings): the CI and p-value are "
                            "not reliable")
    # items parseable in both framings: i1, i2, i4, i5 -> 2/4 each, gap 0
    gp = b["inertia_gap_parseable_both"]
    assert gp["n_pairs"] == 4 and gp["gap"] == 0.0 and gp["accuracy_agentic"] == 0.5 == gp["accuracy_observer"]
    # secondary prose readout: agentic 2/6, observer 4/6
    gs = b["prose_readout"]["inertia_gap"]
    assert gs["gap"] == pytest.approx(2 / 6, abs=1e-4) and "SECONDARY" in gs["definition"]
    assert b["accuracy"]["observer"]["should_research"]["prose"]["correct"] == 4
    assert b["accuracy"]["agentic"]["should_research"]["unparseable"] == 2
    assert b["unparseable_total"] == 3 and b["unparseable_total_prose"] == 1
    assert "call-only" in b["readout"]
    # flips: i0, i1 (inertia), i4 (reverse); parseable in both: i1 and i4 only
    f, fp = b["flips"], b["flips_parseable_both"]
    assert (f["n_items"], f["n_flips"], f["inertia_direction"]) == (6, 3, 2)
    assert (fp["n_items"], fp["n_flips"], fp["inertia_direction"]) == (4, 2, 1) and fp["parseable_both"] is True


def test_sample_warning_thresholds():
    from attnprobe.studies.ibis.metrics import SMALL_SAMPLE_N, sample_warning

    assert sample_warning(SMALL_SAMPLE_N, SMALL_SAMPLE_N) is None
    assert sample_warning(40, 20) is None  # half parseable is enough
    assert sample_warning(40, 19) == ("small sample (n = 40, 19 of 40 parseable in both framings): the CI and "
                                      "p-value are not reliable")
    assert sample_warning(3) == "small sample (n = 3 < 30): the CI and p-value are not reliable"


# ------------------------------------------------------------------ position control of the attentional gap
def test_placebo_range_is_at_the_same_distances_in_both_framings():
    from attnprobe.studies.ibis.position import placebo_ranges

    # agentic results at tokens [100, 200), decision token 230: distances 31..130
    # observer results at [90, 190), decision 210: distances 21..120 -> common 31..120 (90 tokens)
    ra, ro = placebo_ranges((100, 200), (90, 190), 230, 210, 5)
    assert ra == (110, 200) and ro == (90, 180)
    assert [230 - t for t in range(*ra)] == [210 - t for t in range(*ro)] == list(range(120, 30, -1))
    assert placebo_ranges((100, 200), (90, 190), 230, 210, 90) is not None
    assert placebo_ranges((100, 200), (90, 190), 230, 210, 91) is None  # the common range holds 90 tokens


def test_position_control_on_hand_built_arrays():
    from attnprobe.studies.ibis.position import position_control

    dd = np.array([10.0, 12, 14, 16, 18])
    do = np.full(5, 100.0)
    da = do + dd
    gap = 0.004 - 0.001 * dd  # a gap that is all distance: 0 would remain at dd = 4, +0.004 at equal distance
    qo = np.full(5, 0.06)
    qa = qo + gap
    po = np.full(5, 0.02)
    pa = po - 0.008  # the framings differ by -0.008 at matched position on identical external tokens
    pc = position_control(qa, qo, pa, po, da, do, n_boot=500, seed=0)
    assert pc["distance"] == {"agentic": 114.0, "observer": 100.0, "difference_mean": 14.0,
                              "difference_sd": pytest.approx(2.828, abs=1e-3), "difference_range": [10.0, 18.0]}
    assert pc["placebo"]["gap"] == pytest.approx(-0.008, abs=1e-6) and pc["placebo"]["n"] == 5
    assert pc["gap_minus_placebo"]["gap"] == pytest.approx(gap.mean() + 0.008, abs=1e-6)
    assert pc["adjusted_gap"] is None  # gap - placebo is not position-adjusted (issue 26): no shifted captures
    r = pc["regression"]
    assert r["slope_per_token"] == pytest.approx(-0.001, abs=1e-9) and r["intercept"] == pytest.approx(0.004, abs=1e-6)
    assert r["intercept_ci95"][0] == pytest.approx(0.004, abs=1e-6)  # an exact line: every resample agrees
    # a constant distance difference: the regression is not identified and says so; a missing placebo is skipped
    pa2 = pa.copy()
    pa2[0] = np.nan
    pc = position_control(qa, qo, pa2, po, do + 14, do, n_boot=100, seed=0)
    assert pc["regression"]["intercept"] is None and "not identified" in pc["regression"]["reason"]
    assert pc["placebo"]["n"] == 4 and pc["gap_minus_placebo"]["n"] == 4


def test_position_inputs_read_the_captures(tmp_path):
    """Hand-built captures: query and placebo masses from the per-token row, distances from the segments."""
    from attnprobe.render.segments import QueryPoint, Segment
    from attnprobe.results.result import CaptureResult
    from attnprobe.studies.ibis.position import position_inputs

    def save(framing, layout, row):
        """layout: (category, role, author, length) pieces in order; the last token is the decision."""
        segs, cats, pos = [], [], 0
        for k, (cat, role, author, length) in enumerate(layout):
            segs.append(Segment(role, author, 0, k, pos, pos + length))
            cats.append(cat)
            pos += length
        n = pos
        row = np.asarray(row, dtype=np.float32)
        assert len(row) == n
        res = CaptureResult(trajectory_id=f"i0/{framing}", input_ids=np.arange(n), segments=segs,
                            queries=[QueryPoint(n - 1, "decision", 0, len(layout) - 1)], layers=[0],
                            segment_attention=np.zeros((1, len(segs))), layer_head_attention=np.zeros((1, 1, 1, len(segs))),
                            token_attention=row[None], meta={"ibis": {"categories": cats}})
        res.save(tmp_path / "captures" / "i0" / framing)

    # agentic: 2 template, 3 query, 2 call, 10 results, 3 template (decision = token 19)
    ra = np.zeros(20)
    ra[2:5] = [0.01, 0.02, 0.03]
    ra[7:17] = np.arange(10) / 100
    save("agentic", [("template", "template", "external", 2), ("query", "tool_call", "self", 3),
                     ("call", "tool_call", "self", 2), ("results", "observation", "external", 10),
                     ("template", "template", "external", 3)], ra)
    # observer: 2 template, 3 query, 1 framing, 10 results, 1 template (decision = token 16)
    ro = np.zeros(17)
    ro[2:5] = [0.02, 0.02, 0.02]
    ro[6:16] = np.arange(10) / 100
    save("observer", [("template", "template", "external", 2), ("query", "tool_call", "external", 3),
                      ("framing", "task", "external", 1), ("results", "observation", "external", 10),
                      ("template", "template", "external", 1)], ro)
    p = position_inputs(tmp_path, ["i0"])
    assert p["qa"][0] == pytest.approx(0.06) and p["qo"][0] == pytest.approx(0.06)
    assert (p["da"][0], p["do"][0]) == (19 - 4, 16 - 4)  # from the query's last token to the decision token
    # results distances: agentic 19-16=3 .. 19-7=12, observer 1 .. 10 -> common 3..10: agentic tokens 9..16,
    # observer tokens 6..13; placebo = 3 tokens x their mean attention
    assert p["pa"][0] == pytest.approx(3 * np.mean(ra[9:17])) and p["po"][0] == pytest.approx(3 * np.mean(ro[6:14]))


def _save_capture(root, iid, framing, layout, row):
    """A hand-built capture: layout = (category, role, author, length) pieces in order; the last token is the
    decision; ``row`` the per-token attention of the decision token."""
    from attnprobe.render.segments import QueryPoint, Segment
    from attnprobe.results.result import CaptureResult

    segs, cats, pos = [], [], 0
    for k, (cat, role, author, length) in enumerate(layout):
        segs.append(Segment(role, author, 0, k, pos, pos + length))
        cats.append(cat)
        pos += length
    row = np.asarray(row, dtype=np.float32)
    assert len(row) == pos
    res = CaptureResult(trajectory_id=f"{iid}/{framing}", input_ids=np.arange(pos), segments=segs,
                        queries=[QueryPoint(pos - 1, "decision", 0, len(layout) - 1)], layers=[0],
                        segment_attention=np.zeros((1, len(segs))),
                        layer_head_attention=np.zeros((1, 1, 1, len(segs))),
                        token_attention=row[None], meta={"ibis": {"categories": cats}})
    res.save(root / "captures" / iid / framing)


def _distance_captures(root, n_items, own_effect=0.0):
    """Three framings per item whose decision-token attention depends only on the distance d to the decision
    token (f(d) = 0.002 + 0.02 exp(-d / 40)), plus ``own_effect`` per token on the agentic query only. The own
    query sits 17 tokens further away (the matched protocol's offset); observer_shifted moves the observer's
    query there with 17 filler tokens. Results blocks vary in length per item (n_results = 20 + 3 i)."""
    f = lambda d: 0.002 + 0.02 * np.exp(-d / 40.0)  # noqa: E731
    for i in range(n_items):
        nr, nq = 20 + 3 * i, 4
        layouts = {
            "agentic": [("template", "template", "external", 5), ("query", "tool_call", "self", nq),
                        ("call", "tool_call", "self", 17 + 2), ("results", "observation", "external", nr),
                        ("reminder", "task", "external", 6), ("template", "template", "external", 3)],
            "observer": [("template", "template", "external", 5), ("query", "tool_call", "external", nq),
                         ("framing", "task", "external", 2), ("results", "observation", "external", nr),
                         ("reminder", "task", "external", 6), ("template", "template", "external", 3)],
            "observer_shifted": [("template", "template", "external", 5), ("query", "tool_call", "external", nq),
                                 ("framing", "task", "external", 2 + 17), ("results", "observation", "external", nr),
                                 ("reminder", "task", "external", 6), ("template", "template", "external", 3)],
        }
        for fr, lay in layouts.items():
            n = sum(x[-1] for x in lay)
            row = f(n - 1 - np.arange(n))
            if fr == "agentic":
                row[5:5 + nq] += own_effect
            _save_capture(root, f"i{i}", fr, lay, row)


def test_position_control_gives_zero_under_a_pure_distance_model(tmp_path):
    """Issue 26 item 7: attention that depends only on distance (no ownership) gives an adjusted gap of 0,
    while the raw gap and the old gap - placebo are not 0 (the placebo cannot see the 17-token offset)."""
    from attnprobe.studies.ibis.position import position_control, position_inputs

    _distance_captures(tmp_path, 8)
    ids = [f"i{i}" for i in range(8)]
    p = position_inputs(tmp_path, ids)
    assert np.all(p["da"] - p["do"] == 17) and np.all(p["ds"] == p["da"])
    pc = position_control(p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=500, seed=0,
                          qs=p["qs"], ds=p["ds"])
    raw = (p["qa"] - p["qo"]).mean()
    assert raw < -0.003  # the own query is further away: less attention, with no ownership at all
    assert abs(pc["gap_minus_placebo"]["gap"]) > 1e-3  # the placebo leaves most of the distance effect in
    assert pc["adjusted_gap"] == pytest.approx(0.0, abs=1e-7)
    assert pc["at_equal_distance"]["ci95"] == [pytest.approx(0.0, abs=1e-7)] * 2
    assert pc["at_equal_distance"]["distance"] == pytest.approx(p["da"].mean(), abs=0.01)


def test_position_control_recovers_a_known_ownership_effect(tmp_path):
    from attnprobe.studies.ibis.position import position_control, position_inputs

    _distance_captures(tmp_path, 8, own_effect=-0.0005)  # 4 own query tokens: -0.002 in mass
    p = position_inputs(tmp_path, [f"i{i}" for i in range(8)])
    pc = position_control(p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=500, seed=0,
                          qs=p["qs"], ds=p["ds"])
    assert pc["adjusted_gap"] == pytest.approx(-0.002, abs=1e-6)
    assert pc["adjusted_gap_ci95"] == [pytest.approx(-0.002, abs=1e-6)] * 2
    assert pc["at_equal_distance"]["share_items_positive"] == 0.0


def test_position_control_without_shifted_captures_has_no_adjusted_gap(tmp_path):
    import shutil

    from attnprobe.errors import AttnprobeError
    from attnprobe.studies.ibis.position import position_control, position_inputs

    _distance_captures(tmp_path, 3)
    shutil.rmtree(tmp_path / "captures" / "i1" / "observer_shifted")  # one item missing: none is used
    p = position_inputs(tmp_path, ["i0", "i1", "i2"])
    assert p["qs"] is None
    pc = position_control(p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=100, seed=0)
    assert pc["adjusted_gap"] is None and pc["at_equal_distance"] is None and "observer_shifted" in pc[
        "adjusted_gap_reason"]
    with pytest.raises(AttnprobeError, match="not at the agentic distance"):
        position_control(p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=100, seed=0,
                         qs=p["qo"], ds=p["do"])


def test_a_gap_against_an_all_unparseable_framing_is_flagged_as_format_only():
    """Issue 26 item 10: direct - agentic with every agentic reply unparseable compares reply formats."""
    from attnprobe.studies.ibis.metrics import paired_gap

    items = [IbisItem(id=f"i{k}", task="t", query="q", results=[{"title": "a", "url": "https://a.org", "snippet": "s"}],
                      label="should_research") for k in range(4)]
    dec = {}
    for k in range(4):
        dec[(f"i{k}", "agentic")] = {"decision": "unparseable", "correct": False}
        dec[(f"i{k}", "direct")] = {"decision": "web_search" if k < 2 else "unparseable", "correct": k < 2}
    g = paired_gap(dec, items, "agentic", "direct", "should_research", 200, 0)
    assert g["gap"] == 0.5 and g["unparseable"] == {"agentic": 4, "direct": 2} and g["n_parseable_both"] == 0
    assert g["format_only"].startswith("every agentic reply is unparseable (4 of 4)")
    dec[("i0", "agentic")] = {"decision": "visit_page", "correct": False}
    assert "format_only" not in paired_gap(dec, items, "agentic", "direct", "should_research", 200, 0)


def test_report_prints_the_gap_at_equal_distance(tmp_path):
    from attnprobe.studies.ibis.position import position_control, position_inputs
    from attnprobe.studies.ibis.report import markdown_report

    _distance_captures(tmp_path, 4, own_effect=-0.0005)
    p = position_inputs(tmp_path, [f"i{i}" for i in range(4)])
    att = attention_metrics(_index(4), _arrays(4), n_boot=100, seed=0)
    att["attentional_gap"]["position_control"] = position_control(
        p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=100, seed=0, qs=p["qs"], ds=p["ds"])
    md = markdown_report({"model": "tiny", "protocol": "matched", "reminder": "identical", "n_items": 4,
                          "labels": {"should_research": 4}, "domains": ["d"], "bootstrap": {"n": 100, "seed": 0},
                          "run": {}, "generation": {}, "attention": att})
    assert "**at equal distance** (the position control; the observer query moved to the agentic distance" in md
    assert "agentic - observer_shifted -0.0020 [-0.0020, -0.0020]" in md
    assert "placebo (descriptive; it is taken at distances both framings share" in md
    att["attentional_gap"]["position_control"] = position_control(
        p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"], n_boot=100, seed=0)
    md = markdown_report({"model": "tiny", "protocol": "matched", "reminder": "identical", "n_items": 4,
                          "labels": {"should_research": 4}, "domains": ["d"], "bootstrap": {"n": 100, "seed": 0},
                          "run": {}, "generation": {}, "attention": att})
    assert "- at equal distance: not computed (no observer_shifted captures in this folder" in md
