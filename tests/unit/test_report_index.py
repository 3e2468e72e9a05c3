"""`attnprobe report` at scale (issue 13, item 14): an index grouped by run / question / IBIS item with
links to collapsed sections, integer turn ticks, the grey-cell legend, and one consistent query count.
Hand-built captures with known attention, no model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.analysis import heatmap, step_breakdown
from attnprobe.results.figures import HEATMAP_GREY_NOTE, heatmap_figure, step_breakdown_figure
from attnprobe.results.report import capture_group, describe_queries, write_report
from attnprobe.results.result import CaptureResult

# turn 0: system + task; turns 1 and 2: reasoning + observation; turn 3: a tool-call-only message
SEGS = [Segment("system", "external", 0, 0, 0, 4), Segment("task", "external", 0, 1, 4, 8),
        Segment("reasoning", "self", 1, 2, 8, 12), Segment("observation", "external", 1, 3, 12, 16),
        Segment("reasoning", "self", 2, 4, 16, 20), Segment("observation", "external", 2, 5, 20, 24),
        Segment("tool_call", "self", 3, 6, 24, 28)]
STEPS = [QueryPoint(8, "reasoning", 1, 2), QueryPoint(16, "reasoning", 2, 4), QueryPoint(24, "action", 3, 6)]


def capture(tid: str, queries=STEPS, **trajectory_meta) -> CaptureResult:
    """Step 2 puts 0.3 on turn 1's reasoning (tokens 8-11) and 0.4 on its observation (12-15)."""
    n, q = 28, len(queries)
    tok = np.zeros((q, n), np.float32)
    tok[:, 0] = 1.0
    if q > 1:
        tok[1] = 0
        tok[1, 0:8], tok[1, 8:12], tok[1, 12:16], tok[1, 16] = 0.025, 0.075, 0.1, 0.1
    seg = np.stack([np.bincount([next(i for i, s in enumerate(SEGS) if s.start <= p < s.end) for p in range(n)],
                                weights=row, minlength=len(SEGS)) for row in tok]).astype(np.float32)
    lh = np.repeat(np.repeat(seg[:, None, None, :], 2, 1), 3, 2)
    return CaptureResult(tid, np.arange(n), SEGS, list(queries), [0, 1], seg, lh, tok,
                         meta={"model": "M", "dtype": "float32", "backend": "transformers", "framing": "trace",
                               "trajectory_meta": trajectory_meta},
                         text="ab" * n, offsets=np.array([[2 * i, 2 * i + 2] for i in range(n)]))


def test_heatmap_grey_cells_and_integer_ticks():
    res = capture("t")
    hm = heatmap(res)
    assert hm.reasoning[2, 1] == pytest.approx(0.3) and hm.observation[1, 2] == pytest.approx(0.4)
    # turn 3 has no reasoning-step query and none comes after it: its whole row and column are grey (NaN)
    assert np.isnan(hm.reasoning[3]).all() and np.isnan(hm.observation[:, 3]).all()
    assert np.isnan(hm.reasoning[:, 3]).all() and np.isnan(hm.observation[3]).all()
    assert np.isnan(np.diag(hm.reasoning)).all() and np.isnan(np.diag(hm.observation)).all()
    assert "whole row and column are grey" in HEATMAP_GREY_NOTE and "diagonal is masked" in HEATMAP_GREY_NOTE
    fig = heatmap_figure(hm, res.turn_texts())
    for ax in (fig.layout.xaxis, fig.layout.yaxis):  # 4 turns: ticks 0, 1, 2, 3, never 0.5
        assert (ax.tickmode, ax.tick0, ax.dtick, ax.tickformat) == ("linear", 0, 1, "d")
    assert fig.layout.plot_bgcolor == "#cccccc"
    steps = step_breakdown_figure(step_breakdown(res)["steps"])
    assert (steps.layout.xaxis.tickmode, steps.layout.xaxis.dtick) == ("linear", 1)
    big = heatmap(capture("t"))  # 60 turns: every 3rd turn (at most 25 ticks), still integers
    big.reasoning = np.full((60, 60), np.nan)
    big.observation = np.full((60, 60), np.nan)
    assert heatmap_figure(big).layout.xaxis.dtick == 3


