"""TransformersChat on the tiny random-weight SmolLM2 (support/tiny_model.py; the bundled tokenizer and
template, and like the bundled model it writes prose here, no call): the no-call budget stops rows that write no call, per row and
as a prefix of the full greedy generation, and per-row progress is reported (issue 22, item 6)."""

from __future__ import annotations

import pytest
from support.paths import ROOT  # noqa: E402

from attnprobe.generation.transformers_chat import PROGRESS_EVERY, TransformersChat, opens_call
from attnprobe.studies.ibis.framings import FRAMINGS, build_framing
from attnprobe.studies.ibis.items import load_items

ITEM = load_items(ROOT / "trajectories" / "ibis_items.jsonl")[0]


@pytest.mark.parametrize("text, opened", [
    ("You should consider whether these", False),
    ('Sure. {"name": "web_search"', True),
    ("<tool_call>\n", True),
    ("Calling tools:\n[", True),
    ("web_search(query=", True),
    ("<think>\nThe results are about a festival", True),  # still thinking: not stopped
    ("<think>ok</think>\nThe answer is", False),
])
def test_what_opens_a_call(text, opened):
    assert opens_call(text, ["web_search", "visit_page"]) is opened


def test_no_call_budget_stops_each_row_and_keeps_a_prefix(tiny_smol):
    smol = tiny_smol
    reqs = [(t.messages, t.tools) for t in (build_framing(ITEM, fr) for fr in FRAMINGS)]
    free = TransformersChat(smol, stop_at_call=False).complete_many(reqs, max_new_tokens=24)
    chat = TransformersChat(smol, stop_names=["web_search", "visit_page"], stop_check_every=1, no_call_tokens=6)
    got = chat.complete_many(reqs, max_new_tokens=24)
    stopped = 0
    for f, g in zip(free, got):
        assert f.raw_text.startswith(g.raw_text)  # greedy: the stopped reply is a prefix
        if g.stopped_by == "no_call":
            stopped += 1
            assert g.output_tokens == 6 and not opens_call(g.raw_text, ["web_search", "visit_page"])
        else:  # it opened a call (or ended) within the budget
            assert opens_call(g.raw_text) or g.stopped_by == "eos"
    assert stopped >= 1  # prose, as the 135M model writes here (tests/data/baseline: every reply unparseable)
    one = chat.complete(*reqs[0], max_new_tokens=24)
    assert one.raw_text == got[0].raw_text and one.stopped_by == got[0].stopped_by
    with pytest.raises(ValueError, match="no_call_tokens must be"):
        TransformersChat(smol, no_call_tokens=0)


def test_per_row_progress_is_reported(tiny_smol):
    smol = tiny_smol
    reqs = [(t.messages, t.tools) for t in (build_framing(ITEM, fr) for fr in FRAMINGS)]
    seen = []
    TransformersChat(smol, stop_at_call=False).complete_many(reqs, max_new_tokens=PROGRESS_EVERY,
                                                            on_progress=lambda *a: seen.append(a))
    assert seen and seen[-1][0] == PROGRESS_EVERY and seen[-1][2] == 3 and 0 <= seen[-1][1] <= 3
