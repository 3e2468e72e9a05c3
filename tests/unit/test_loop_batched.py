"""Batched rollouts of the interference study (issue 30): episodes stepped together write the records one
episode after another writes, for both scaffolds and every kind of setting; kill and resume; the episode key
and end_episode; structured actions recorded only when on. A scripted chat model answers from what it is
sent (tests/support/scripted_chat.py); the search is the shipped BM25 corpus."""

from __future__ import annotations

import json
import re

import pytest
from support.interference import run_interference as run_study
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.agents.questions import read_questions
from attnprobe.execution.job import JobBase, WorkItem
from attnprobe.execution.local import LocalExecutor
from attnprobe.generation.chat import ActionFormat
from attnprobe.resources import data_path
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.job import InterferenceJob, inputs_stamp
from attnprobe.studies.loop.pool import TOOLS

QUESTIONS = read_questions(data_path("questions_loop.jsonl"))[:5]
REFINER = "openai:http://127.0.0.1:9/v1:refiner"  # answered by a scripted chat (the refiner_chat fixture)
# every kind of setting agents/policy_specs.py lists, alone and composed
SETTINGS = {
    "ircot": ["none", "mask:1", "mask-obs:1", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:2",
              f"refine:{REFINER}", "refine-latest:bm25:1", f"refine-latest:{REFINER}", "ircot:oq+refine:bm25:1"],
    "seed002": ["none", "mask:1", "mask-obs:1", "refine:bm25:2", f"refine:{REFINER}", "refine-latest:bm25:1",
                f"refine-latest:{REFINER}", "mask:1+refine:bm25:1"],
}
TIMING_FIELDS = ("seconds",)  # results/<qid>.json: the episode's wall time; nothing else recorded is time-based


def _kind(text: str, n: int) -> int:
    return sum(map(ord, text)) % n


def ircot_script(messages, tools):
    """Replies that depend on what is sent: the question picks a behaviour (answer at once, after one or
    two documents, one invalid reply first, or never: the final call), the visible documents the query and
    the answer, so a masked or refined context gets other replies."""
    text = "\n".join(str(m["content"]) for m in messages)
    infos = re.findall(r"<information>(.*?)</information>", text, re.S)
    kind = _kind(messages[0]["content"], 5)
    words = re.findall(r"[A-Za-z]{4,}", infos[-1] if infos else messages[0]["content"][-80:])
    if kind == 0 or (kind in (1, 3) and len(infos) >= kind) or (kind == 2 and len(infos) >= 2):
        return f"<think>found</think><answer>{words[-1] if words else 'none'}</answer>"
    if kind == 3 and len(infos) == 1 and "invalid" not in text:
        return "I am not sure what to do."
    return f"<think>need more</think><search>{' '.join(words[-3:]) or 'element'}</search>"


def seed002_script(messages, tools):
    """Tool calls that depend on what the agent has seen: search (two at once for some questions), then open
    or find on a URL from the newest observation, then a final response naming a word it saw."""
    seen = [m for m in messages if m["role"] == "tool"]
    kind = _kind(messages[1]["content"], 3)
    last = str(seen[-1]["content"]) if seen else messages[1]["content"]
    words = re.findall(r"[A-Za-z]{4,}", last)
    if len(seen) >= kind + 2:
        return f"Explanation: seen.\nExact Answer: {words[-1] if words else 'none'}\nConfidence: 70%"
    if not seen:
        calls = [tool_call("a", "search", query=" ".join(words[:4]))]
        if kind == 2:
            calls.append(tool_call("b", "search", query=" ".join(words[-3:])))
        return "", calls
    url = re.search(r"https?://\S+", last)
    if url and len(seen) % 2:
        return "", [tool_call("c", "open", id=url.group(0).rstrip(").,"))]
    return "", [tool_call("d", "find", id="1", pattern=words[0] if words else "the")]


SCRIPTS = {"ircot": ircot_script, "seed002": seed002_script}


