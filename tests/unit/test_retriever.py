"""The Search-R1 / FlashRAG retrieval-server client (attnprobe/agents/search.py: RetrieverSearch) against a scripted server on
127.0.0.1: the exact request bodies, passages split as Search-R1's _passages2string splits them (own newlines
kept), errors as for the other search backends, an IRCoT study that retrieves through it, and the reader of
FlashRAG / Search-R1 test splits."""

from __future__ import annotations

import json
import socket

import pytest
from support.interference import run_interference as run_study
from support.ircot import R1, R2, R3, A, Q, U, info
from support.retrieval_server import retrieval_server
from support.scripted_chat import ScriptedChat

from attnprobe.agents.questions import QuestionsError, read_questions
from attnprobe.agents.search import RetrieverSearch, SearchConfigError, SearchResult, make_search, split_contents
from attnprobe.agents.searchr1 import passages as ircot_passages
from attnprobe.errors import AttnprobeError
from attnprobe.execution.local import LocalExecutor
from attnprobe.studies.loop.agents import LoopConfig

ALPHA = SearchResult('"Alpha"', "retriever:1", "Alpha one. Alpha two.", "Alpha one.\nAlpha two.")
BETA = SearchResult('"Beta"', "retriever:2", "Beta one.", "Beta one.")
GAMMA = SearchResult('"Gamma"', "retriever:3", "Gamma one. Answer is 42.", "Gamma one. Answer is 42.")


def test_split_is_search_r1s():
    # generation.py _passages2string: title = first line, text = the other lines joined with "\n"
    assert split_contents('"T"\na\n\nb') == ('"T"', "a\n\nb")
    assert split_contents("only a title") == ("only a title", "")


def test_request_bodies_and_passages():
    with retrieval_server() as srv:
        r = RetrieverSearch(srv.url)
        assert r.search("q1 first", 3) == [ALPHA, BETA]
        assert r.retrieve(["q2 second", "nothing"], 1) == [[GAMMA], []]
        assert r.fetch("retriever:1") == '"Alpha"\n\nAlpha one.\nAlpha two.'
        assert r.fetch("retriever:9") is None
        assert srv.bodies == [{"queries": ["q1 first"], "topk": 3, "return_scores": True},
                              {"queries": ["q2 second", "nothing"], "topk": 1, "return_scores": True}]


def test_url_forms_and_configuration_errors():
    assert RetrieverSearch("http://127.0.0.1:8000").url == "http://127.0.0.1:8000/retrieve"
    assert RetrieverSearch("http://127.0.0.1:8000/").url == "http://127.0.0.1:8000/retrieve"
    assert RetrieverSearch("http://h:1/api/retrieve").url == "http://h:1/api/retrieve"
    assert isinstance(make_search("retriever", "http://127.0.0.1:8000/retrieve"), RetrieverSearch)
    with pytest.raises(SearchConfigError, match="needs the retrieval server's URL: pass --corpus"):
        make_search("retriever", None)
    with pytest.raises(SearchConfigError, match="must be http"):
        RetrieverSearch("corpus.jsonl")
    with pytest.raises(ValueError, match="use one of bm25, http, retriever"):
        make_search("e5")


def test_server_errors_are_search_errors():
    with retrieval_server() as srv:
        r = RetrieverSearch(srv.url, timeout=0.5)
        with pytest.raises(AttnprobeError, match=r"retrieval server http://127\.0\.0\.1:\d+/retrieve: HTTP 500"):
            r.search("FAIL now", 3)
        with pytest.raises(AttnprobeError, match=r'expected \{"result": \[one list per query\]\} for 1 queries, '
                                                 r'got \{"detail": "no result here"\}'):
            r.search("BROKEN", 3)
        with pytest.raises(AttnprobeError, match="timed out"):
            r.search("HANG", 3)
        srv.release.set()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AttnprobeError, match=f"retrieval server http://127.0.0.1:{port}/retrieve: .*refused"):
        RetrieverSearch(f"http://127.0.0.1:{port}").search("q1", 3)


