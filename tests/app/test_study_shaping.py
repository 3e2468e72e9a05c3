"""The Study page's data shaping, pure functions with known answers (app/study_data.py): which steps get a
turn heatmap, the sequential colour range, blank observation rows, the role of a replaced message, the key
columns first, and a study's per-call captures kept off the Decay page and the Trajectory picker."""

from __future__ import annotations

import numpy as np
from support.studydir import OTHER, call_id, make_study

from attnprobe.render.segments import Segment
from attnprobe_app import data as D
from attnprobe_app import shaping as SH
from attnprobe_app import study_data as SD


def _step(step: int, capture: str | None, num_turns: int | None) -> SD.Step:
    return SD.Step(step=step, call_id=f"c{step}", sent=0, history_messages=None, changes={}, reply="", tool_calls=[],
                   input_tokens=None, output_tokens=None, capture=capture, num_turns=num_turns)


def test_heatmaps_only_for_steps_with_two_past_turns():
    steps = [_step(1, "a", 1), _step(2, "b", 2), _step(3, "c", 3), _step(4, None, None), _step(5, "e", 7),
             _step(6, "f", None)]
    assert SH.heatmap_steps(steps) == [3, 5]  # 2 and 6 past turns; 0 and 1 past turns get none
    assert SH.heatmap_steps(steps, min_past=6) == [5]
    assert (SH.past_turns(1), SH.past_turns(3), SH.past_turns(0)) == (0, 2, 0)


def test_sequential_range_starts_at_zero_and_an_all_zero_map_stays_white():
    z = np.array([[np.nan, 0.0], [0.25, np.nan]])
    assert SH.sequential_range(z) == (0.0, 0.25)
    assert SH.sequential_range(np.zeros((2, 2))) == (0.0, 1.0)  # zero maps to white, not to the full colour
    assert SH.sequential_range(np.full((2, 2), np.nan)) == (0.0, 1.0)
    obs = SH.observation_cells(np.ones((3, 3)), [True, False, True])
    assert np.isnan(obs[1]).all() and obs[0].tolist() == [1, 1, 1] and obs[2].tolist() == [1, 1, 1]


def test_a_replaced_message_has_its_own_role():
    meta = {"trajectory_meta": {"history": {"source": [0, 1, 2, 4, 5, 6], "refined": [6],
                                            "changes": {"4": "placeholder", "3": "removed", "6": "refined"}}}}
    # sent message 3 came from full-history message 4 (a placeholder); sent 5 from 6 (refined); 3 was dropped
    assert SH.message_status(meta) == {3: "placeholder", 5: "refined"}
    assert SH.removed_count(meta) == 1 and SH.removed_count({}) == 0 and SH.message_status({}) == {}
    segs = [Segment("system", "external", 0, 0, 0, 2), Segment("reasoning", "self", 0, 2, 2, 4),
            Segment("observation", "external", 0, 3, 4, 6), Segment("observation", "external", 1, 5, 6, 8),
            Segment("reasoning", "self", 2, 6, 8, 9)]
    assert SH.segment_roles(segs, meta) == ["system", "reasoning", "placeholder", "refined", "reasoning"]
    mass = SH.turn_role_mass([0.1, 0.2, 0.3, 0.15, 0.25], segs, SH.segment_roles(segs, meta), 3)
    assert set(mass) == {"system", "reasoning", "placeholder", "refined"}
    np.testing.assert_allclose(mass["placeholder"], [0.3, 0, 0])
    np.testing.assert_allclose(mass["reasoning"], [0.2, 0, 0.25])
    assert SH.turn_ticks(3, SH.turn_status(segs, meta)) == ["0 (placeholder)", "1 (refined)", "2"]
    # the token strip: the placeholder's tokens (4, 5) and the refined ones (6, 7) leave the observation role
    from attnprobe.render.segments import ROLES

    obs = ROLES.index("observation")
    tok = np.array([ROLES.index("system")] * 2 + [ROLES.index("reasoning")] * 2 + [obs] * 4 + [ROLES.index("reasoning")])
    got, names = SH.token_roles_with_policy(tok, segs, meta)
    assert [names[i] for i in got] == ["system", "system", "reasoning", "reasoning", "placeholder", "placeholder",
                                       "refined", "refined", "reasoning"]
    assert tok[4] == obs  # the capture's own array is left as it is


def test_key_columns_come_first():
    rows = [{"setting": "none", "calls": 3, "system": "1", "current step": "2", "placeholder": "0", "refined": "5"}]
    assert list(SH.key_columns_first(rows)[0]) == ["setting", "placeholder", "refined", "current step", "calls",
                                                     "system"]
    assert SH.key_columns_first([]) == []


def test_a_studys_per_call_captures_are_grouped_under_it(tmp_path):
    root = tmp_path / "data"
    make_study(root / "study")
    from support.studydir import toy_capture

    toy_capture("plain").save(root / "captures" / "plain")
    inv = D.discover(root.resolve())
    by_rel = {e.rel: e.study for e in inv.captures}
    assert by_rel["captures/plain"] == "" and len(by_rel) == 3
    assert {s for r, s in by_rel.items() if r != "captures/plain"} == {"study"}
    assert [e.rel for e in inv.trajectory_captures()] == ["captures/plain"]  # off Decay and the picker by default
    assert len(inv.trajectory_captures(studies=True)) == 3
    got = next(e for e in inv.captures if e.trajectory_id == call_id(OTHER, "q1", 3))
    assert got.label.startswith("study study · ")
