"""Progress per model call, with tokens per second, in the runner and the study loop; and no escape codes
in a log when stderr is not a terminal, nested bars included (issue 29). Scripted chats, no model."""

from __future__ import annotations

import io
import re
import sys

from support.fixed_search import FixedSearch
from support.ircot import R3, Q
from support.jobs import ListJob
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.agents.recorder import call_note
from attnprobe.execution import LocalExecutor
from attnprobe.io.bars import plain_bar
from attnprobe.resources import data_path
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.studies.runner import RunSettings
from attnprobe.studies.runner.run import run_one

RATE = re.compile(r"^(call \d+(?: \(\w+\))?): (\d+) tok in \d+\.\d s, (?:\d+\.\d|-) tok/s$")


def test_call_note_reports_tokens_per_second():
    assert call_note("call 3 (manager)", 48, 2.0) == "call 3 (manager): 48 tok in 2.0 s, 24.0 tok/s"
    assert call_note("call 1", 5, 0.0) == "call 1: 5 tok in 0.0 s, - tok/s"


def test_runner_notes_every_call_then_its_speed(tmp_path):
    notes: list[str] = []
    chat = ScriptedChat(lambda m, t: ("", [tool_call("call1", "final_answer", answer="holmium answer")]))
    q = {"id": "s01", "question": "Which element?", "answers": ["holmium"]}
    run_one(chat, FixedSearch(), q, RunSettings.preset("baseline"), tmp_path / "r.jsonl", "b-s01", note=notes.append)
    assert notes[0] == "call 1 (manager)"
    m = RATE.match(notes[1])
    assert m and (m.group(1), m.group(2)) == ("call 1 (manager)", "3")  # {"answer": "holmium answer"}: 3 words


def test_study_loop_notes_every_call_then_its_speed():
    notes: list[str] = []
    chat = ScriptedChat(lambda m, t: R3)  # "<think>p2</think><answer>42</answer>": one whitespace token
    run_question(chat, FixedSearch(), parse_setting("none"), LoopConfig("ircot", ircot_form="chat"), Q, run_id="r", scorer=Scorer(),
                 note=notes.append)
    assert notes[0] == "call 1" and RATE.match(notes[1]).groups()[:2] == ("call 1", "1")


def test_nested_bars_to_a_file_hold_no_escape_codes(tmp_path, monkeypatch):
    log = (tmp_path / "stderr.log").open("w")
    monkeypatch.setattr(sys, "stderr", log)

    def outer(job, batch):
        job.note("call 1 (manager): 4 tok in 1.0 s, 4.0 tok/s")
        LocalExecutor(lambda: None).run(ListJob(tmp_path / "inner", list("xy"), stage="inner"))

    LocalExecutor(lambda: None).run(ListJob(tmp_path / "outer", list("ab"), work=outer, stage="outer"))
    log.close()
    text = (tmp_path / "stderr.log").read_text()
    assert "inner: 100%" in text and "outer: 100%" in text and "4.0 tok/s" in text
    assert "\x1b[" not in text


def test_plain_bar_only_off_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert plain_bar(Tty()) == {} and plain_bar(io.StringIO()) == {"ascii": True, "position": 0}


def test_cli_run_with_stderr_to_a_file_shows_call_speed_without_escape_codes(tmp_path, monkeypatch):
    from attnprobe.cli import run as cli_run
    from attnprobe.cli.main import main

    chat = ScriptedChat(lambda m, t: ("", [tool_call("call1", "final_answer", answer="x")]))
    monkeypatch.setattr(cli_run, "make_chat", lambda args: chat)
    log = (tmp_path / "stderr.log").open("w")
    monkeypatch.setattr(sys, "stderr", log)
    assert main(["run", str(data_path("questions_loop.jsonl")), "--preset", "baseline", "--limit", "2",
                 "--out", str(tmp_path / "r.jsonl")]) == 0
    log.close()
    text = (tmp_path / "stderr.log").read_text()
    assert "s02: call 1 (manager): 2 tok in" in text and "\x1b[" not in text


# ------------------------------------------------------------------ the study's bar counts model calls (issue 38)
class _Bar:
    """A stand-in progress bar: what the executor set and updated, in order."""

    def __init__(self, total, desc, unit, disable, **kw):
        self.total, self.desc, self.unit, self.n, self.postfix = total, desc, unit, 0, ""
        self.seen: list[tuple[int, int]] = []  # (n, total) after every change
        self.descs: list[str] = [desc]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.n += n
        self.seen.append((self.n, self.total))

    def refresh(self):
        self.seen.append((self.n, self.total))

    def set_description(self, desc, refresh=True):
        self.descs.append(desc)

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text


def test_the_study_bar_counts_model_calls_not_only_episodes(tmp_path, monkeypatch):
    from support.interference import run_interference as run_study

    import attnprobe.io

    bars: list[_Bar] = []
    monkeypatch.setattr(attnprobe.io, "progress_bar", lambda **kw: bars.append(_Bar(**kw)) or bars[-1])

    def script(messages, tools):  # q0 answers at its 1st call, q1 never (3 turns + the final call)
        if "item 0" in messages[0]["content"]:
            return "<think>x</think><answer>0</answer>"
        return "<think>x</think>no action"

    questions = [{"id": f"q{i}", "question": f"What is item {i}?", "answers": [str(i)], "type": None} for i in (1, 0)]
    run_study(LocalExecutor(lambda: ScriptedChat(script)), tmp_path, questions, ["none"],
              LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=10)
    bar = bars[0]
    assert (bar.unit, bar.seen[0]) == ("call", (1, 8))  # 2 episodes x (3 turns + final call); the first call shows
    assert [n for n, _ in bar.seen[:4]] == [1, 2, 3, 4]  # q1's four calls move the bar before any episode ends
    assert bar.seen[-1] == (5, 5)  # q0 took 1 of its 4: the 3 unused dropped from the total
    assert bar.descs == ["interference 0/2 runs", "interference 1/2 runs", "interference 2/2 runs"]
