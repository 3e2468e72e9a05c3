"""Ids that name files are safe file names, and question/answer text has no NUL, checked when the input is read,
before any model loads (issue 27: 250-character ids failed at write time after the model ran; '.', '..',
'.hidden' and '-rf' became file names; ``golden_answers: null`` next to ``answer`` left a question unscored)."""

from __future__ import annotations

import json
import os

import pytest

from attnprobe.agents.questions import QuestionsError, read_questions
from attnprobe.io import safe_name
from attnprobe.io.fs import id_problem
from attnprobe.studies.ibis.items import ItemError, load_items

GOOD_ITEM = {"id": "x-1", "task": "What is the boiling point of water?", "query": "boiling point water",
             "results": [{"title": "Water", "url": "https://en.wikipedia.org/wiki/Water", "snippet": "100 C"}],
             "label": "should_return_answer"}
BAD_IDS = [".", "..", ".hidden", "-rf", "a" * 250, "a/b", "a\x00b", "_x", ""]


def _questions(tmp_path, *records) -> os.PathLike:
    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return p


@pytest.mark.parametrize("qid", BAD_IDS)
def test_unsafe_question_ids_are_refused_with_file_line_field(tmp_path, qid):
    p = _questions(tmp_path, {"id": "ok", "question": "Q?"}, {"id": qid, "question": "Q?"})
    with pytest.raises(QuestionsError) as exc:
        read_questions(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}, line 2: field 'id': use 1-128 letters") and len(msg) < 300 + len(str(p))


@pytest.mark.parametrize("qid", BAD_IDS)
def test_unsafe_ibis_item_ids_are_refused(tmp_path, qid):
    p = tmp_path / "items.jsonl"
    p.write_text(json.dumps({**GOOD_ITEM, "id": qid}) + "\n", encoding="utf-8")
    with pytest.raises(ItemError, match=r"line 1, field 'id': use 1-128 letters"):
        load_items(p)


def test_the_rule_keeps_ordinary_ids():
    for ok in ("q001", "5a8b57f25542995d1e6f1371", "2hop__13548_13529", "sci-07", "a.b", 17, "x" * 128):
        assert id_problem(ok) is None, ok
    assert id_problem(True) is not None and id_problem("x" * 129) is not None


def test_safe_name_never_makes_an_option_like_name():
    assert not safe_name("-rf").startswith("-") and safe_name("-rf").startswith("rf-")
    assert safe_name("a-") != "a-" and safe_name("ok-id") == "ok-id"


def test_null_gold_next_to_a_given_answer_is_refused(tmp_path):
    p = _questions(tmp_path, {"id": "a", "question": "Q?", "golden_answers": None, "answer": "Paris"})
    with pytest.raises(QuestionsError, match=r"line 1: field 'golden_answers': is null but 'answer' has a value"):
        read_questions(p)
    p = _questions(tmp_path, {"id": "a", "question": "Q?", "golden_answers": None})  # no gold at all: unscored
    assert read_questions(p)[0]["answers"] == []


@pytest.mark.parametrize("record, field", [
    ({"id": "a", "question": "Q\x00?"}, "question"),
    ({"id": "a", "question": "Q?", "answer": "Par\x00is"}, "answer"),
    ({"id": "a", "question": "Q?", "answers": ["x", "y\x00"]}, "answers"),
    ({"id": "a", "question": "Q?", "answer": {"value": "x\x00"}}, "answer"),
    ({"id": "a", "question": "Q?", "answer": "x", "aliases": ["\x00"]}, "aliases"),
])
def test_nul_characters_are_refused(tmp_path, record, field):
    p = _questions(tmp_path, record)
    with pytest.raises(QuestionsError, match=rf"line 1: field '{field}': contains a NUL character"):
        read_questions(p)


def test_a_fifo_is_named_as_one_not_as_missing(tmp_path):
    fifo = tmp_path / "q.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(QuestionsError) as exc:
        read_questions(fifo)
    assert "FIFO" in str(exc.value) and "not found" not in str(exc.value)
    with pytest.raises(ItemError, match="FIFO"):
        load_items(fifo)
    with pytest.raises(QuestionsError, match="questions file not found"):
        read_questions(tmp_path / "missing.jsonl")
