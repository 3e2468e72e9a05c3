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