def test_ircot_study_retrieves_through_the_server(tmp_path):
    """The bundled scripted IRCoT agent (tests/support/ircot.py) searches twice and answers; the model is
    sent the passages in Search-R1's format with their newlines."""
    chat = ScriptedChat(lambda m, tools: R1 if len(m) == 1 else R2 if len(m) == 3 else R3)
    with retrieval_server() as srv:
        cfg = LoopConfig("ircot", ircot_form="chat", max_turns=3, search="retriever", corpus=srv.url)
        counts, study = run_study(LocalExecutor(lambda: chat, progress=False), tmp_path, [Q], ["none"], cfg,
                                  n_boot=10)
        assert srv.bodies == [{"queries": ["q1 first"], "topk": 3, "return_scores": True},
                              {"queries": ["q2 second"], "topk": 3, "return_scores": True}]
    assert counts == {"done_before": 0, "done": 1, "failed": 0}
    d1 = 'Doc 1(Title: "Alpha") Alpha one.\nAlpha two.\nDoc 2(Title: "Beta") Beta one.'
    d2 = 'Doc 1(Title: "Gamma") Gamma one. Answer is 42.\nDoc 2(Title: "Beta") Beta one.'
    assert ircot_passages([("t", "a\nb")]) == "Doc 1(Title: t) a\nb\n"
    assert chat.sent == [[U], [U, A(R1), info(d1)], [U, A(R1), info(d1), A(R2), info(d2)]]
    result = json.loads(next((tmp_path / "none" / "results").glob("*.json")).read_text())
    assert (result["answer"], result["correct"], result["retrievals"]) == ("42", True, 2)
    assert result["config"]["search"] == "retriever" and result["config"]["corpus"] == srv.url


def test_a_failing_server_fails_the_item_not_the_observation(tmp_path):
    chat = ScriptedChat(lambda m, tools: "<think>x</think><search>FAIL q</search>")
    with retrieval_server() as srv:
        cfg = LoopConfig("ircot", ircot_form="chat", max_turns=2, search="retriever", corpus=srv.url)
        counts, _ = run_study(LocalExecutor(lambda: chat, progress=False), tmp_path, [Q], ["none"], cfg, n_boot=10)
    assert counts == {"done_before": 0, "done": 0, "failed": 1}
    err = json.loads((tmp_path / "errors.jsonl").read_text().splitlines()[0])
    assert "HTTP 500" in json.dumps(err)


# ------------------------------------------------------------------ FlashRAG / Search-R1 test splits
FLASHRAG = [{"id": "test_0", "question": "who got the first nobel prize in physics",
             "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {"type": "comparison"}},
            {"id": "test_1", "question": "when is the next deadpool movie being released",
             "golden_answers": ["May 18, 2018", "2018"], "metadata": {}}]
EXPECTED = [{"id": "test_0", "question": "who got the first nobel prize in physics",
             "answers": ["Wilhelm Conrad Röntgen"], "type": "comparison"},
            {"id": "test_1", "question": "when is the next deadpool movie being released",
             "answers": ["May 18, 2018", "2018"], "type": None}]


def test_flashrag_jsonl_split(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in FLASHRAG), encoding="utf-8")
    assert read_questions(path) == EXPECTED


def test_search_r1_parquet_split(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    # qa_search_test_merge.py: the FlashRAG columns kept, its own added (prompt, reward_model, extra_info)
    rows = [{**r, "data_source": "nq", "prompt": [{"role": "user", "content": "Answer the given question. ..."}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": r["golden_answers"]}},
             "extra_info": {"split": "test", "index": i}} for i, r in enumerate(FLASHRAG)]
    rows[1]["metadata"] = {"type": None}  # one struct type for the column
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    assert read_questions(tmp_path / "test.parquet") == EXPECTED
    bad = [{**rows[0], "golden_answers": []}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(QuestionsError, match=r"bad\.parquet, row 1: field 'golden_answers': expected .* got an "
                                             r"empty list"):
        read_questions(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(QuestionsError, match=r"junk\.parquet: not a readable Parquet file"):
        read_questions(tmp_path / "junk.parquet")


@pytest.mark.parametrize("command", [["run"], ["study", "interference"]])
def test_cli_needs_the_servers_url_before_any_model_loads(tmp_path, capsys, command):
    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    questions = str(data_path("questions_loop.jsonl"))
    assert main([*command, questions, "--search", "retriever", "--out", str(tmp_path / "o")]) == 2
    assert "the retriever needs the retrieval server's URL: pass --corpus http://HOST:PORT/retrieve" \
        in capsys.readouterr().err
