"""Issue 38, items 8 and 11: every endpoint URL (--base-url, --judge openai:URL:MODEL, refine:openai:URL:MODEL) is
checked (scheme, host, port) while the arguments are parsed, before any model loads or any call is made, in one
line; a URL's credentials (http://user:pw@host) are never printed nor written (attnprobe.io.urls.redact)."""

from __future__ import annotations

import json
import logging

import pytest
from support.scripted_chat import ScriptedChat

from attnprobe.cli.main import main
from attnprobe.io.urls import redact, url_problem

NO_MODEL = "/nonexistent/model-folder"  # a model load would exit 3: exit 2 shows the URL was refused first
EXAMPLE = "e.g. http://127.0.0.1:8000/v1"


def _questions(tmp_path) -> str:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "What is item 1?", "answers": ["1"]}) + "\n")
    return str(path)


@pytest.mark.parametrize("url, problem", [
    ("file:///etc/passwd", f"must be an http:// or https:// URL, {EXAMPLE}"),
    ("ftp://h/v1", f"must be an http:// or https:// URL, {EXAMPLE}"),
    ("http:///v1", f"names no host, {EXAMPLE}"),
    ("http://h:99999/v1", "is not a valid URL (Port out of range 0-65535)"),
    ("http://h:abc/v1", "is not a valid URL (Port could not be cast to integer value as 'abc')"),
    ("http://h:0/v1", "port must be 1-65535, not 0"),
])
def test_base_url_is_refused_while_parsing(tmp_path, capsys, url, problem):
    for argv in (["study", "interference", _questions(tmp_path), "--out", str(tmp_path / "o")],
                 ["run", _questions(tmp_path), "--out", str(tmp_path / "o.jsonl")], ["ibis", "run"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--model", NO_MODEL, "--base-url", url])
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument --base-url: {url!r} {problem}")
    assert not (tmp_path / "o").exists()
    assert url_problem("https://api.example.com/v1") is None and url_problem("http://[::1]:8000/v1") is None


@pytest.mark.parametrize("option, spec, line", [
    ("--judge", "openai:ftp://h/v1:m", "--judge 'openai:ftp://h/v1:m': BASE_URL: 'ftp://h/v1' must be an http:// "
                                       f"or https:// URL, {EXAMPLE}"),
    ("--judge", "openai:http://u:pw@h:70000/v1:m", "--judge 'openai:http://***@h:70000/v1:m': BASE_URL: "
                                                   "'http://***@h:70000/v1' is not a valid URL (Port out of range "
                                                   "0-65535)"),
    ("--policy", "refine:openai:file:///x:m", "--policy 'refine:openai:file:///x:m': BASE_URL 'file:///x' must be "
                                              f"an http:// or https:// URL, {EXAMPLE}"),
    ("--policy", "refine-latest:openai:http://user:pw@:8000/v1:m", "--policy 'refine-latest:openai:http://***@:8000/"
                                                                  "v1:m': BASE_URL 'http://***@:8000/v1' names no "
                                                                  f"host, {EXAMPLE}"),
])
def test_judge_and_refiner_urls_are_refused_before_the_model(tmp_path, capsys, option, spec, line):
    argv = ["study", "interference", _questions(tmp_path), "--out", str(tmp_path / "o"), "--model", NO_MODEL,
            option, spec]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"attnprobe: error: {line}\n" and "pw" not in err
    assert not (tmp_path / "o").exists()


def test_redact_hides_every_urls_credentials():
    assert redact("refine:openai:http://user:pw@h/v1:m failed: GET https://a:b@x:1/v1 and ftp://tok@h") == \
        "refine:openai:http://***@h/v1:m failed: GET https://***@x:1/v1 and ftp://***@h"
    assert redact("mail me: a@b.org, http://h/v1?x=a@b") == "mail me: a@b.org, http://h/v1?x=a@b"


def test_credentials_in_a_refiner_url_reach_no_output(tmp_path, monkeypatch, capsys):
    """A study with a refiner whose URL carries credentials and whose calls fail: study.md, errors.jsonl, the
    lock record and every line printed name the setting with the credentials redacted."""
    from support.interference import run_interference as run_study

    from attnprobe.agents import refiners
    from attnprobe.cli.main import setup_logging
    from attnprobe.execution.local import LocalExecutor
    from attnprobe.io.fs import LOCK_NAME, hold_dir_lock
    from attnprobe.studies.loop.agents import LoopConfig

    def down(base_url, model, **kw):
        def refine(query, document):
            raise RuntimeError(f"Connection error: POST {base_url}/chat/completions")
        return refine

    def script(messages, tools):
        if messages[-1]["content"].startswith("Answer the given question"):
            return "<think>look it up</think><search>holmium</search>"
        return "<answer>1</answer>"

    monkeypatch.setattr(refiners, "openai_refiner", down)
    spec = "refine:openai:http://user:s3cret@127.0.0.1:9/v1:m"
    monkeypatch.setattr("sys.argv", ["attnprobe", "study", "interference", "q.jsonl", "--policy", spec])
    setup_logging()
    try:
        with hold_dir_lock(tmp_path, "study folder"):
            lock = json.loads((tmp_path / LOCK_NAME).read_text())
            ex = LocalExecutor(lambda: ScriptedChat(script), progress=False)
            counts, _ = run_study(ex, tmp_path, [{"id": "q1", "question": "What is item 1?", "answers": ["1"]}],
                                  ["none", spec], LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=20)
    finally:
        for name in ("attnprobe", "attnprobe_hooks", "attnprobe_app"):
            logging.getLogger(name).handlers[:] = []
    assert counts["failed"] == 1
    errors = (tmp_path / "errors.jsonl").read_text()
    assert "s3cret" not in errors and "http://***@127.0.0.1:9/v1" in errors
    md = (tmp_path / "study.md").read_text()
    assert "s3cret" not in md and "refine:openai:http://***@127.0.0.1:9/v1:m" in md
    err = capsys.readouterr().err
    assert "s3cret" not in err and "failed: RuntimeError: Connection error: POST http://***@127.0.0.1:9/v1" in err
    assert lock["command"] == "attnprobe study interference q.jsonl --policy refine:openai:http://***@127.0.0.1:9/v1:m"


def test_a_judge_urls_credentials_are_not_recorded(tmp_path):
    """study.json's config and the settings record of every command hold the --judge URL without its
    credentials; a rerun with the same URL is the same setting."""
    from attnprobe.io.settings import SETTINGS_FILE, check_settings, record_settings
    from attnprobe.studies.loop.agents import LoopConfig

    config = LoopConfig("ircot", judge="openai:http://user:s3cret@judge.example:8000/v1:m")
    assert config.judge == "openai:http://user:s3cret@judge.example:8000/v1:m"  # what the scorer calls
    assert config.to_dict()["judge"] == "openai:http://***@judge.example:8000/v1:m"
    wanted = {"judge": config.judge, "policies": ["refine:openai:https://k@h/v1:m"]}
    for _ in range(2):  # the second run checks against what the first recorded: the same setting
        check_settings(tmp_path, "study interference", wanted)
        record_settings(tmp_path, "study interference", wanted)
    text = (tmp_path / SETTINGS_FILE).read_text()
    assert "s3cret" not in text and "openai:http://***@judge.example:8000/v1:m" in text and "https://***@h/v1" in text


def test_a_study_with_a_refiners_credentials_writes_them_nowhere_and_resumes(tmp_path, monkeypatch):
    """The setting is named without its URL's credentials in every file and folder name (study.json, the
    setting's folder, its calls, histories and results), the refiner still gets the whole URL, a rerun finds
    every item done, and the app reads the study and finds the setting's folder."""
    from support.interference import run_interference as run_study

    from attnprobe.agents import refiners
    from attnprobe.execution.local import LocalExecutor
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe_app import data as D
    from attnprobe_app import study_data as SD

    urls = []

    def refiner(base_url, model, **kw):
        urls.append(base_url)
        return lambda query, document: "refined"

    def script(messages, tools):
        if messages[-1]["content"].startswith("Answer the given question"):
            return "<think>look it up</think><search>holmium</search>"
        return "<answer>1</answer>"

    monkeypatch.setattr(refiners, "openai_refiner", refiner)
    spec, shown = "refine:openai:http://user:s3cret@127.0.0.1:9/v1:m", "refine:openai:http://***@127.0.0.1:9/v1:m"
    out = tmp_path / "data" / "study"
    questions = [{"id": "q1", "question": "What is item 1?", "answers": ["1"]}]
    for done in ("done", "done_before"):
        counts, _ = run_study(LocalExecutor(lambda: ScriptedChat(script), progress=False), out, questions,
                              ["none", spec], LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=20)
        assert counts[done] == 2 and counts["failed"] == 0
    assert set(urls) == {"http://user:s3cret@127.0.0.1:9/v1"}  # the refiner is built with the whole URL
    for path in out.rglob("*"):
        assert "s3cret" not in str(path) and (path.is_dir() or "s3cret" not in path.read_text()), path
    assert json.loads((out / "study.json").read_text())["settings"][shown]["questions"] == 1
    root = (tmp_path / "data").resolve()
    [study], problems = SD.load_studies(root, D.discover(root).studies)
    assert problems == [] and study.settings == ["none", shown] and (root / study.setting_rel(shown)).is_dir()
    assert SD.setting_calls(root, study, shown)[0]["meta"]["setting"] == shown