@pytest.mark.parametrize("kinds,text", [
    (["decision"], "1 query (decision only); no reasoning-step queries"),
    (["reasoning", "reasoning"], "2 queries (reasoning steps only)"),
    (["reasoning"], "1 query (reasoning step only)"),
    (["reasoning", "reasoning", "action", "decision"], "4 queries: 2 reasoning steps, 1 tool-call-only step, 1 decision"),
    (["token", "token"], "2 queries (chosen tokens only); no reasoning-step queries"),
    ([], "no queries"),
])
def test_query_counts_text(kinds, text):
    assert describe_queries([QueryPoint(i, k, 1, 2) for i, k in enumerate(kinds)]) == text


def test_capture_group():
    # the 5th call of the run is the worker's 2nd: labelled by its id (issue 29: "#5" matched no call id)
    runner = {"trajectory_id": "base-q1/search_worker-2",
              "trajectory_meta": {"runner": "nis-agent", "run_id": "base-q1", "agent": "search_worker", "call_index": 5}}
    assert capture_group(runner, "runs") == ("runs · run base-q1", "search_worker-2", (5, "base-q1/search_worker-2"))
    ibis = {"trajectory_id": "i7/observer", "framing": "observer", "trajectory_meta": {"ibis": {"item_id": "i7",
                                                                                              "framing": "observer"}}}
    assert capture_group(ibis, ".") == ("IBIS item i7", "observer", ("observer",))
    assert capture_group({"trajectory_id": "x", "trajectory_meta": {"question_id": "q9"}}, "") == ("question q9", "x",
                                                                                                  ("x",))
    assert capture_group({"trajectory_id": "x", "trajectory_meta": None}, "imported") == ("imported", "x", ("x",))
    assert capture_group({"trajectory_id": "x"}) == ("captures", "x", ("x",))


def test_report_index_groups_links_and_collapsed_sections(tmp_path):
    root = tmp_path / "caps"
    for i in (10, 2, 0):  # call 10 sorts after call 2 although its folder name sorts first
        agent = "manager" if i != 2 else "search_worker"
        capture(f"base-q1/{agent}-{i}", run_id="base-q1", agent=agent, call_index=i, runner="nis-agent").save(
            root / "runs" / f"base-q1_{agent}-{i}")
    capture("base-q2/manager-0", run_id="base-q2", agent="manager", call_index=0).save(root / "runs" / "q2-m0")
    for fr in ("observer", "agentic"):
        capture(f"i7/{fr}", queries=[QueryPoint(27, "decision", 3, 6)], ibis={"item_id": "i7", "framing": fr}).save(
            root / "ibis" / f"i7_{fr}")
    capture("plain").save(root / "plain")
    html = write_report(root).read_text()

    rows = re.findall(r'<tr><td><a href="#(g\d+)">([^<]+)</a> \((\d+)\)</td><td>(.*?)</td></tr>', html)
    index = {name: (int(n), re.findall(r'<a href="#(c\d+)" title="([^"]+)">([^<]+)</a>', links))
             for _, name, n, links in rows}
    assert list(index) == ["ibis · IBIS item i7", "captures", "runs · run base-q1", "runs · run base-q2"]
    # in call order, each labelled by its call id (base-q1/manager-10 is "manager-10", never a run-wide index)
    assert [label for *_, label in index["runs · run base-q1"][1]] == ["manager-0", "search_worker-2",
                                                                       "manager-10"]
    assert index["runs · run base-q1"][0] == 3 and index["runs · run base-q2"][0] == 1
    assert [label for *_, label in index["ibis · IBIS item i7"][1]] == ["agentic", "observer"]
    anchor, title, _ = index["ibis · IBIS item i7"][1][0]
    assert title == "i7/agentic: 4 turns, 1 query (decision only); no reasoning-step queries"
    # every link has its collapsed section, every group its heading
    for _, links in index.values():
        for a, _, label in links:
            assert re.search(rf'<details class="capture" id="{a}">\n<summary><b>{re.escape(label)}</b>', html)
    assert all(f'<h2 id="{g}">{name}</h2>' in html for g, name, *_ in rows)
    assert html.count('<details class="capture"') == 7 and "<details class=\"capture\" open" not in html

    # the counts said once per section, the same in the summary line, the table and the figure note
    sec = html[html.index(f'id="{anchor}"'):]
    sec = sec[:sec.index("</details>")]
    assert "· 4 turns, 1 query (decision only); no reasoning-step queries</span>" in sec
    assert "<tr><th>queries</th><td>1 query (decision only); no reasoning-step queries</td></tr>" in sec
    assert "No heatmap: it needs reasoning-step queries, and this capture has none." in sec
    assert "tokens / turns / queries" not in html and "No reasoning-step queries in this capture" not in html
    plain = html[html.index("<b>plain</b>"):]
    plain = plain[:plain.index("</details>")]
    assert "3 queries: 2 reasoning steps, 1 tool-call-only step" in plain and HEATMAP_GREY_NOTE.split(":")[0] in plain
    assert '"dtick":1' in plain and '"tickmode":"linear"' in plain


