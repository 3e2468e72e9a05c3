"""Removed mass (tokens absent from the counterfactual context) vs mass on changed messages (issue 26 item 8),
on hand-built captures whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe.agents.policies import Counterfactual
from attnprobe.counterfactual.analysis import absent_tokens, step_analysis
from attnprobe.counterfactual.steps import Step
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory

END, U, TOOL, ASST = "<|im_end|>", "<|im_start|>user", "<|im_start|>tool", "<|im_start|>assistant"
VOCAB: dict[str, int] = {}


def capture(pieces: list[tuple[str, int, list[str]]], row: list[float]) -> CaptureResult:
    """pieces: (role, message index, token texts); role ``template`` for chat markers. Token ids come from
    one shared vocabulary, so equal texts have equal ids in both contexts."""
    texts, segs = [], []
    for role, msg, toks in pieces:
        segs.append(Segment(role, "self" if role == "reasoning" else "external", int(msg == 3), msg, len(texts),
                            len(texts) + len(toks)))
        texts += toks
    ids = np.asarray([VOCAB.setdefault(t, len(VOCAB)) for t in texts])
    ends = np.cumsum([len(t) for t in texts])
    offsets = np.stack([ends - [len(t) for t in texts], ends], axis=1)
    n = len(texts)
    rows = np.asarray([row, row], dtype=np.float64)
    seg_att = np.stack([[r[s.start:s.end].sum() for s in segs] for r in rows])
    return CaptureResult("t", ids, segs, [QueryPoint(n - 2, "decision", 1, 3), QueryPoint(n - 1, "reasoning", 1, 3)],
                         [0], seg_att, seg_att[:, None, None, :], rows, text="".join(texts), offsets=offsets)


def context(observation: list[str] | None, row: list[float]) -> CaptureResult:
    """system (0), user task (1), tool observation (2; None: the message is gone), assistant step (3)."""
    pieces = [("template", 0, ["<s>"]), ("system", 0, ["sys"]), ("template", 0, [END, U]), ("task", 1, ["Task"]),
              ("template", 1, [END])]
    if observation is not None:
        pieces += [("template", 2, [TOOL]), ("observation", 2, observation), ("template", 2, [END])]
    pieces += [("template", 3, [ASST]), ("reasoning", 3, [" I", " go"])]
    return capture(pieces, row)


# original decision row: sys markers .30/.05/.01/.01, task .10/.01, tool marker .02, " A." .10, " B." .20,
# " C." .05, end .02, assistant marker .03, " I" .10, " go" 0 -> message 2 owns tokens 6..10 = .39
ROW = [0.30, 0.05, 0.01, 0.01, 0.10, 0.01, 0.02, 0.10, 0.20, 0.05, 0.02, 0.03, 0.10, 0.0]
ORIG = [" A.", " B.", " C."]


@pytest.mark.parametrize(("kept", "source", "status", "absent"), [
    ([" A.", " C."], [0, 1, 2], "refined", [8]),              # a refiner kept A and C: only " B." is gone
    ([" [masked]"], [0, 1, 2], "placeholder", [7, 8, 9]),     # masked: the content goes, its markers stay
    (None, [0, 1], "removed", [6, 7, 8, 9, 10]),              # removed whole: markers too
])
def test_absent_tokens(kept, source, status, absent):
    original = context(ORIG, ROW)
    n_cf = len(ROW) - 3 + (len(kept) if kept is not None else -2)
    cf = context(kept, [0.0] * n_cf)
    got = absent_tokens(original, cf, source, {0: "kept", 1: "kept", 2: status, 3: "kept"})
    assert np.nonzero(got)[0].tolist() == absent


def _analysis(original, counterfactual, third: dict, step: str, status: str, policy: str):
    """step_analysis of a 4-message trajectory (system, task, ``third``, the step) whose message 2 has ``status``."""
    traj = Trajectory(id="t", messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "Task"},
                                        third, {"role": "assistant", "content": step}])
    cf = Counterfactual(messages=[], source=[0, 1, 2], changes={0: "kept", 1: "kept", 2: status}, policy=policy)
    return step_analysis(original, counterfactual, cf, Step(traj, 3, 1), [0, 0, 0, 1])


def test_refined_removed_mass_is_the_dropped_sentence_not_the_whole_message():
    original = context(ORIG, ROW)
    n_cf = len(context([" A.", " C."], [0.0] * 12).input_ids)
    cf_row = [0.35, 0.05, 0.01, 0.01, 0.12, 0.01, 0.03, 0.15, 0.10, 0.03, 0.04, 0.10, 0.0]
    assert len(cf_row) == n_cf
    counterfactual = context([" A.", " C."], cf_row)
    q, arrays = _analysis(original, counterfactual, {"role": "tool", "content": "A. B. C."}, "I go", "refined",
                          "refine")
    d = q["decision"]
    assert d["removed_mass"] == pytest.approx(0.20)               # " B." only
    assert d["changed_message_mass"] == pytest.approx(0.39)       # markers + kept sentences + dropped one
    assert d["removed_observation_mass"] == pytest.approx(0.20)
    assert d["changed_observation_mass"] == pytest.approx(0.39)  # the tool markers take the observation role
    assert d["kept_mass"] == pytest.approx(1 - 0.39)
    # the redistribution is measured against the changed messages and sums to their mass
    assert sum(d["redistribution"].values()) == pytest.approx(d["changed_message_mass"], abs=1e-9)
    assert arrays["absent_tokens"].tolist() == [0] * 8 + [1] + [0] * 5


def calls_context(text: list[str], call: list[str] | None, row: list[float]) -> CaptureResult:
    """system (0), task (1), assistant turn with text and a <search> call (2; call None: dropped), step (3)."""
    pieces = [("template", 0, ["<s>"]), ("system", 0, ["sys"]), ("template", 0, [END, U]), ("task", 1, ["Task"]),
              ("template", 1, [END]), ("template", 2, [ASST]), ("reasoning", 2, text)]
    if call is not None:
        pieces.append(("tool_call", 2, call))
    pieces += [("template", 2, [END]), ("template", 3, [ASST]), ("reasoning", 3, [" Ok", " go"])]
    return capture(pieces, row)


def test_dropped_calls_removed_mass_is_part_of_the_changed_mass():
    """ircot:oq drops a turn's call and keeps its text; the text's last token tokenizes differently without
    the call (" think" -> " think."), so it is absent from the counterfactual though it is no tool-call token.
    Issue 37: it was in the removed mass (absent) and not in the changed mass (tool-call tokens only), so the
    removed mass exceeded the changed one (shipped ircot:oq 6.71% vs 6.34%); now it is in both."""
    # tokens: <s> sys END U Task END | ASST " I" " think" <search> q </search> END | ASST " Ok" " go"
    row = [0.30, 0.05, 0.01, 0.01, 0.10, 0.01, 0.02, 0.05, 0.10, 0.03, 0.15, 0.02, 0.02, 0.04, 0.09, 0.0]
    original = calls_context([" I", " think"], ["<search>", "q", "</search>"], row)
    cf_row = [0.32, 0.05, 0.01, 0.01, 0.12, 0.01, 0.03, 0.07, 0.12, 0.02, 0.05, 0.19, 0.0]
    counterfactual = calls_context([" I", " think."], None, cf_row)
    q, arrays = _analysis(original, counterfactual, {"role": "assistant", "content": "I think <search>q</search>"},
                          "Ok go", "calls_removed", "ircot:oq")
    d = q["decision"]
    assert arrays["absent_tokens"].tolist() == [0] * 8 + [1, 1, 1, 1] + [0] * 4  # " think" and the call
    assert d["removed_mass"] == pytest.approx(0.30)  # " think" .10 + the call .20
    # changed: the call (.20), its closing marker (.02, owned by the call) and the absent " think" (.10)
    assert d["changed_message_mass"] == pytest.approx(0.32)
    assert d["removed_mass"] <= d["changed_message_mass"]
    assert d["kept_mass"] == pytest.approx(1 - 0.32)
    assert sum(d["redistribution"].values()) == pytest.approx(d["changed_message_mass"], abs=1e-9)
    assert arrays["removed_tokens"].tolist() == [0] * 8 + [1, 1, 1, 1, 1] + [0] * 3
