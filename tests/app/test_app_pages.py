"""Every app page under Streamlit's AppTest, on real outputs of the bundled model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from support.appdata import (  # noqa: E402
    APP_FILE,
    capture_dirs,
    decode,
    find_chart,
    ibis_folder,
    is_heatmap,
    is_token_strip,
    strip_values,
)

from attnprobe.results.analysis import decay_curves, heatmap  # noqa: E402
from attnprobe.results.result import CaptureResult  # noqa: E402

TIMEOUT = 120


def run_app(monkeypatch, data: Path | None, page: str | None = None) -> AppTest:
    if data is None:
        monkeypatch.delenv("ATTNPROBE_APP_DATA", raising=False)
    else:
        monkeypatch.setenv("ATTNPROBE_APP_DATA", str(data))
    at = AppTest.from_file(APP_FILE, default_timeout=TIMEOUT)
    if page:
        at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at, kind: str) -> str:
    return "\n".join(str(e.value) for e in getattr(at, kind))


def select_capture(at, base: Path, folder: Path):
    rel = folder.relative_to(base).as_posix()
    at.sidebar.selectbox(key="traj_run").set_value(rel).run()
    assert not at.exception, [e.value for e in at.exception]
    return rel


# ------------------------------------------------------------------ trajectory
def test_trajectory_heatmap_equals_analysis(monkeypatch, app_data):
    at = run_app(monkeypatch, app_data)
    folders = [f for f in capture_dirs(app_data) if any(
        q.kind == "reasoning" for q in CaptureResult.load(f).queries)]
    assert len(folders) >= 3
    for folder in folders:
        rel = select_capture(at, app_data, folder)
        res = CaptureResult.load(folder)
        hm = heatmap(res)
        chart = find_chart(at, is_heatmap)
        rea, obs = decode(chart["data"][0]["z"]), decode(chart["data"][1]["z"])
        assert rea.shape == (res.num_turns, res.num_turns)
        np.testing.assert_allclose(rea, hm.reasoning, rtol=1e-6, atol=1e-9, equal_nan=True)
        np.testing.assert_allclose(obs, hm.observation, rtol=1e-6, atol=1e-9, equal_nan=True)
        assert np.isnan(np.diag(rea)).all() and np.isnan(np.diag(obs)).all()
        # separate colour scales whose limits leave out the (masked) diagonal
        assert chart["data"][0]["colorscale"] != chart["data"][1]["colorscale"]
        assert chart["data"][0]["zmax"] == pytest.approx(hm.reasoning_clim[1], rel=1e-9)
        assert chart["data"][1]["zmax"] == pytest.approx(hm.observation_clim[1], rel=1e-9)
        # hover names the turn, the role and the turn's text
        assert "role: reasoning" in chart["data"][0]["hovertemplate"]
        assert "%{text}" in chart["data"][0]["hovertemplate"]
        t, j = int(hm.steps[-1]), 0
        cell = chart["data"][0]["text"][t][j]
        assert cell and cell.split("<br>")[0][:10] in " ".join(
            res.text[int(res.offsets[s.start][0]):int(res.offsets[s.end - 1][1])]
            for s in res.segments if s.turn == j).replace("<", "&lt;")
        assert rel in texts(at, "caption")

    # layer and head selectors feed analysis.heatmap(layer, head)
    res = CaptureResult.load(folders[0])
    rel = select_capture(at, app_data, folders[0])
    layer, head = res.layers[len(res.layers) // 2], 3
    at.selectbox(key=f"layer:{rel}").set_value(layer).run()
    at.selectbox(key=f"head:{rel}").set_value(head).run()
    assert not at.exception
    hm = heatmap(res, layer, head)
    chart = find_chart(at, is_heatmap)
    np.testing.assert_allclose(decode(chart["data"][0]["z"]), hm.reasoning, rtol=1e-6, atol=1e-9, equal_nan=True)
    np.testing.assert_allclose(decode(chart["data"][1]["z"]), hm.observation, rtol=1e-6, atol=1e-9, equal_nan=True)
    assert not np.allclose(np.nan_to_num(hm.reasoning), np.nan_to_num(heatmap(res).reasoning))


def test_token_strip_follows_the_chosen_query(monkeypatch, app_data):
    at = run_app(monkeypatch, app_data)
    folder = max(capture_dirs(app_data), key=lambda f: CaptureResult.load(f).num_turns)
    rel = select_capture(at, app_data, folder)
    res = CaptureResult.load(folder)
    n = len(res.input_ids)
    sb = at.selectbox(key=f"query:{rel}")
    reasoning = [i for i, q in enumerate(res.queries) if q.kind == "reasoning"]
    assert sb.options[0].startswith("reasoning start")
    for qi in (reasoning[0], reasoning[len(reasoning) // 2], reasoning[-1]):
        sb.set_value(qi).run()
        assert not at.exception
        chart = find_chart(at, is_token_strip)
        got = strip_values(chart, n)
        np.testing.assert_allclose(got, res.token_attention[qi], rtol=1e-6, atol=1e-12)
        roles_seen = {t["name"] for t in chart["data"]}
        assert {"system", "reasoning"} <= roles_seen
        sb = at.selectbox(key=f"query:{rel}")
    # the per-turn bars are the chosen query's segment attention summed per (turn, role)
    bars = find_chart(at, lambda c: c["data"] and c["data"][0].get("hovertemplate", "").startswith("turn %{x}"))
    total = sum(decode(t["y"]).sum() for t in bars["data"])
    assert total == pytest.approx(float(res.segment_attention[reasoning[-1]].sum()), rel=1e-6)
    # big tables are paginated
    assert at.number_input(key=f"toppage:{rel}").value == 1


def test_step_breakdown_is_drawn_on_request_with_the_analysis_numbers(monkeypatch, app_data):
    """The per-step breakdown is a fourth figure below the fold: off at first draw (the page opens faster),
    drawn by its toggle with analysis.step_breakdown's shares."""
    from attnprobe.results.analysis import step_breakdown
    from attnprobe.results.figures import STEP_PARTS

    at = run_app(monkeypatch, app_data)
    folder = max(capture_dirs(app_data), key=lambda f: CaptureResult.load(f).num_turns)
    select_capture(at, app_data, folder)
    is_steps = lambda c: c["data"] and c["data"][0].get("hovertemplate", "").startswith("step %{x}")  # noqa: E731
    assert not [c for c in charts_of(at) if is_steps(c)]
    at.toggle(key="traj_steps").set_value(True).run()
    assert not at.exception
    chart = find_chart(at, is_steps)
    expect = step_breakdown(CaptureResult.load(folder))["steps"]
    assert [t["name"] for t in chart["data"]] == [p.replace("_", " ") for p in STEP_PARTS]
    for t, part in zip(chart["data"], STEP_PARTS):
        np.testing.assert_allclose(decode(t["y"]), [s[part] for s in expect], rtol=1e-9)


