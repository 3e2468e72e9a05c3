"""The issue-19 record fields in one call (counterfactual.extras.extra_fields): details, the refined split
for both queries and the own-tool action, on a hand-built capture whose numbers are known."""

from __future__ import annotations

import numpy as np
import pytest
from support.cfstep import tiny_result
from support.messages import call

from attnprobe.agents.policies import mask_observations, refine_rounds
from attnprobe.agents.refiners import split_sentences
from attnprobe.counterfactual.extras import extra_fields
from attnprobe.render.segments import Segment
from attnprobe.trajectory.schema import Trajectory

DOC = "Alpha one.\nBeta two.\nGamma."
TRAJ = Trajectory(id="t", tools=[{"type": "function", "function": {"name": "web_search"}}], messages=[
    {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
    {"role": "assistant", "content": "think", "tool_calls": [call("c0", "find_in_page", pattern="alpha")]},
    {"role": "tool", "tool_call_id": "c0", "content": DOC},
    {"role": "assistant", "content": "go on"}])
TOKENS = ["<s>sys", "task", "think", "<tool>", "Alpha", " one.", "\n", "Beta", " two.", "\n", "Gamma.", "<end>",
          "go", " on"]
SEGS = [Segment("system", "external", 0, 0, 0, 1), Segment("task", "external", 0, 1, 1, 2),
        Segment("reasoning", "self", 0, 2, 2, 3), Segment("template", "external", 0, 3, 3, 4),
        Segment("observation", "external", 0, 3, 4, 11), Segment("template", "external", 0, 3, 11, 12),
        Segment("reasoning", "self", 1, 4, 12, 14)]
ROWS = np.array([[0.2, 0.1, 0.1, 0.0, 0.1, 0.1, 0.0, 0.2, 0.0, 0.0, 0.1, 0.0, 0.1, 0.0],
                 [0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.1, 0.1, 0.0, 0.3, 0.0, 0.1, 0.0]], dtype=np.float32)


def keep_first_and_last(query, doc):
    s = split_sentences(doc)
    return "\n".join([s[0], s[-1]])


def test_extra_fields_on_a_known_capture():
    original = tiny_result(ROWS, SEGS, TOKENS)
    cfx = refine_rounds(keep_first_and_last)(TRAJ.messages[:4])
    assert cfx.indices("refined") == [3]
    record = {"queries": {"decision": {}, "reasoning": {}},
              "action": {"original": {"text": "<search>alpha</search>", "call": None},
                         "counterfactual": {"text": "", "call": {"name": "find_in_page", "arguments": {"pattern": "b"}}}}}
    extra_fields(record, original, cfx, TRAJ, 4)
    assert record["details"]["refined"]["3"] == {"query": "alpha think", "extractive": True,
                                                 "sentences": ["Alpha one.", "Beta two.", "Gamma."], "kept": [0, 2]}
    d, r = record["queries"]["decision"]["refined_split"], record["queries"]["reasoning"]["refined_split"]
    # decision row: Alpha one. 0.2, Beta two. 0.2, Gamma. 0.1, markers/newlines 0.0
    assert (d["kept_again"], d["dropped"], d["other"]) == pytest.approx((0.3, 0.2, 0.0))
    # reasoning row: Alpha one. 0.0, Beta two. 0.2, Gamma. 0.3, <tool> 0.1
    assert (r["kept_again"], r["dropped"], r["other"]) == pytest.approx((0.3, 0.2, 0.1))
    own = record["action"]["own"]
    assert own["vocabulary"] == ["find_in_page", "web_search"]  # declared tools + calls before the step
    assert (own["original"]["action"], own["counterfactual"]["action"], own["changed"]) == (
        "<search>", "find_in_page", True)
    assert "logprob" not in record  # no model given
    plain = {"queries": {"decision": {}, "reasoning": {}}}
    extra_fields(plain, original, mask_observations(0)(TRAJ.messages[:4]), TRAJ, 4)
    assert plain == {"queries": {"decision": {}, "reasoning": {}}}  # masking: nothing to add
