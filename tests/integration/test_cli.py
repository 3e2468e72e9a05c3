"""CLI: capture is resumable and atomic, report renders real figures, exit codes are meaningful."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from support.paths import ROOT, TRAJ_DIR

import attnprobe
from attnprobe.capture.models import MODEL_HELP
from attnprobe.cli.main import build_parser, main
from attnprobe.cli.options import NO_PROGRESS_HELP, finish_args
from attnprobe.io import safe_name
from attnprobe.model_files import DTYPES

REASONING = str(TRAJ_DIR / "reasoning_content.jsonl")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) for every subcommand at every depth, e.g. (("ibis", "report"), <parser>)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from _commands(sub, path + (name,))


def _option(parser: argparse.ArgumentParser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


COMMANDS = {" ".join(path): sub for path, sub in _commands(build_parser())}


# slow: three captures of ~1.6k tokens, four resumes and a plotly report; on the tiny SmolLM2 (the bundled
# tokenizer and template; support/tiny_model.py): `capture` of the bundled model itself runs end to end in
# tests/integration/test_baseline.py::test_captures_of_the_shipped_trajectories_are_unchanged
@pytest.mark.slow
def test_capture_resume_and_report(tiny_smol, tiny_smol_folder, tmp_path, capsys):
    smol = tiny_smol
    out = tmp_path / "caps"
    args = ["capture", REASONING, "--out", str(out), "--chunk-size", "256", "--model", str(tiny_smol_folder)]
    assert main(args) == 0
    folders = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert folders == ["sample-reasoning-1", "sample-reasoning-2"]
    res = attnprobe.CaptureResult.load(out / "sample-reasoning-1")
    direct = attnprobe.capture(smol, attnprobe.load_trajectories(REASONING)[0], chunk_size=256)
    np.testing.assert_allclose(res.segment_attention, direct.segment_attention, atol=1e-6)
    m = res.meta
    assert (m["model"], m["backend"], m["dtype"], m["chunk_size"], m["rendering"]) == \
        ("tiny-smollm2", "transformers", "float32", 256, "text")
    assert m["layers"] == list(range(4)) and len(m["chat_template_hash"]) == 16
    assert m["attnprobe_version"] == attnprobe.__version__ and m["trajectory_id"] == "sample-reasoning-1"
    mtime = (out / "sample-reasoning-1" / "meta.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0  # resume: nothing to do
    err = capsys.readouterr().err
    assert "attnprobe: resuming: 2 of 2 trajectories already captured" in err
    assert "attnprobe: command capture:" not in err  # debug messages only with -v
    assert (out / "sample-reasoning-1" / "meta.json").stat().st_mtime_ns == mtime
    # -q (global, before the command) silences info messages; -v after the command adds debug ones
    assert main(["-q", *args]) == 0
    assert capsys.readouterr().err == ""
    assert main([*args, "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*args, "-v"]) == 0
    err = capsys.readouterr().err
    assert "attnprobe: resuming: 2 of 2 trajectories already captured" in err
    assert "attnprobe: command capture: {" in err and "'chunk_size': 256" in err
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    # the two reasoning samples have no step with 5 past turns: no (empty) decay plot, a line says why
    assert "sample-reasoning-2" in html and "No decay curves: no reasoning step has ≥5 past turns." in html
    assert html.count("plotly.js v") == 1 and html.count("Plotly.newPlot") >= 4  # heatmap + breakdown each


def test_partial_failure_exit_code(tiny_smol, tiny_smol_folder, tmp_path, capsys):
    """On the tiny SmolLM2 (the bundled tokenizer and template: the same token counts)."""
    out = tmp_path / "caps"
    code = main(["capture", REASONING, "--out", str(out), "--max-tokens", "1618", "--model", str(tiny_smol_folder)])
    err = capsys.readouterr().err
    # sample-reasoning-1 renders to 1616 tokens and fits; sample-reasoning-2 (1620) does not.
    assert code == 1 and "sample-reasoning-2" in err and "above the limit of 1618" in err
    assert (out / "sample-reasoning-1" / "meta.json").is_file()
    assert not (out / "sample-reasoning-2").exists()
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert errors[0]["trajectory_id"] == "sample-reasoning-2"


def test_bad_input_exit_code_names_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"id": "b"}\n')
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert f"{bad}, line 2, field 'messages': missing required field" in proc.stderr
    # the input is validated before any model is loaded (in process: one interpreter start per test keeps it under
    # the suite's 20 s on a busy machine, issue 38; the exit code is main()'s, which `python -m attnprobe` exits with)
    from attnprobe.cli.main import main

    assert main(["capture", str(bad), "--out", str(tmp_path / "o"), "--model", str(tmp_path / "nope.gguf")]) == 2


def test_missing_model_exit_code(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "capture", str(good), "--out", str(tmp_path / "o"),
                           "--model", str(tmp_path / "nope.gguf"), "--queries", "decision"],
                          capture_output=True, text=True)
    assert proc.returncode == 3 and "GGUF file not found" in proc.stderr
    from attnprobe.cli.main import main  # in process: one interpreter start per test (issue 38, busy machines)

    assert main(["capture", str(good), "--out", str(tmp_path / "o2"), "--model", "someone/not-cached-model",
                 "--queries", "decision"]) == 3
    assert "never downloads" in capsys.readouterr().err


def test_safe_names_are_unique():
    assert safe_name("sample-long-research") == "sample-long-research"
    a, b = safe_name("run-1/worker-2"), safe_name("run-1__worker-2")
    assert a.startswith("run-1__worker-2-") and a != b and "/" not in a


# ------------------------------------------------------------------ option groups declared once
def test_every_command_is_walked():
    assert {"capture", "demo", "report", "import", "convert", "ibis", "ibis all", "ibis run", "ibis capture",
            "ibis report", "ibis check", "compare", "run", "app"} <= set(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_shared_options_mean_the_same_everywhere(name):
    p = COMMANDS[name]
    assert p.description, f"'attnprobe {name} --help' has no description"
    dtype = _option(p, "--dtype")
    model = _option(p, "--model")
    if name == "study attention":  # captures with the study's own model unless --model names another
        assert model.default is None and dtype.default is None and "the study's" in model.help
        assert tuple(dtype.choices) == DTYPES and "the study's" in dtype.help
    else:
        if dtype is not None:
            assert tuple(dtype.choices) == DTYPES and dtype.default == "float32"
        if model is not None:
            assert model.help == MODEL_HELP and model.default == "default"
    progress = _option(p, "--no-progress")
    if progress is not None:
        assert progress.help == NO_PROGRESS_HELP
    for flag in ("-v", "-q"):  # global options are also accepted after the command
        assert _option(p, flag) is not None, (name, flag)


def test_dtype_and_model_options_are_consistent_across_commands():
    dtypes = {n: tuple(_option(p, "--dtype").choices) for n, p in COMMANDS.items()
              if _option(p, "--dtype") is not None}
    helps = {n: _option(p, "--model").help for n, p in COMMANDS.items()
             if _option(p, "--model") is not None and n != "study attention"}  # its own default (the study's)
    assert {"capture", "demo", "convert", "ibis all", "ibis run", "ibis capture", "ibis check", "run"} <= set(dtypes)
    assert {"capture", "demo", "ibis all", "ibis run", "ibis capture", "ibis check", "run"} <= set(helps)
    assert set(dtypes.values()) == {("float32", "bfloat16", "float16")}
    assert len(set(helps.values())) == 1
    assert _option(COMMANDS["ibis report"], "--model") is None  # was a folder name; now --folder
    p = build_parser()
    assert p.parse_args(["capture", "x", "--out", "o", "--dtype", "bf16"]).dtype == "bfloat16"  # library aliases
    with pytest.raises(SystemExit):
        p.parse_args(["run", "q", "--out", "o", "--dtype", "float64"])


def test_generation_options_and_old_flag_names():
    p = build_parser()

    def parse(*argv):
        return finish_args(p.parse_args(list(argv)))

    a = parse("ibis", "run", "--generator", "openai", "--base-url", "http://h/v1", "--served-model", "m")
    assert (a.generator, a.base_url, a.served_model, a.api_key_env, a.max_new_tokens) == \
        ("openai", "http://h/v1", "m", "OPENAI_API_KEY", 4096)  # the paper's limit (seed 000 C.3)
    assert parse("ibis", "run", "--backend", "openai", "--base-url", "http://h/v1", "--served-model", "m").generator == "openai"
    assert parse("ibis", "all").generator == "transformers"
    assert parse("ibis", "all", "--base-url", "http://h/v1", "--served-model", "m").generator == "openai"  # implied
    with pytest.raises(ValueError, match="--generator openai needs --base-url"):
        parse("ibis", "run", "--generator", "openai")
    a = parse("run", "q.jsonl", "--out", "o.jsonl", "--max-new-tokens", "9", "--temperature", "0.5", "--force")
    assert (a.generator, a.max_new_tokens, a.temperature, a.force, a.model) == ("transformers", 9, 0.5, True, "default")
    # old spellings of `run`: --overwrite, and --base-url URL --model NAME (NAME = served model)
    a = parse("run", "q.jsonl", "--out", "o.jsonl", "--max-new-tokens", "7", "--overwrite", "--base-url",
              "http://h/v1", "--model", "served-name")
    assert (a.max_new_tokens, a.force, a.generator, a.served_model) == (7, True, "openai", "served-name")
    with pytest.raises(SystemExit):  # issue 39: max_tokens is only the capture's prompt limit; the alias is gone
        p.parse_args(["run", "q.jsonl", "--out", "o.jsonl", "--max-tokens", "7"])
    assert parse("ibis", "capture", "--force-capture").force is True
    with pytest.raises(SystemExit):  # removed from `ibis all` (issue 38): --force redoes every stage
        p.parse_args(["ibis", "all", "--force-capture"])
    assert parse("convert", "default", "out", "--overwrite").force is True
    assert parse("capture", "x", "--out", "o", "--backend", "vllm").backend == "vllm"
    with pytest.raises(SystemExit):  # the capture backend is not a generator and vice versa
        p.parse_args(["capture", "x", "--out", "o", "--backend", "openai"])
    a = p.parse_args(["-v", "run", "q", "--out", "o", "-v", "-q"])
    assert (a.verbose, a.sub_verbose, a.sub_quiet) == (1, 1, True)


def test_python_m_help_lists_grouped_commands():
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="100")
    proc = subprocess.run([sys.executable, "-m", "attnprobe", "--help"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: attnprobe [-h] [--version] [-v] [-q] COMMAND ...")
    for title in ("attention in recorded trajectories:", "studies (generate, then capture):",
                  "trajectories and models:", "explore:", "Exit codes: 0 ok"):
        assert title in out
    i = out.index("attention in recorded trajectories:")
    assert out.index("  capture ", i) < out.index("  report ", i) < out.index("studies (generate")
    for name in ("demo", "import", "convert", "ibis", "compare", "run", "app"):
        assert f"\n  {name} " in out


def test_ibis_report_folder(tmp_path, capsys):
    """`ibis report --folder DIR` (was --model NAME) on the recorded 6-item baseline run."""
    folder = tmp_path / "results" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    for name in ("decisions.jsonl", "attention.json", "attention.safetensors"):
        shutil.copy(ROOT / "tests" / "data" / "baseline" / "ibis" / name, folder / name)
    items = (TRAJ_DIR / "ibis_items.jsonl").read_text().splitlines(keepends=True)[:6]
    (folder / "items.jsonl").write_text("".join(items))
    fast = ["--bootstrap", "50", "--permutations", "5", "--plotlyjs", "cdn"]
    assert main(["ibis", "report", "--folder", str(folder), *fast]) == 0
    out, err = capsys.readouterr()
    assert "IBIS report" in out and f"ibis report -> {folder / 'report.html'}" in err
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["behaviour"]["decisions_total"] == 18
    (folder / "report.html").unlink()
    assert main(["ibis", "report", "--results", str(tmp_path / "results"), *fast]) == 0  # default: bundled model
    assert (folder / "report.html").is_file()
    with pytest.raises(SystemExit) as exc:
        main(["ibis", "report", "--model", "SmolLM2-135M-Instruct"])
    assert exc.value.code == 2
