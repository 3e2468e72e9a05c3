"""report.md and compare.md name their variant and warn at small samples (issue 22, item 6)."""

from __future__ import annotations

from pathlib import Path

from support.ibis_decisions import six_item_decisions

from attnprobe.studies.ibis.compare import compare_row
from attnprobe.studies.ibis.metrics import behaviour_metrics
from attnprobe.studies.ibis.report import compare_table, markdown_report


def _metrics():
    items, decs = six_item_decisions()
    b = behaviour_metrics(items, decs, n_boot=200, seed=0, n_perm=5)
    return {"model": "tiny", "protocol": "paper", "reminder": "identical", "n_items": 6,
            "labels": {"should_research": 6}, "domains": ["d"], "bootstrap": {"n": 200, "seed": 0},
            "run": {"variant": {"dtype": "bfloat16", "weights": "0123456789abcdef"}},
            "generation": {"max_new_tokens": 4096, "decoding": "greedy", "no_call_tokens": 1024},
            "behaviour": b}


def test_report_names_its_variant_and_warns_at_small_samples():
    md = markdown_report(_metrics())
    assert ("Variant: bfloat16; weights 0123456789ab; max_new_tokens 4096, greedy, no-call stop at 1024; "
            "reminder identical.") in md
    assert "Reminder: **identical** (one identical reminder in every framing: the observer listing" in md
    assert ("> **Warning:** small sample (n = 6 < 30, 4 of 6 parseable in both framings): the CI and p-value are not "
            "reliable.") in md
    assert "on the items parseable in both framings (n=4): +0.0" in md
    assert "secondary prose readout (n=6" in md and "**Primary readout: call-only**" in md
    assert "On the items parseable in both framings: 2 flips of 4 items" in md


def test_compare_table_names_the_variant_and_warns():
    row = compare_row(_metrics(), Path("results/tiny__bfloat16"))
    table = compare_table([row])
    assert "bfloat16; weights 0123456789ab" in table
    assert "⚠ n=6, 4 parseable in both" in table
