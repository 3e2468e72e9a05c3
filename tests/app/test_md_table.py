"""The Study page's small tables are Markdown: every cell must show exactly its text (no emphasis, link,
HTML, math or column break from what a model wrote)."""

from __future__ import annotations

import pytest


def test_cells_are_escaped_so_they_show_as_written():
    from attnprobe_app.common import md_cell

    assert md_cell("50.0 [0.0, 100.0]") == r"50\.0 \[0\.0, 100\.0\]"
    assert md_cell("a|b") == r"a\|b"  # not a column break
    assert md_cell("*x* _y_ <answer>z</answer> $5 `c`") == r"\*x\* \_y\_ \<answer\>z\</answer\> \$5 \`c\`"
    assert md_cell("line one\nline two") == "line one line two"  # a row stays one row
    assert md_cell(None) == "" and md_cell(3) == "3"


def test_a_table_reads_back_cell_for_cell(monkeypatch):
    pytest.importorskip("streamlit")
    from support.appdata import md_tables

    import attnprobe_app.common as C

    drawn = []
    monkeypatch.setattr(C.st, "markdown", lambda text: drawn.append(type("M", (), {"value": text})()))
    rows = [{"setting": "mask:1", "reply": "search(|q|) *bold* <b>", "n": 2},
            {"setting": "none (baseline)", "reply": "a\nb", "n": None}]
    C.table(rows)
    C.table([])  # nothing to draw
    (df,) = md_tables(type("At", (), {"markdown": drawn})())
    assert list(df.columns) == ["setting", "reply", "n"]
    assert df.values.tolist() == [["mask:1", "search(|q|) *bold* <b>", "2"], ["none (baseline)", "a b", ""]]