@pytest.fixture(autouse=True)
def refiner_chat(monkeypatch):
    """refine:openai:... answered by a scripted chat: the first sentence naming a query word."""
    from attnprobe.agents import refiners

    def scripted(base_url, model, **kw):
        def refine(messages, tools):
            body = messages[-1]["content"]
            return body.strip().split("\n")[-1][:60]

        return refiners.chat_refiner(ScriptedChat(refine), **kw)

    monkeypatch.setattr(refiners, "openai_refiner", scripted)


def _config(scaffold, **kw):
    return LoopConfig(scaffold, max_turns=3 if scaffold == "ircot" else 4, top_k=2, open_lines=5, max_new_tokens=64, temperature=0.0,
                      **({"ircot_form": "chat"} if scaffold == "ircot" else {}), **kw)


def _study(out, chat, scaffold, batch_size, settings=None, **kw):
    return run_study(LocalExecutor(lambda: chat, progress=False), out, QUESTIONS, settings or SETTINGS[scaffold],
                     _config(scaffold, **kw), n_boot=20, batch_size=batch_size, model="scripted")


def _files(root):
    """Every record the study wrote, timing fields left out (study.json/md summarise them)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in ("study.json", "study.md", "errors.jsonl") and ".lock" not in p.name:
            text = p.read_text(encoding="utf-8")
            if p.parent.name == "results":
                rec = json.loads(text)
                for k in TIMING_FIELDS:
                    rec.pop(k)
                text = json.dumps(rec, sort_keys=True)
            out[str(p.relative_to(root))] = text
    return out


@pytest.mark.parametrize("scaffold", ["ircot", "seed002"])
def test_batched_study_writes_the_sequential_records(tmp_path, scaffold):
    seq, bat = ScriptedChat(SCRIPTS[scaffold]), ScriptedChat(SCRIPTS[scaffold])
    c1, s1 = _study(tmp_path / "seq", seq, scaffold, 1)
    c4, s4 = _study(tmp_path / "bat", bat, scaffold, 4)
    n = len(QUESTIONS) * len(SETTINGS[scaffold])
    assert c1 == c4 == {"done_before": 0, "done": n, "failed": 0}
    assert set(seq.batches) == {1} and max(bat.batches) == 4  # batched for real: 4 episodes per call at most
    assert len(bat.batches) < len(seq.batches)
    a, b = _files(tmp_path / "seq"), _files(tmp_path / "bat")
    assert len(a) == 3 * n + len(SETTINGS[scaffold]) + 1 and a == b  # per item 3 files; calls.jsonl; settings
    assert {k: v for k, v in s1.items() if k != "settings"} == {k: v for k, v in s4.items() if k != "settings"}
    # the scripts exercise what they should: every setting ran, some episodes searched, replies differ by setting
    results = [json.loads(t) for k, t in a.items() if "/results/" in k]
    assert sum(r["retrievals"] for r in results) > n and len({r["model_calls"] for r in results}) >= 2
    if scaffold == "ircot":
        assert any(r["final_call"] for r in results) and any(r["refiner_calls"] for r in results)
    sent = {json.dumps(c["messages"]) for k, t in a.items() if k.endswith("calls.jsonl") and "mask-1" in k
            for c in map(json.loads, t.splitlines())}
    assert any("Auto-archived" in s for s in sent)  # mask:1 replaced an observation that was then sent


def test_requests_carry_the_episode_key_and_each_episode_ends_once(tmp_path):
    chat = ScriptedChat(ircot_script)
    _study(tmp_path, chat, "ircot", 3, settings=["none", "ircot:oq"])
    run_ids = [f"{s}/{q['id']}" for q in QUESTIONS for s in ("none", "ircot-oq")]
    assert sorted(chat.ended) == sorted(run_ids)  # once per finished episode
    per = {}
    for r in chat.requests:
        per[r.episode] = per.get(r.episode, 0) + 1
        assert r.actions is None and r.max_new_tokens == 64 and r.temperature == 0.0
    for rid in run_ids:
        setting, qid = rid.split("/")
        res = json.loads((tmp_path / setting / "results" / f"{qid}.json").read_text())
        assert per[rid] == res["model_calls"]
    # an episode's requests are exactly what its recorded calls say was sent
    calls = [json.loads(line) for line in (tmp_path / "ircot-oq" / "calls" / f"{QUESTIONS[0]['id']}.jsonl")
             .read_text().splitlines()]
    mine = [r for r in chat.requests if r.episode == f"ircot-oq/{QUESTIONS[0]['id']}"]
    from attnprobe.agents.tagtext import unlabelled

    assert [r.messages for r in mine] == [unlabelled(c["messages"][:-1]) for c in calls]


class KilledChat(ScriptedChat):
    """The process dies (KeyboardInterrupt: no executor catches it) at the k-th batch."""

    def __init__(self, script, kill_at: int):
        super().__init__(script)
        self.kill_at = kill_at

    def complete_batch(self, requests):
        if len(self.batches) + 1 == self.kill_at:
            raise KeyboardInterrupt
        return super().complete_batch(requests)


@pytest.mark.parametrize("scaffold", ["ircot", "seed002"])
def test_killed_batched_study_resumes_to_the_same_records(tmp_path, scaffold):
    settings = SETTINGS[scaffold][:4]
    _study(tmp_path / "whole", ScriptedChat(SCRIPTS[scaffold]), scaffold, 4, settings=settings)
    with pytest.raises(KeyboardInterrupt):
        _study(tmp_path / "resumed", KilledChat(SCRIPTS[scaffold], kill_at=6), scaffold, 4, settings=settings)
    written = list((tmp_path / "resumed").rglob("results/*.json"))
    assert 0 < len(written) < len(QUESTIONS) * len(settings)  # killed in the middle, some episodes written
    again = ScriptedChat(SCRIPTS[scaffold])
    counts, _ = _study(tmp_path / "resumed", again, scaffold, 4, settings=settings)
    assert counts == {"done_before": len(written), "done": len(QUESTIONS) * len(settings) - len(written),
                      "failed": 0}
    assert _files(tmp_path / "whole") == _files(tmp_path / "resumed")


class FailingChat(ScriptedChat):
    """The k-th batch fails (an endpoint error): what had ended and been asked before it is kept."""

    def __init__(self, script, fail_at: int):
        super().__init__(script)
        self.fail_at, self.at_failure = fail_at, None

    def complete_batch(self, requests):
        if len(self.batches) + 1 == self.fail_at and self.at_failure is None:
            self.at_failure = (list(self.ended), len(self.requests), [r.episode for r in requests])
            self.batches.append(0)
            raise RuntimeError("endpoint error")
        return super().complete_batch(requests)


def test_a_failed_batch_is_redone_without_the_episodes_it_wrote(tmp_path):
    """A batch whose model call fails mid-way is redone item by item: an episode that had finished (and was
    written) before the failure is not run again, the unfinished ones are ended (the backend frees them)
    and rerun; the records are those of an uninterrupted run."""
    chat = FailingChat(ircot_script, fail_at=3)
    counts, _ = _study(tmp_path / "failed", chat, "ircot", 4, settings=["none", "ircot:o"])
    assert counts == {"done_before": 0, "done": 10, "failed": 0}
    ended, asked, in_flight = chat.at_failure
    finished_first = set(ended)
    assert finished_first and in_flight  # the failure came after some episodes of the batch had finished
    assert not finished_first & {r.episode for r in chat.requests[asked:]}  # those are not rerun
    assert set(in_flight) <= {r.episode for r in chat.requests[asked:]}  # the others are
    after = chat.ended[len(ended):]
    assert sorted(after[:len(in_flight)]) == sorted(in_flight)  # ended when the batch failed, then rerun
    _study(tmp_path / "whole", ScriptedChat(ircot_script), "ircot", 1, settings=["none", "ircot:o"])
    assert _files(tmp_path / "failed") == _files(tmp_path / "whole")


class PartlyWritingJob(JobBase):
    """Writes its items one by one and fails after the first of a batch (a batched study killed by a bad
    item after one episode finished)."""

    stage, unit, batch_size = "toy", "item", 3

    def __init__(self, out):
        self.out, self.runs = out, []

    def items(self):
        return [WorkItem(key=k) for k in "abc"]

    def done(self, item, since=None):
        from attnprobe.execution.job import written_since

        return written_since(self.out / item.key, since)

    def run(self, state, batch):
        for i, it in enumerate(batch):
            self.runs.append(it.key)
            (self.out / it.key).write_text("x")
            if len(batch) > 1 and i == 0:
                raise RuntimeError("bad item")
        return [None] * len(batch)


@pytest.mark.parametrize("force", [False, True])
def test_local_executor_redo_skips_items_the_failed_batch_wrote(tmp_path, force):
    job = PartlyWritingJob(tmp_path)
    job.force = force
    if force:  # results of an earlier run: --force reruns them, the item the failed batch wrote it does not
        for k in "abc":
            (tmp_path / k).write_text("old")
        import os

        for k in "abc":
            os.utime(tmp_path / k, (1, 1))
    counts = LocalExecutor(lambda: None, progress=False).run(job)
    assert job.runs == ["a", "b", "c"]  # the batch ran a, failed; the redo runs b and c only
    assert counts == {"done_before": 0, "done": 3, "failed": 0}


# ------------------------------------------------------------------ structured actions
def test_structured_actions_are_requested_and_recorded(tmp_path):
    chat = ScriptedChat(ircot_script, actions=True)
    _study(tmp_path / "ircot", chat, "ircot", 2, settings=["none"], structured_actions=True)
    finals = [r for r in chat.requests if r.actions.final]
    budget = chat.requests[0].max_new_tokens  # the grammar caps its free text to the reply's budget
    assert {r.actions for r in chat.requests} == {ActionFormat("ircot", max_new_tokens=budget),
                                                  ActionFormat("ircot", final=True, max_new_tokens=budget)}
    study = json.loads((tmp_path / "ircot" / "study.json").read_text())
    assert study["config"]["structured_actions"] is True
    calls = [json.loads(x) for x in (tmp_path / "ircot" / "none" / "calls.jsonl").read_text().splitlines()]
    assert calls and all(c["meta"]["structured_actions"] == "ircot" for c in calls)  # the grammar's name
    assert len(finals) == sum(bool(c["meta"].get("final_call")) for c in calls) > 0
    res = json.loads((tmp_path / "ircot" / "none" / "results" / f"{QUESTIONS[0]['id']}.json").read_text())
    assert res["config"]["structured_actions"] is True
    chat2 = ScriptedChat(seed002_script, actions=True)
    _study(tmp_path / "s2", chat2, "seed002", 2, settings=["none"], structured_actions=True)
    assert {r.actions for r in chat2.requests} == {ActionFormat("seed002", tools=json.dumps(TOOLS),
                                                                max_new_tokens=chat2.requests[0].max_new_tokens)}
    s2 = [json.loads(x) for x in (tmp_path / "s2" / "none" / "calls.jsonl").read_text().splitlines()]
    assert s2 and all(c["meta"]["structured_actions"] == "seed002" for c in s2)
    # one builder (agents/recorder.py: call_record), the loop's key order kept: the file is byte-identical to before
    assert list(s2[0]) == ["id", "task", "model", "framing", "messages", "labels", "meta", "tools"]
    assert list(s2[0]["meta"])[:12] == ["runner", "run_id", "setting", "question_id", "step", "history", "usage",
                                        "context_chars", "finish_reason", "raw_text", "structured_actions",
                                        "follows_grammar"]
    # off: nothing asked for, nothing recorded
    chat3 = ScriptedChat(ircot_script)
    _study(tmp_path / "off", chat3, "ircot", 2, settings=["none"])
    assert all(r.actions is None for r in chat3.requests)
    calls = [json.loads(x) for x in (tmp_path / "off" / "none" / "calls.jsonl").read_text().splitlines()]
    assert not any("structured_actions" in c["meta"] for c in calls)
    assert "structured_actions" not in json.loads((tmp_path / "off" / "study.json").read_text())["config"]
    # switching it in a folder is another experiment: refused in one line, naming the option
    from attnprobe.errors import AttnprobeError

    with pytest.raises(AttnprobeError, match="--structured-actions was False, now True; use --force"):
        _study(tmp_path / "off", ScriptedChat(ircot_script, actions=True), "ircot", 2, settings=["none"],
               structured_actions=True)
    with pytest.raises(AttnprobeError, match="--structured-actions was True, now False"):
        _study(tmp_path / "ircot", ScriptedChat(ircot_script), "ircot", 2, settings=["none"])


def test_stamps_without_structured_actions_are_unchanged():
    """Free decoding keeps the stamps of main before issue 30 (values computed there): shipped results and
    the pinned baseline stay done."""
    q = {"id": "q1", "question": "Which element?", "answers": ["holmium"], "type": None}
    assert inputs_stamp(q, "none", LoopConfig("ircot", ircot_form="chat"), "m") == STAMP_IRCOT
    assert inputs_stamp(q, "mask:5", LoopConfig("seed002", preset="cpu"), "m") == STAMP_SEED002
    on = LoopConfig("ircot", ircot_form="chat", structured_actions=True)
    assert on.to_dict()["structured_actions"] is True and inputs_stamp(q, "none", on, "m") != STAMP_IRCOT


STAMP_IRCOT = "a4413932298da634e5a0"  # main at 1c9429f
# seed002 changed in issue 37 (was 1e0a74753ae68751a2ef at 1c9429f): its prompts hash covers the release's
# parallel-call sentence of every template family (prompts.SEED002_PARALLEL), and SmolLM2's family gets none
STAMP_SEED002 = "bedbddb1d54d73dd67bb"


def test_cli_batch_size_and_structured_actions_reach_the_study():
    from attnprobe.cli import loop as cli_loop
    from attnprobe.cli.main import build_parser

    q = str(data_path("questions_loop.jsonl"))
    seen = []
    for extra in ([], ["--episodes-per-batch", "8", "--structured-actions"]):
        o = cli_loop.interference_options(build_parser().parse_args(["study", "interference", "--ircot-form", "chat",
                                                                     q, "--out", "o", *extra]))
        seen.append((o.batch_size, o.config.structured_actions))
    assert seen == [(1, False), (8, True)]
    import argparse

    ns = argparse.Namespace(batch_size=None, generator="openai", concurrency=6)
    assert cli_loop.batch_size(ns) == 6  # N requests in flight need N episodes
    assert cli_loop.batch_size(argparse.Namespace(batch_size=2, generator="openai", concurrency=6)) == 2
    assert cli_loop.batch_size(argparse.Namespace(batch_size=None, generator="transformers", concurrency=6)) == 1
    assert cli_loop.batch_size(argparse.Namespace(batch_size=None, generator="openai")) == 1  # no --concurrency


# ------------------------------------------------------------------ a Ray replica (in process: the class itself)
def _replica(model):
    from attnprobe.distributed.replica import Replica

    r = Replica.__new__(Replica)  # no model load: the loaded model is given
    r.model, r.load_error, r._prepared = model, None, (None, None)
    return r


def test_replica_hands_a_chat_job_its_model_wrapped_as_the_job_says(tmp_path):
    """The interference job needs a chat (``ChatJob``): its own ``prepare`` wraps the replica's loaded model in
    TransformersChat with the job's chat options (seed002: no stop at the first call) through the one factory,
    ``chat_for``; other jobs get the model itself; a chat handed in (an endpoint, a scripted chat) is kept."""
    from types import SimpleNamespace

    from attnprobe.capture.models import LoadedModel
    from attnprobe.generation.transformers_chat import TransformersChat

    tok = SimpleNamespace(chat_template=None, eos_token_id=0, pad_token_id=0)
    loaded = LoadedModel(model=SimpleNamespace(), tokenizer=tok, spec="x", name="x", backend="transformers",
                         dtype="float32", source="hf-folder")
    job = InterferenceJob(tmp_path, [], ["none"], LoopConfig("seed002"))
    assert job.needs == "chat" and job.chat_options == {"stop_at_call": False}
    assert InterferenceJob(tmp_path, [], ["none"], LoopConfig("ircot", ircot_form="chat")).chat_options == {"stop_at_call": None}
    replica = _replica(loaded)
    replica.run(job, [], 0.0)
    state = replica._prepared[1]
    assert isinstance(state, TransformersChat) and state.loaded is loaded and state.stop_at_call is False
    scripted = ScriptedChat([])
    assert _replica(scripted).run(job, [], 0.0) == [] and job.prepare(scripted) is scripted
    toy = _replica(loaded)
    toy.run(PartlyWritingJob(tmp_path), [], 0.0)  # a job that needs the model gets the model
    assert PartlyWritingJob.needs == "model" and toy._prepared[1] is loaded


def test_replica_redo_skips_items_the_failed_batch_wrote(tmp_path):
    job = PartlyWritingJob(tmp_path)
    recs = _replica("LOADED").run(job, [job.items()], 0.0)
    assert job.runs == ["a", "b", "c"]
    assert [r["status"] for r in recs] == ["skipped", "written", "written"]


# ------------------------------------------------------------------ through the CLI, against an OpenAI endpoint
@pytest.fixture
def scripted_endpoint():
    """A loopback OpenAI-compatible endpoint whose replies come from this file's scripts (by whether tools
    are offered), so the real client, the CLI and the executor run as for a served model."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from support.scripted_chat import words

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            msgs, tools = req["messages"], req.get("tools")
            out = (seed002_script if tools else ircot_script)(msgs, tools)
            text, calls = (out, []) if isinstance(out, str) else out
            message = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": req["model"],
                               "choices": [{"index": 0, "message": message,
                                            "finish_reason": "tool_calls" if calls else "stop"}],
                               "usage": {"prompt_tokens": words(msgs), "completion_tokens": len(text.split()),
                                         "total_tokens": 0}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("scaffold", ["ircot", "seed002"])
