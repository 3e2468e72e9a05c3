"""The runner as a job (issue 28) and its batching options (issue 30): a killed run resumes by default with
the records of an uninterrupted one, the Ray replica's code path writes what a local run writes, batches and
structured actions, the one count line. A scripted chat and a fixed search backend, no model."""

from __future__ import annotations

import copy
import json

import pytest
from support.fixed_search import FixedSearch
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.execution import RunCounts
from attnprobe.generation.toolparse import call_ids
from attnprobe.studies.runner import RunnerJob, RunSettings, run_questions

QS = [{"id": f"t{i}", "question": f"What is answer {i}?", "answers": [str(40 + i)], "type": None} for i in (1, 2, 3)]


def script(messages, tools):
    """The manager delegates once then answers; the worker searches once then answers (4 calls a question)."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    searched = any(m["role"] == "tool" for m in messages)
    if messages[0]["content"].startswith("You are the manager"):
        name, args = ("final_answer", {"answer": "42"}) if searched else ("search_worker", {"task": question})
    else:
        name, args = ("final_answer", {"answer": "42"}) if searched else ("web_search", {"query": "q2 " + question})
    return "", [tool_call(call_ids(messages, 1)[0], name, **args)]


SETTINGS = RunSettings.preset("baseline", worker_steps=2, manager_steps=2)


def results(out) -> list[dict]:
    """The results file without the times (everything else must be identical)."""
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"}
            for x in out.with_suffix(".results.ndjson").read_text().splitlines()]


def test_a_killed_run_resumes_by_default_with_the_records_of_an_uninterrupted_run(tmp_path):
    ref = tmp_path / "ref.jsonl"
    run_questions(ScriptedChat(script), QS, SETTINGS, ref, search=FixedSearch())
    out = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match="scripted interruption"):  # in the 2nd call of the 2nd question
        run_questions(ScriptedChat(script, fail_on_call=6), QS, SETTINGS, out, search=FixedSearch())
    assert len(results(out)) == 1 and len(out.read_text().splitlines()) == 5
    chat = ScriptedChat(script)
    res = run_questions(chat, QS, SETTINGS, out, search=FixedSearch())  # no resume flag: the default
    assert res["counts"] == RunCounts(done_before=1, done=2, failed=0) and res["skipped"] == 1
    assert len(chat.sent) == 8 - 1  # the 2nd question's first call was replayed, not sent again
    assert out.read_text() == ref.read_text()
    assert [r["replayed_calls"] for r in results(out)] == [0, 1, 0]
    assert [{**r, "replayed_calls": 0} for r in results(out)] == results(ref)
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["runs"] == 3 and summary["total_calls"] == 12 and "caveats" in summary


def test_the_cli_resumes_a_killed_run_on_the_next_plain_invocation(tmp_path, monkeypatch, capsys):
    from attnprobe.cli import run as cli_run
    from attnprobe.cli.main import main

    monkeypatch.setattr("attnprobe.agents.search.make_search", lambda kind, corpus=None: FixedSearch())
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QS))
    argv = ["run", str(qfile), "--preset", "baseline", "--worker-steps", "2", "--manager-steps", "2",
            "--no-progress", "--out"]
    monkeypatch.setattr(cli_run, "make_chat", lambda args: ScriptedChat(script))
    assert main([*argv, str(tmp_path / "ref.jsonl")]) == 0
    monkeypatch.setattr(cli_run, "make_chat", lambda args: ScriptedChat(script, fail_on_call=9))  # question 3
    assert main([*argv, str(tmp_path / "r.jsonl")]) != 0  # "unexpected RuntimeError: scripted interruption"
    assert "scripted interruption" in capsys.readouterr().err
    monkeypatch.setattr(cli_run, "make_chat", lambda args: ScriptedChat(script))
    assert main([*argv, str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    assert f"run: 1 run, 2 already done, 0 failed -> {tmp_path / 'r.jsonl'}\n" in err
    assert (tmp_path / "r.jsonl").read_text() == (tmp_path / "ref.jsonl").read_text()
    assert results(tmp_path / "r.jsonl") == results(tmp_path / "ref.jsonl")
    # --force reruns everything; --resume with --force is refused
    assert main([*argv, str(tmp_path / "r.jsonl"), "--force"]) == 0
    assert "run: 3 run, 0 already done, 0 failed" in capsys.readouterr().err
    assert main([*argv, str(tmp_path / "r.jsonl"), "--force", "--resume"]) == 2
    assert capsys.readouterr().err.strip() == "attnprobe: error: --resume and --force exclude each other"


def test_the_replica_path_writes_what_a_local_run_writes(tmp_path):
    """What a Ray replica does with the job (attnprobe.distributed.replica.Replica.run): a copy of the job
    (Ray ships it), whole batches of a shard, ``done`` asked with the job's start time; the driver collects.
    The records equal a local run's; a retried shard skips the question an earlier attempt finished."""
    from attnprobe.distributed.replica import Replica
    from attnprobe.execution.job import batches

    ref = tmp_path / "ref.jsonl"
    run_questions(ScriptedChat(script), QS, SETTINGS, ref, search=FixedSearch())
    out = tmp_path / "ray.jsonl"
    driver = RunnerJob(out, QS, SETTINGS, search=FixedSearch(), batch_size=2)
    replica = Replica.__new__(Replica)  # a replica whose loaded "model" is the scripted chat
    replica.model, replica.load_error, replica._prepared = ScriptedChat(script), None, (None, None)
    shards = [[b] for b in batches(driver.items(), driver.batch_size)]
    assert [[it.key for it in s[0]] for s in shards] == [["baseline-t1", "baseline-t2"], ["baseline-t3"]]
    for shard in shards:
        for rec in replica.run(copy.deepcopy(driver), shard, job_start=0.0):
            assert rec["status"] == "written"
            driver.collect(next(it for b in shard for it in b if it.key == rec["key"]), rec["result"])
    again = replica.run(copy.deepcopy(driver), shards[1], job_start=0.0)  # a retried shard
    assert [r["status"] for r in again] == ["skipped"]
    assert out.read_text() == ref.read_text() and results(out) == results(ref)
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["runs"] == 3 and summary["correct"] == 1  # t2's gold is 42