def charts_of(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


# ------------------------------------------------------------------ decay
def test_decay_page_overlays_runs(monkeypatch, app_data):
    at = run_app(monkeypatch, app_data, page="Decay")
    assert at.sidebar.radio(key="page").value == "Decay"
    assert at.sidebar.radio(key="decay_group").value == "run"  # one model here: runs overlaid by default
    at.sidebar.radio(key="decay_group").set_value("model").run()
    at.sidebar.slider(key="decay_min_past").set_value(3).run()
    chart = find_chart(at, lambda c: any("cumulative" in t.get("hovertemplate", "") for t in c["data"]))
    results = [CaptureResult.load(f) for f in capture_dirs(app_data)]
    expect = decay_curves(results, bins=20, min_past=3, roles=("reasoning", "tool_call", "observation"))
    model = results[0].meta["model"]
    tr = next(t for t in chart["data"] if t["name"] == f"{model} · reasoning")
    np.testing.assert_allclose(decode(tr["y"]), expect["mean"]["reasoning"], rtol=1e-9, equal_nan=True)
    assert len(decode(tr["x"])) == 20
    cum = next(t for t in chart["data"] if t["name"] == f"{model} · all past turns")
    np.testing.assert_allclose(decode(cum["y"]), expect["cumulative"]["all"], rtol=1e-9, equal_nan=True)
    assert np.nanmax(decode(cum["y"])) < 1.0
    # one curve set per run when overlaying runs
    at.sidebar.radio(key="decay_group").set_value("run").run()
    names = {t["name"].split(" · ")[0] for t in find_chart(
        at, lambda c: any("cumulative" in t.get("hovertemplate", "") for t in c["data"]))["data"]}
    assert len(names) >= 2
    assert at.dataframe, "headline table missing"


# ------------------------------------------------------------------ framings + models
def test_framings_page_item_and_aggregate(monkeypatch, app_data):
    from safetensors.numpy import load_file

    folder = ibis_folder(app_data)
    index = json.loads((folder / "attention.json").read_text())
    arrays = load_file(str(folder / "attention.safetensors"))
    metrics = json.loads((folder / "metrics.json").read_text())
    at = run_app(monkeypatch, app_data, page="Framings")
    rel = folder.relative_to(app_data).as_posix()
    assert at.sidebar.selectbox(key="fr_folder").value == rel
    # aggregated view: numbers from metrics.json
    chart = find_chart(at, lambda c: c["data"] and c["data"][0].get("type") == "bar")
    sub = metrics["attention"]["by_category"]["headline"]
    for tr in chart["data"]:
        assert list(decode(tr["y"])) == pytest.approx([sub[c][tr["name"]] for c in ("query", "results", "reminder",
                                                                                     "task")])
    # one item: bars = mean over layers and heads of attention.safetensors, decisions shown
    item = index["items"][0]
    at.sidebar.selectbox(key=f"fr_item:{rel}").set_value(item).run()
    assert not at.exception
    i = index["items"].index(item)
    chart = find_chart(at, lambda c: c["data"] and c["data"][0].get("type") == "bar")
    cats = index["categories"]
    for tr in chart["data"]:
        want = [float(arrays[f"mass.{tr['name']}"][i, cats.index(c)].mean()) for c in ("query", "results",
                                                                                       "reminder", "task")]
        np.testing.assert_allclose(decode(tr["y"]), want, rtol=1e-6)
    assert {t["name"] for t in chart["data"]} == {"agentic", "observer", "direct"}
    heads = find_chart(at, lambda c: c["data"] and c["data"][0].get("type") == "heatmap")
    d = arrays["mass.agentic"][i, cats.index("query")] - arrays["mass.observer"][i, cats.index("query")]
    np.testing.assert_allclose(decode(heads["data"][0]["z"]), d.T, rtol=1e-5, atol=1e-9)
    top = next(df.value for df in at.dataframe if "layer" in df.value.columns)
    la, h = int(top["layer"].iloc[0]), int(top["head"].iloc[0])
    assert abs(d[index["layers"].index(la), h]) == pytest.approx(np.abs(d).max())
    # behaviour: one decision per framing, as in decisions.jsonl
    decisions = [json.loads(x) for x in (folder / "decisions.jsonl").read_text().splitlines()
                 if x.strip()] if (folder / "decisions.jsonl").is_file() else []
    mine = {d_["framing"]: d_ for d_ in decisions if d_["item_id"] == item}
    assert mine, f"no decisions for {item}: the IBIS behaviour run failed (see {folder / 'errors.jsonl'})"
    dec = next(df.value for df in at.dataframe if "framing" in df.value.columns)
    assert set(dec["framing"]) == set(mine)
    for _, row in dec.iterrows():
        assert row["decision"] == mine[row["framing"]]["decision"]
        assert row["correct"] == ("yes" if mine[row["framing"]]["correct"] else "no")


def test_models_page(monkeypatch, app_data):
    rows = json.loads((app_data / "compare" / "compare.json").read_text())
    at = run_app(monkeypatch, app_data, page="Models")
    src = at.sidebar.selectbox(key="models_src")
    for source in src.options:
        at.sidebar.selectbox(key="models_src").set_value(source).run()
        assert not at.exception
        chart = find_chart(at, lambda c: len(c["data"]) == 2 and c["data"][0].get("type") == "bar")
        # one bar per variant: labelled by folder (model, dtype, protocol), never stacked by model name
        assert list(chart["data"][0]["x"]) == [r["label"] for r in rows]
        for trace, key in ((chart["data"][0], "inertia_gap"), (chart["data"][1], "attentional_gap")):
            want = np.nan if rows[0][key] is None else rows[0][key]
            np.testing.assert_allclose(decode(trace["y"])[0], want, rtol=1e-9, equal_nan=True)
            assert trace["error_y"]["type"] == "data"
        lo, hi = rows[0]["attentional_gap_ci95"]
        assert lo <= rows[0]["attentional_gap"] <= hi  # the real bundled-model gap, with its bootstrap CI
        table = at.dataframe[0].value
        assert list(table["model"]) == [r["model"] for r in rows]


# ------------------------------------------------------------------ empty, partial, corrupt, unsafe
def test_no_data_dir_and_empty_dir(monkeypatch, tmp_path):
    at = run_app(monkeypatch, None)
    assert "no data directory configured" in texts(at, "error")
    at = run_app(monkeypatch, tmp_path / "missing")
    assert "does not exist" in texts(at, "error")
    empty = tmp_path / "empty"
    empty.mkdir()
    for page in ("Trajectory", "Decay", "Framings", "Models", "Study"):
        at = run_app(monkeypatch, empty, page=page)
        assert "holds no attnprobe outputs yet" in texts(at, "info")
        assert "attnprobe study interference QUESTIONS.jsonl" in texts(at, "info")


def test_corrupt_and_partial_data(monkeypatch, app_data, tmp_path):
    data = tmp_path / "data"
    good, second = capture_dirs(app_data)[:2]
    shutil.copytree(good, data / "good")
    shutil.copytree(second, data / "corrupt")
    (data / "corrupt" / "meta.json").write_text('{"format_version": 1, "trajectory_id": ')
    shutil.copytree(second, data / "partial")
    (data / "partial" / "scores.safetensors").unlink()
    shutil.copytree(second, data / "badscores")
    (data / "badscores" / "scores.safetensors").write_bytes(b"\x00" * 64)
    ib = data / "ibis" / "m"
    ib.mkdir(parents=True)
    (ib / "items.jsonl").write_text('{"id": "x1", "label": "should_research"}\n{torn')
    (ib / "metrics.json").write_text("{ nope")
    for page in ("Trajectory", "Decay", "Framings", "Models"):
        at = run_app(monkeypatch, data, page=page)
        # the corrupt meta.json is reported, named, and the app keeps working
        exp = at.expander
        assert any("could not be read" in e.label for e in exp), page
        assert "unreadable: corrupt/meta.json, line 1: invalid JSON" in texts(at, "text"), page
    at = run_app(monkeypatch, data)
    opts = at.sidebar.selectbox(key="traj_run").options
    assert not any("corrupt" in o for o in opts)
    at.sidebar.selectbox(key="traj_run").set_value("partial").run()
    assert not at.exception
    assert "scores.safetensors is missing" in texts(at, "error")
    at.sidebar.selectbox(key="traj_run").set_value("badscores").run()
    assert "cannot read scores" in texts(at, "error")
    at.sidebar.text_input(key="traj_path").input("corrupt").run()
    assert not at.exception
    assert "corrupt/meta.json, line 1: invalid JSON" in texts(at, "error")
    at = run_app(monkeypatch, data, page="Framings")
    assert "ibis/m/metrics.json, line 1: invalid JSON" in texts(at, "text")


def test_paths_outside_the_data_dir_are_refused(monkeypatch, app_data, tmp_path):
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    shutil.copytree(capture_dirs(app_data)[0], outside / "run")
    shutil.copytree(capture_dirs(app_data)[0], data / "inside")
    os.symlink(outside / "run", data / "link")  # a symlinked folder pointing outside
    at = run_app(monkeypatch, data)
    for attempt in ("../outside/run", str(outside / "run"), "inside/../../outside/run", "link"):
        at.sidebar.text_input(key="traj_path").input(attempt).run()
        assert not at.exception
        err = texts(at, "error")
        assert "outside the data directory" in err, attempt
        assert not at.get("plotly_chart"), attempt
    at.sidebar.text_input(key="traj_path").input("inside").run()
    assert find_chart(at, is_heatmap)
    # the same check guards the ?run= deep link
    monkeypatch.setenv("ATTNPROBE_APP_DATA", str(data))
    at = AppTest.from_file(APP_FILE, default_timeout=TIMEOUT)
    at.query_params["run"] = "../outside/run"
    at.run()
    assert "outside the data directory" in texts(at, "error")


def test_cli_launch_command(tmp_path):
    from attnprobe.cli.app import app_entry, build_command
    from attnprobe.cli.main import main

    cmd = build_command(tmp_path, 8600, "127.0.0.1")
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == app_entry()
    assert cmd[-2:] == ["--data", str(tmp_path)] and "127.0.0.1" in cmd
    assert main(["app", "--data", str(tmp_path / "nope")]) == 2
