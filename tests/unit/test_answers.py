"""The one exact-match scorer (attnprobe.agents.answers, issue 26 item 10): Search-R1's em_check with SQuAD's
normalize_answer, pinned on accents, articles and punctuation."""

from __future__ import annotations

import pytest

from attnprobe.agents.answers import exact_match, normalize_answer


@pytest.mark.parametrize(("text", "want"), [
    ("The  Great Eastern!", "great eastern"),        # lower, punctuation, the article, spaces
    ("An apple a day", "apple day"),                 # every a/an/the as a word
    ("Theatre", "theatre"),                          # not inside a word
    ("Zürich", "zürich"),                            # accents kept (SQuAD / Search-R1 do not fold them)
    ("Akashi Kaikyō Bridge", "akashi kaikyō bridge"),
    ("1,991 m.", "1991 m"),                          # punctuation removed, not spaced
    ("Great-Eastern", "greateastern"),
    ("“quoted” — text", "“quoted” — text"),          # not in string.punctuation: kept
    ("snake_case", "snakecase"),                     # '_' is punctuation (the old runner kept it)
])
def test_normalize_answer(text, want):
    assert normalize_answer(text) == want


def test_exact_match_known_answers():
    assert exact_match("the Great Eastern.", ["SS Great Eastern", "Great Eastern"]) is True
    assert exact_match("Great Eastern ship", ["Great Eastern"]) is False   # exact, not containment
    assert exact_match("Zürich", ["Zurich"]) is False                      # no accent folding
    assert exact_match("ZÜRICH", ["zürich"]) is True                       # case folds, accents stay
    assert exact_match("1,991", "1991") is True                            # one gold as a string
    assert exact_match("The.", ["the"]) is False                           # empty after normalising: never
    assert exact_match(None, ["x"]) is False and exact_match("x", []) is None and exact_match("x", None) is None
