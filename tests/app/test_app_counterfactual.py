"""The counterfactual page under AppTest on a hand-built step folder whose numbers are known."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from support.appdata import charts, decode  # noqa: E402
from support.cfstep import make_step  # noqa: E402


def test_counterfactual_page_shows_known_numbers(tmp_path):
    make_step(tmp_path / "cf" / "t" / "mask_0" / "step_0003")
    script = f"""
from pathlib import Path
from attnprobe_app.views import counterfactual
counterfactual.render(Path({str(tmp_path)!r}), None)
"""
    at = AppTest.from_string(script, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["removed mass"] == "20.0%" and metrics["tokens saved"] == "1 (20%)"
    assert metrics["next action"] == "not run"
    cs = charts(at)
    pair = next(c for c in cs if len(c["data"]) == 3 and all(t["type"] == "heatmap" for t in c["data"]))
    diff = decode(pair["data"][2]["z"])
    assert pair["data"][2]["y"] == ["system", "task", "reasoning", "observation", "placeholder"]
    np.testing.assert_allclose(diff[:, 0], [0.1, 0.1, 0.0, -0.25, 0.05], atol=1e-6)
    strip = next(c for c in cs if c["data"] and "token %{x}" in c["data"][0].get("hovertemplate", ""))
    shapes = strip["layout"]["shapes"]
    assert [(s["x0"], s["x1"]) for s in shapes] == [(1.5, 3.5)]  # the masked observation's tokens 2-3


def test_counterfactual_page_lists_broken_steps_instead_of_a_traceback(tmp_path):
    """Issue 22 item 5: a symlinked step folder, a {} record and a string removed_mass are shown as
    skipped / errors naming the folder, never a traceback."""
    import json
    import os

    run = tmp_path / "cf" / "t" / "mask_0"
    make_step(run / "step_0003")
    outside = tmp_path.parent / f"{tmp_path.name}-outside" / "step_0005"
    make_step(outside)
    os.symlink(outside, run / "step_0005")
    make_step(run / "step_0001")
    (run / "step_0001" / "record.json").write_text("{}")
    make_step(run / "step_0002")
    rec = json.loads((run / "step_0002" / "record.json").read_text())
    rec["queries"]["decision"]["removed_mass"] = "a lot"
    (run / "step_0002" / "record.json").write_text(json.dumps(rec))
    errors = {}
    for step in ("step_0001", "step_0002", "step_0003"):
        script = f"""
from pathlib import Path
import streamlit as st
st.session_state["cf_step"] = "cf/t/mask_0/{step}"
from attnprobe_app.views import counterfactual
counterfactual.render(Path({str(tmp_path)!r}), None)
"""
        at = AppTest.from_string(script, default_timeout=60)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        errors[step] = [e.value for e in at.error]
        assert any("step_0005" in m.value and "symlinked" in m.value for m in at.markdown)
    assert errors["step_0001"] == ["Cannot show `cf/t/mask_0/step_0001`: cf/t/mask_0/step_0001/record.json: "
                                   "missing 'policy'"]
    assert "'queries.decision.removed_mass' is str 'a lot', not a finite number" in errors["step_0002"][0]
    assert errors["step_0003"] == []
