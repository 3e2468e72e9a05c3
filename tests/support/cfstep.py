"""A hand-built counterfactual step folder whose numbers are known (the app page tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.counterfactual.analysis import CF_ROLES, GROUPS
from attnprobe.counterfactual.store import write_step
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult


def tiny_result(rows: np.ndarray, segments: list[Segment], text_tokens: list[str]) -> CaptureResult:
    text = "".join(text_tokens)
    ends = np.cumsum([len(t) for t in text_tokens])
    offsets = np.stack([ends - [len(t) for t in text_tokens], ends], axis=1)
    seg_att = np.stack([[r[s.start:s.end].sum() for s in segments] for r in rows])
    n = len(text_tokens)
    return CaptureResult("t", np.arange(n), segments, [QueryPoint(n - 2, "decision", 1, 3), QueryPoint(n - 1, "reasoning", 1, 3)],
                         [0], seg_att, seg_att[:, None, None, :], rows, text=text, offsets=offsets)


def make_step(folder: Path) -> None:
    # original: system (0), task (1), observation (2-3, masked), step (4-5); counterfactual: placeholder (2)
    segs = [Segment("system", "external", 0, 0, 0, 1), Segment("task", "external", 0, 1, 1, 2),
            Segment("observation", "external", 0, 2, 2, 4), Segment("reasoning", "self", 1, 3, 4, 6)]
    rows = np.array([[0.4, 0.1, 0.2, 0.05, 0.25, 0.0], [0.3, 0.1, 0.1, 0.1, 0.2, 0.2]], dtype=np.float32)
    orig = tiny_result(rows, segs, ["<s>", "Task", " obs", " more", " I", " go"])
    csegs = [Segment("system", "external", 0, 0, 0, 1), Segment("task", "external", 0, 1, 1, 2),
             Segment("observation", "external", 0, 2, 2, 3), Segment("reasoning", "self", 1, 3, 3, 5)]
    crows = np.array([[0.5, 0.2, 0.05, 0.25, 0.0], [0.4, 0.1, 0.1, 0.2, 0.2]], dtype=np.float32)
    cf = tiny_result(crows, csegs, ["<s>", "Task", " [masked]", " I", " go"])
    T, R = 2, len(CF_ROLES)
    mo, mc = np.zeros((2, T, R), np.float32), np.zeros((2, T, R), np.float32)
    mo[0, 0, 0], mo[0, 0, 1], mo[0, 0, 4], mo[0, 1, 2] = 0.4, 0.1, 0.25, 0.25
    mc[0, 0, 0], mc[0, 0, 1], mc[0, 0, CF_ROLES.index("placeholder")], mc[0, 1, 2] = 0.5, 0.2, 0.05, 0.25
    red = {g: 0.0 for g in GROUPS}
    red.update({"system": 0.1, "task": 0.1, "placeholder": 0.05})
    q = {"removed_mass": 0.2, "changed_message_mass": 0.25, "removed_observation_mass": 0.2, "redistribution": red}
    record = {"trajectory_id": "t", "policy": "mask:0", "step_message_index": 3, "turn": 1, "roles": list(CF_ROLES),
              "changes": {"0": "kept", "1": "kept", "2": "placeholder"},
              "tokens": {"original": 5, "counterfactual": 4, "saved": 1, "saved_share": 0.2},
              "queries": {"decision": q, "reasoning": q}}
    write_step(folder, record, {"mass_original": mo, "mass_counterfactual": mc,
                                "removed_tokens": np.array([0, 0, 1, 1, 0, 0], np.int8)}, orig, cf)