def test_cli_batched_study_against_an_endpoint_writes_the_sequential_records(tmp_path, scripted_endpoint, scaffold):
    from attnprobe.cli.main import main

    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": x["id"], "question": x["question"], "golden_answers": x["answers"]}) + "\n"
                         for x in QUESTIONS[:3]), encoding="utf-8")
    settings = [a for s in SETTINGS[scaffold][:2] for a in ("--policy", s)]
    for name, size in (("seq", "1"), ("bat", "4")):
        assert main(["study", "interference", "--ircot-form", "chat", str(q), "--scaffold", scaffold, *settings, "--max-turns", "3",
                     "--top-k", "2", "--max-new-tokens", "32", "--temperature", "0", "--bootstrap", "20",
                     "--generator", "openai", "--base-url", scripted_endpoint, "--served-model", "m",
                     "--episodes-per-batch", size, "--no-progress", "--out", str(tmp_path / name)]) == 0
    a, b = _files(tmp_path / "seq"), _files(tmp_path / "bat")
    assert len(a) == 3 * 2 * 3 + 2 + 1 and a == b
    assert json.loads(a["none/results/" + QUESTIONS[0]["id"] + ".json"])["model"] == "m"


def test_progress_notes_name_the_turn_and_its_episodes():
    from support.fixed_search import FixedSearch

    from attnprobe.studies.loop.agents import Loop
    from attnprobe.studies.loop.context import parse_setting
    from attnprobe.studies.loop.rollout import rollout

    def script(messages, tools):  # question 'a' answers at once, 'b' after one search
        return "<answer>x</answer>" if "Which alpha" in messages[0]["content"] or \
            messages[-1]["content"].startswith("<information>") else "<search>q1 x</search>"

    def loops(*qids):
        return [Loop(chat, FixedSearch(), parse_setting("none"), LoopConfig("ircot", ircot_form="chat"), run_id=f"none/{q}",
                     question={"id": q, "question": f"Which {q}?"}) for q in qids]

    chat, notes, done = ScriptedChat(script), [], []
    rollout(chat, loops("alpha", "beta"), note=notes.append, on_done=lambda lp, s: done.append(lp.run_id))
    # output tokens per turn: 1 ("<answer>x</answer>") + 2 ("<search>q1 x</search>"), then 1
    assert [n.split(" tok in")[0] for n in notes] == ["turn 1: 2 episodes", "turn 1: 2 episodes: 3",
                                                      "turn 2: 1 episode", "turn 2: 1 episode: 1"]
    assert notes[1].endswith("tok/s") and done == chat.ended == ["none/alpha", "none/beta"]
    assert chat.batches == [2, 1]