def test_ibis_numbers_section_is_html():
    """The IBIS report's "Numbers" (report.md) as real HTML: tables, headings, lists, quotes, escaped."""
    from attnprobe.results.formatting import template_env

    md = ("# IBIS report: M\n\nProtocol: **matched** (x).\n\n## Behaviour (next action)\n\n"
          "| framing | subset | accuracy |\n|---|---|---|\n| agentic | should_research | 50.0% |\n"
          "| observer | headline | `a<b` |\n\n- gap: **+0.1** [−0.2, 0.3]\n- second\n\n"
          "### Forced choice\n\n> **Warning:** renamed.\n\n| layer | head |\n|---|---|\n| 3 | 1 |\n")
    html = template_env("attnprobe.studies.ibis").get_template("report.html").render(
        m={"model": "M"}, figures=[], markdown=md)
    numbers = html[html.index("<h2>Numbers</h2>"):]
    assert "<pre>" not in html and "|---" not in numbers and "# IBIS" not in numbers
    assert ("<table><tr><th>framing</th><th>subset</th><th>accuracy</th></tr>\n"
            "<tr><td>agentic</td><td>should_research</td><td>50.0%</td></tr>\n"
            "<tr><td>observer</td><td>headline</td><td><code>a&lt;b</code></td></tr>\n</table>") in numbers
    assert "<p>Protocol: <strong>matched</strong> (x).</p>" in numbers
    assert "<h3>Behaviour (next action)</h3>" in numbers and "<h4>Forced choice</h4>" in numbers
    assert "<ul><li>gap: <strong>+0.1</strong> [−0.2, 0.3]</li>\n<li>second</li>\n</ul>" in numbers
    assert "<blockquote><strong>Warning:</strong> renamed.</blockquote>" in numbers
    assert numbers.count("<table>") == 2 and numbers.count("</table></div>") == 2


def test_no_decay_plot_without_an_eligible_step_and_plotly_still_loaded(tmp_path):
    """Issue 29: captures with fewer than 5 past turns drew an empty decay plot; now a line says why, and
    plotly.js (which the decay figure carried) is still on the page, once, for the heatmaps."""
    root = tmp_path / "caps"
    capture("short").save(root / "short")
    html = write_report(root).read_text()
    assert "Decay curves (20 bins" not in html
    assert "No decay curves: no reasoning step has ≥5 past turns." in html
    assert html.count("plotly.js v") == 1  # the library's banner comment: inlined exactly once