def test_batch_size_hands_the_executor_batches_with_the_same_records(tmp_path, monkeypatch):
    seen = []
    run = RunnerJob.run

    def spy(self, chat, batch):
        seen.append([it.key for it in batch])
        return run(self, chat, batch)

    monkeypatch.setattr(RunnerJob, "run", spy)
    run_questions(ScriptedChat(script), QS, SETTINGS, tmp_path / "one.jsonl", search=FixedSearch())
    assert seen == [["baseline-t1"], ["baseline-t2"], ["baseline-t3"]]
    seen.clear()
    run_questions(ScriptedChat(script), QS, SETTINGS, tmp_path / "two.jsonl", search=FixedSearch(), batch_size=2)
    assert seen == [["baseline-t1", "baseline-t2"], ["baseline-t3"]]
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    assert results(tmp_path / "two.jsonl") == results(tmp_path / "one.jsonl")


def test_structured_actions_are_recorded_only_when_on_and_a_resume_without_them_is_refused(tmp_path):
    import attnprobe

    on = SETTINGS.with_(structured_actions=True)
    assert "structured_actions" not in SETTINGS.to_dict() and on.to_dict()["structured_actions"] is True
    out = tmp_path / "s.jsonl"
    run_questions(ScriptedChat(script, actions=True), QS[:1], on, out, search=FixedSearch())
    assert [t.meta["settings"]["structured_actions"] for t in attnprobe.load_trajectories(out)] == [True] * 4
    assert json.loads(out.with_suffix(".summary.json").read_text())["settings"]["structured_actions"] is True
    assert results(out)[0]["settings"]["structured_actions"] is True
    with pytest.raises(attnprobe.AttnprobeError, match=r"structured_actions: True there, False now"):
        run_questions(ScriptedChat(script), QS[:1], SETTINGS, out, search=FixedSearch())


def test_cli_batch_size_and_structured_actions_reach_the_run(tmp_path, monkeypatch):
    from attnprobe.cli import run as cli_run
    from attnprobe.cli.main import build_parser, main

    args = build_parser().parse_args(["run", "--limit", "1", "--out", str(tmp_path / "o.jsonl"),
                                      "--questions-per-batch", "3", "--structured-actions", "--no-progress"])
    got = cli_run.runner_options(args)
    assert got.batch_size == 3 and got.settings.structured_actions is True and not got.force
    assert len(got.questions) == 1
    monkeypatch.setattr(cli_run, "make_chat", lambda args: pytest.fail("a model was loaded"))
    assert main(["run", "--out", str(tmp_path / "o.jsonl"), "--generator", "openai", "--base-url", "http://h/v1",
                 "--served-model", "m", "--ray"]) == 2  # an endpoint serves many requests itself


def test_run_counts_line_and_exit_code():
    c = RunCounts.of({"done_before": 2, "done": 5, "failed": 1})
    assert c == RunCounts(2, 5, 1) and c.exit_code == 1 and RunCounts(1, 0, 0).exit_code == 0
    assert c.line("ibis run", done="decided", to="x/decisions.jsonl") == \
        "ibis run: 5 decided, 2 already done, 1 failed -> x/decisions.jsonl"
    assert RunCounts().line("study interference") == "study interference: 0 run, 0 already done, 0 failed"


def test_one_search_index_per_process_and_corpus_content(tmp_path):
    """Issue 39: one search cache (agents/search.py: shared_search; the loop study's job calls it too): the
    same (kind, corpus) is indexed once per process; a corpus changed in place is indexed again."""
    from attnprobe.agents.search import shared_search

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"title": "Holmium", "url": "u1", "text": "Holmium is named after Stockholm."}) + "\n")
    first = RunnerJob(tmp_path / "out.jsonl", [], RunSettings(), search_kind="bm25", corpus=str(corpus))._search()
    assert shared_search("bm25", str(corpus)) is first
    assert [r.title for r in first.search("Stockholm", 1)] == ["Holmium"]
    corpus.write_text(json.dumps({"title": "Erbium", "url": "u2", "text": "Erbium is named after Ytterby."}) + "\n")
    again = shared_search("bm25", str(corpus))
    assert again is not first and [r.title for r in again.search("Ytterby", 1)] == ["Erbium"]
