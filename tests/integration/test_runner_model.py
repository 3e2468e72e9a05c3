"""End-to-end runner tests with the real bundled model (SmolLM2-135M-Instruct on CPU).

Budgets are small so the module stays within a few minutes; CI runs these (marked slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import attnprobe
from attnprobe.agents.questions import read_questions as load_questions
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.render.rendering import render
from attnprobe.studies.runner import BM25Search, RunSettings, run_questions
from attnprobe.trajectory.schema import Trajectory

pytestmark = pytest.mark.slow

from support.paths import ROOT  # noqa: E402
from support.server import served  # noqa: E402

QUESTIONS = ROOT / "trajectories" / "questions.jsonl"
SMALL = dict(manager_steps=2, worker_steps=2, max_new_tokens=64, max_validation_steps=2)


@pytest.fixture(scope="module")
def bm25():
    return BM25Search()


@pytest.fixture(scope="module")
def e2e(smol, bm25, tmp_path_factory):
    """The full NIS-Agent setting on two questions with the real model."""
    out = tmp_path_factory.mktemp("e2e") / "nis.jsonl"
    res = run_questions(TransformersChat(smol), load_questions(QUESTIONS)[:2],
                        RunSettings.preset("nis-agent", **SMALL), out, search=bm25)
    return out, res


def test_end_to_end_two_questions(e2e):
    out, res = e2e
    assert [r["question_id"] for r in res["results"]] == ["q01", "q02"]
    trajs = attnprobe.load_trajectories(out)
    assert {t.meta["run_id"] for t in trajs} == {"nis-agent-q01", "nis-agent-q02"}
    for r in res["results"]:
        assert isinstance(r["answer"], str) and r["correct"] in (True, False)
        assert r["input_tokens"] > 0 and r["output_tokens"] > 0
        mine = [t for t in trajs if t.meta["run_id"] == r["run_id"]]
        assert r["calls"] == len(mine)
        assert r["input_tokens"] == sum(t.meta["usage"]["input_tokens"] for t in mine)
    agents = {t.meta["agent"] for t in trajs}
    assert {"manager", "search_worker"} <= agents
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["runs"] == 2 and summary["mean_total_tokens"] > 0


def test_real_filter_and_validation_prompts_are_isolated(e2e):
    out, _ = e2e
    trajs = attnprobe.load_trajectories(out)
    for t in trajs:
        sent = t.messages[:-1]
        if t.meta["agent"] == "filter":
            rewrite = t.meta.get("purpose") == "rewrite"  # a bare "No" followed by the request for a query
            assert [m["role"] for m in sent] == ["system", "user"] + (["assistant", "user"] if rewrite else [])
            assert sent[1]["content"].startswith("Task: ")
            assert f"Search query: {t.meta['query']}\n" in sent[1]["content"]
            assert "search worker" not in json.dumps(sent) and t.tools is None
        if t.meta["agent"] == "validator_final":
            assert [m["role"] for m in sent] == ["system", "user"]
            assert sent[1]["content"].startswith("Task: ") and "Proposed answer: " in sent[1]["content"]
            assert "You are the manager" not in json.dumps(sent)
        if t.meta["agent"] == "validator_stage2":
            assert [m["role"] for m in sent] == ["system", "user"]
            assert "You are the manager" not in json.dumps(sent)
            labels = t.meta["premises"]
            shown = [ln[1:].split("]")[0] for ln in sent[1]["content"].split("Inference")[0].splitlines()
                     if ln.startswith("[")]
            assert shown == labels


def test_filter_events_match_what_the_worker_saw(e2e, smol):
    """The filter record in a worker call's meta describes the observation in that call's context."""
    out, _ = e2e
    for t in attnprobe.load_trajectories(out):
        for event in t.meta.get("filter", []) if t.meta["agent"] == "search_worker" else []:
            (obs,) = [m["content"] for m in t.messages if m.get("tool_call_id") == event["call_id"]]
            assert event["tokens"]["shown"] == len(smol.tokenizer.encode(obs, add_special_tokens=False))
            assert event["chars"]["shown"] == len(obs)
            if event["outcome"] == "unable":
                assert event["replaced"] and obs.startswith("Unable to find a relevant result for this query;")
            if event["outcome"] in ("keep", "unparseable") and not event["rewrites"]:
                assert not event["replaced"] and event["tokens"]["shown"] == event["tokens"]["original"]
            assert event["outcome"] in ("sites", "keep", "unparseable", "unable")


def test_capture_a_recorded_worker_call(e2e, smol):
    out, _ = e2e
    trajs = attnprobe.load_trajectories(out)
    worker = [t for t in trajs if t.meta["agent"] == "search_worker"]
    assert worker
    traj = min(worker, key=lambda t: len(json.dumps(t.messages)))
    result = attnprobe.capture(smol, traj, queries="reasoning+decision")
    assistants = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    assert [q.message_index for q in result.queries if q.kind == "reasoning"] == assistants
    # the decision is where the model decided: the last token of the prompt it was sent (the call without its
    # reply, rendered with the generation prompt), before the reply's first token (issue 26)
    pending = render(Trajectory(id=traj.id, messages=traj.messages[:-1], tools=traj.tools), smol.tokenizer)
    decision = [q for q in result.queries if q.kind == "decision"]
    assert [q.position for q in decision] == [len(pending.input_ids) - 1]
    assert list(result.input_ids[:len(pending.input_ids)]) == list(pending.input_ids)
    reply_start = min(q.position for q in result.queries if q.message_index == len(traj.messages) - 1
                      and q.kind != "decision")
    assert decision[0].position < reply_start
    np.testing.assert_allclose(result.segment_attention.sum(axis=1), 1.0, atol=1e-5)
    roles = {s.role for s in result.segments}
    assert {"system", "task", "template"} <= roles


def test_resume_after_killed_run(smol, bm25, tmp_path):
    """Kill a real `attnprobe run` process mid-run, resume, and check nothing is lost or duplicated."""
    out = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "attnprobe", "run", str(QUESTIONS), "--limit", "2", "--out", str(out),
           "--preset", "baseline", "--manager-steps", "2", "--worker-steps", "2", "--max-new-tokens", "64",
           "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    before = [json.loads(x) for x in out.read_text().splitlines()]
    assert before
    settings = RunSettings.preset("baseline", manager_steps=2, worker_steps=2, max_new_tokens=64)
    res = run_questions(TransformersChat(smol), load_questions(QUESTIONS)[:2], settings, out, search=bm25,
                        resume=True)
    trajs = attnprobe.load_trajectories(out)  # raises on a duplicate id
    ids = [t.id for t in trajs]
    assert len(ids) == len(set(ids))
    assert {b["id"] for b in before} <= set(ids)  # every finished call survived
    results = [json.loads(x) for x in out.with_suffix(".results.ndjson").read_text().splitlines()]
    assert sorted(r["question_id"] for r in results) == ["q01", "q02"]
    assert sum(r["replayed_calls"] for r in res["results"]) + res["skipped"] >= 1
    for r in results:
        assert r["calls"] == sum(1 for t in trajs if t.meta["run_id"] == r["run_id"])


def test_openai_backend_against_real_server(bm25, tmp_path):
    from attnprobe.generation.factory import open_backend

    with served("default") as info:  # python -m attnprobe.generation.server --port 0
        chat = open_backend("openai", base_url=info["url"], served_model="SmolLM2-135M-Instruct", timeout=300)
        out = tmp_path / "api.jsonl"
        res = run_questions(chat, load_questions(QUESTIONS)[:1],
                            RunSettings.preset("nis-agent", manager_steps=1, worker_steps=1, max_new_tokens=48,
                                               max_validation_steps=1), out, search=bm25)
    r = res["results"][0]
    assert r["input_tokens"] > 0 and r["output_tokens"] > 0
    trajs = attnprobe.load_trajectories(out)
    assert trajs and all(t.model == "SmolLM2-135M-Instruct" for t in trajs)
    assert all(t.meta["usage"]["input_tokens"] > 0 for t in trajs)
