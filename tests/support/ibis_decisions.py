"""Hand-built IBIS items and decision records whose metrics are known by construction."""

from __future__ import annotations

from attnprobe.studies.ibis.items import IbisItem


def research_items(n: int) -> list[IbisItem]:
    return [IbisItem(id=f"i{k}", task="t", query=f"q{k}", label="should_research", domain="d",
                     results=[{"title": "a", "url": "https://a.org", "snippet": "s"}]) for k in range(n)]


def decision(i: int, fr: str, call: str, prose: str | None = None, expected: str = "web_search") -> dict:
    """A decision record: ``call`` = the call-only decision, ``prose`` = the secondary one (default: the same)."""
    prose = call if prose is None else prose
    return {"item_id": f"i{i}", "framing": fr, "expected": expected, "decision": call, "method": "parsed",
            "correct": call == expected, "decision_prose": prose, "method_prose": "intent",
            "correct_prose": prose == expected}


def six_item_decisions() -> tuple[list[IbisItem], list[dict]]:
    """Six should_research items. Call-only: agentic correct on i2, i4 (2/6), observer on i0, i1, i2 (3/6);
    parseable in both framings: i1, i2, i4, i5 (2/4 each); prose: agentic 2/6, observer 4/6; flips i0, i1
    (inertia direction) and i4 (reverse), of which i1 and i4 are parseable in both."""
    u, ws, vp = "unparseable", "web_search", "visit_page"
    rows = [  # (agentic call, agentic prose, observer call, observer prose)
        (u, vp, ws, ws),   # i0: flip in the inertia direction, agentic unparseable
        (vp, vp, ws, ws),  # i1: flip in the inertia direction, parseable in both
        (ws, ws, ws, ws),  # i2: correct in both
        (u, u, u, ws),     # i3: unparseable in both; the observer's prose says "search again"
        (ws, ws, vp, vp),  # i4: reverse flip, parseable in both
        (vp, vp, vp, vp),  # i5: wrong in both
    ]
    decs = []
    for i, (ac, ap, oc, op) in enumerate(rows):
        decs += [decision(i, "agentic", ac, ap), decision(i, "observer", oc, op)]
    return research_items(6), decs
