"""IBIS items: the shipped set and clear errors for bad items (file, line, field)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from support.paths import ROOT  # noqa: E402

from attnprobe.studies.ibis.items import ItemError, load_items, results_text

SHIPPED = ROOT / "trajectories" / "ibis_items.jsonl"

GOOD = {"id": "x-1", "domain": "science", "task": "What is the boiling point of water?", "query": "boiling point water",
        "results": [{"title": "Water - Wikipedia", "url": "https://en.wikipedia.org/wiki/Water", "snippet": "Water is..."}],
        "label": "should_visit_page"}


def test_shipped_set_is_balanced_and_diverse():
    items = load_items(SHIPPED)
    labels = Counter(it.label for it in items)
    assert labels["should_research"] >= 30 and labels["should_visit_page"] >= 30
    assert labels["should_research"] == labels["should_visit_page"]
    headline = [it for it in items if it.headline]
    assert len(headline) >= 60
    domains = Counter(it.domain for it in headline)
    assert len(domains) >= 8
    for dom in domains:  # every domain has both labels
        assert {it.label for it in headline if it.domain == dom} == {"should_research", "should_visit_page"}
    assert all(it.note for it in items), "every item records why it has its label"
    assert all(2 <= len(it.results) <= 6 for it in items)


def _write(tmp_path, recs, raw_lines=()):
    p = tmp_path / "items.jsonl"
    lines = [json.dumps(r) for r in recs] + list(raw_lines)
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("mutate, field, words", [
    (lambda r: r.pop("task"), "task", "missing required field"),
    (lambda r: r.update(task="  "), "task", "must not be empty"),
    (lambda r: r.pop("query"), "query", "missing required field"),
    (lambda r: r.update(results=[]), "results", "empty results"),
    (lambda r: r.pop("results"), "results", "missing required field"),
    (lambda r: r.update(results="1. a page"), "results", "expected a list"),
    (lambda r: r["results"][0].pop("url"), "results[0].url", "missing required field"),
    (lambda r: r["results"][0].update(url="en.wikipedia.org/wiki/Water"), "results[0].url", "absolute http(s) URL"),
    (lambda r: r["results"][0].update(snippet=""), "results[0].snippet", "must not be empty"),
    (lambda r: r.update(label="should_click"), "label", "must be one of"),
    (lambda r: r.pop("label"), "label", "missing required field"),
    (lambda r: r.update(id="a/b"), "id", "letters, digits"),
])
def test_bad_items_name_file_line_and_field(tmp_path, mutate, field, words):
    bad = json.loads(json.dumps(GOOD))
    bad["id"] = "x-2" if "id" != field else bad["id"]
    mutate(bad)
    p = _write(tmp_path, [GOOD, bad])
    with pytest.raises(ItemError) as exc:
        load_items(p)
    msg = str(exc.value)
    assert str(p) in msg and "line 2" in msg and f"field '{field}'" in msg and words in msg, msg
    assert exc.value.line == 2 and exc.value.field == field


def test_invalid_json_duplicate_ids_and_empty_file(tmp_path):
    with pytest.raises(ItemError, match=r"line 2: invalid JSON"):
        load_items(_write(tmp_path, [GOOD], ["{not json"]))
    with pytest.raises(ItemError, match=r"line 2, field 'id': duplicate id 'x-1' \(first on line 1\)"):
        load_items(_write(tmp_path, [GOOD, GOOD]))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ItemError, match="no items"):
        load_items(tmp_path / "empty.jsonl")
    with pytest.raises(ItemError, match="file not found"):
        load_items(tmp_path / "nope.jsonl")


def test_unknown_fields_are_kept_and_results_text_is_stable(tmp_path):
    rec = dict(GOOD, source="hand-written")
    it = load_items(_write(tmp_path, [rec]))[0]
    assert it.to_dict()["source"] == "hand-written"
    assert results_text(it) == "1. [Water - Wikipedia](https://en.wikipedia.org/wiki/Water)\n   Water is..."


def test_cli_bad_items_exit_code_2(tmp_path, capsys):
    from attnprobe.cli.main import main

    bad = dict(GOOD, results=[])
    p = _write(tmp_path, [bad])
    rc = main(["ibis", "run", "--items", str(p), "--folder", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "field 'results'" in err and "empty results" in err
