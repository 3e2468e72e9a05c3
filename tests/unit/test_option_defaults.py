"""One declaration and one default per option (issue 28).

Every subcommand's parser is walked: each option that is a field of a record the command builds
(``CaptureOptions``, ``RunOptions``, ``RunSettings``, ``LoopConfig``) must be declared from that field
(``attnprobe.io.options.add_options``) and default to the field's default, unless the difference is
declared below with its reason. The public API functions that take the same options default the same way.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path

import pytest

from attnprobe.capture.api import capture, capture_many
from attnprobe.capture.job import CaptureOptions
from attnprobe.cli.main import build_parser
from attnprobe.counterfactual.run import RunOptions
from attnprobe.studies.ibis.attention import run_attention
from attnprobe.studies.ibis.jobs import AttentionJob
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.runner.config import RunSettings
from attnprobe_hooks.backend import DEFAULT_CHUNK_SIZE, LoadedModel

# Defaults that differ on purpose, each with its reason in the code (QUERIES_WHY says it in --help too;
# study attention's model and dtype are the study's own, found in its folder: capture_model.py).
# study interference's --queries is --capture-in-loop's: the captures study attention would make, so its default.
DIFFERENCES = {("study attention", "queries"): "reasoning+decision", ("study attention", "model"): None,
               ("study attention", "dtype"): None, ("study interference", "queries"): "reasoning+decision"}
# Record fields that the generation group (cli/options.py, one for every command) declares, under the same names.
GENERATED = {RunSettings: ("max_new_tokens", "temperature"), LoopConfig: ("max_new_tokens", "temperature")}
# Options the output and generation groups declare for every command (cli/options.py) that a record
# carries as a plain field (IbisOptions): the parser's default must still be the record's.
SHARED = {"max_new_tokens", "force", "out"}
# Records a command builds whose generation fields (GENERATED) its generation group sets.
GENERATES = {"run": RunSettings, "study interference": LoopConfig}
# Record fields that are not options, though ``run`` has an option of that name: they override the
# preset's value (None: the preset's, or a name made from the preset and the policy; cli/run.py).
PRESET_OVERRIDES = {("run", "filter"), ("run", "validation"), ("run", "name"), ("run", "context_policy")}

def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command name, parser) of every leaf subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield " ".join(path), parser
    for sub in subs:
        for name, p in sub.choices.items():
            yield from commands(p, path + (name,))


def field_defaults(record) -> dict:
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(record)}


PARSERS = dict(commands(build_parser()))
# The records each command builds from its options, derived from the registrations: every option that
# add_options declared from a record's field carries ``option_of`` (record, field).
COMMAND_RECORDS = {name: tuple(dict.fromkeys([a.option_of[0] for a in p._actions if hasattr(a, "option_of")]
                                             + ([GENERATES[name]] if name in GENERATES else [])))
                   for name, p in PARSERS.items()}


def test_every_command_is_covered():
    """Every command is in the table; the studies' commands declare their options from records."""
    assert set(COMMAND_RECORDS) == set(PARSERS) and len(PARSERS) == 18
    for name in ("capture", "counterfactual", "study masking", "study attention", "study interference", "run",
                 "ibis all", "ibis run", "ibis capture", "ibis report", "compare"):
        assert COMMAND_RECORDS[name], name


@pytest.mark.parametrize("name", sorted(COMMAND_RECORDS))
def test_parser_defaults_are_the_records_defaults(name):
    """Each option of a record field comes from the field, with the field's default (or a declared
    difference); run's --max-new-tokens 4096 and interference's None are the records' own defaults."""
    from attnprobe.io.options import cli_fields

    actions = {a.dest: a for a in PARSERS[name]._actions if a.default is not argparse.SUPPRESS}  # not hidden aliases
    checked = 0
    for record in COMMAND_RECORDS[name]:
        options, generated = cli_fields(record), GENERATED.get(record, ())
        for field, default in field_defaults(record).items():
            dest = field
            if dest not in actions:
                continue
            if field not in options and field not in generated:
                if getattr(actions[dest], "option_of", (record,))[0] is not record:
                    continue  # a plain field filled from another record's option (checked under that record)
                if field in SHARED:  # declared once for every command (cli/options.py): same default
                    assert default is dataclasses.MISSING or actions[dest].default == default, f"{name} --{dest}: {actions[dest].default!r} != {default!r}"
                    checked += 1
                    continue
                assert (name, field) in PRESET_OVERRIDES, f"{name}: --{dest} is declared by hand"
                continue
            if default is dataclasses.MISSING:  # a required positional argument
                assert actions[dest].required and actions[dest].option_of == (record, field)
                checked += 1
                continue
            action = actions[dest]
            want = DIFFERENCES.get((name, field), default)
            assert action.default == want, f"{name} {action.option_strings}: {action.default!r} != {want!r}"
            if field not in generated:  # declared from this field (not by the generation group)
                assert action.option_of == (record, field) or (
                    action.option_of[1] == field and field_defaults(action.option_of[0])[field] == default), field
            checked += 1
    assert checked >= {"capture": 8, "counterfactual": 8, "run": 9, "study interference": 11}.get(
        name, 1 if COMMAND_RECORDS[name] else 0)


def test_declared_differences_have_their_reason():
    from attnprobe.cli.options import QUERIES_WHY

    assert set(QUERIES_WHY) == {CaptureOptions().queries, DIFFERENCES[("study attention", "queries")]}
    assert PARSERS["capture"]._option_string_actions["--queries"].default == "reasoning"


def test_chunk_size_has_one_default():
    """The chunk is chosen for the device unless given (None everywhere: the record, every parser, the
    counterfactual record, IBIS's job, the API); 512, the CPU's and a vLLM engine's default, is written once
    (attnprobe_hooks.backend.DEFAULT_CHUNK_SIZE)."""
    from attnprobe_hooks.chunking import ChunkChoice, choose_chunk

    assert DEFAULT_CHUNK_SIZE == 512
    assert CaptureOptions().chunk_size is RunOptions().chunk_size is None
    assert {PARSERS[c]._option_string_actions["--chunk-size"].default for c in COMMAND_RECORDS
            if "--chunk-size" in PARSERS[c]._option_string_actions} == {None}
    assert field_defaults(AttentionJob)["chunk_size"] is None
    assert inspect.signature(run_attention).parameters["chunk_size"].default is None
    # the vLLM engine's chunk, read from the source (importing the module imports torch)
    source = Path(importlib.util.find_spec("attnprobe_hooks.vllm").submodule_search_locations[0]) / "backend.py"
    load = next(n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef) and n.name == "load")
    args = load.args.kwonlyargs
    assert ast.unparse(load.args.kw_defaults[[a.arg for a in args].index("chunk_size")]) == "DEFAULT_CHUNK_SIZE"
    plain = LoadedModel(None, None, "spec", "name", "transformers", "float32", "hf-folder", extra={"device": "cpu"})
    assert choose_chunk(plain, 5000) == ChunkChoice(DEFAULT_CHUNK_SIZE, "the default on cpu (512 tokens)")
    engine = LoadedModel(None, None, "spec", "name", "vllm", "float32", "hf-folder", extra={"chunk_size": 256})
    assert choose_chunk(engine, 5000).size == 256 and choose_chunk(engine, 5000, requested=64).size == 64


def test_api_functions_default_like_the_cli():
    """capture_many / capture share prefixes like every command (on: exact within 1e-5) and take the
    model's chunk (None -> DEFAULT_CHUNK_SIZE, or the chunk a vLLM engine was built with)."""
    many = inspect.signature(capture_many).parameters
    one = inspect.signature(capture).parameters
    assert many["share_prefixes"].default is CaptureOptions().share_prefixes is True
    assert RunOptions().share_prefixes is field_defaults(AttentionJob)["share_prefixes"] is True
    assert many["chunk_size"].default is None and one["chunk_size"].default is None
    for name in ("queries", "layers", "rendering", "max_tokens", "truncate"):
        assert many[name].default == one[name].default == getattr(CaptureOptions(), name), name
    assert list(many["save_qk_layers"].default) == CaptureOptions().save_qk_layers == []


def test_cli_builds_the_default_records():
    """With no options given, the records the CLI builds equal the records' defaults; the negated
    flag turns sharing off in one place."""
    from attnprobe.cli.counterfactual import run_options
    from attnprobe.cli.options import capture_options

    parse = build_parser().parse_args
    args = parse(["capture", "t.jsonl", "--out", "o"])
    assert capture_options(args) == CaptureOptions()
    args = parse(["capture", "t.jsonl", "--out", "o", "--no-prefix-sharing", "--chunk-size", "256", "--layers", "0-2"])
    assert capture_options(args) == CaptureOptions(share_prefixes=False, chunk_size=256, layers=[0, 1, 2])
    args = parse(["counterfactual", "t.jsonl", "--out", "o", "--no-progress"])
    assert run_options(args) == RunOptions()
    args = parse(["counterfactual", "t.jsonl", "--out", "o", "--no-progress", "--actions", "--no-prefix-sharing"])
    assert run_options(args) == RunOptions(actions=True, share_prefixes=False)


def test_loop_config_from_args():
    from attnprobe.io.options import from_args

    args = build_parser().parse_args(["study", "interference", "q.jsonl", "--out", "o", "--top-k", "7",
                                      "--scaffold", "seed002", "--structured-actions"])
    config = from_args(LoopConfig, args, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    assert config == LoopConfig(scaffold="seed002", top_k=7, structured_actions=True)
    assert (config.max_turns, config.max_new_tokens, config.temperature) == (10, 8192, 1.0)  # seed002's


def test_add_options_machinery():
    """The field's default fills ``{default}`` in the help; a flag's default is its action's; a
    per-command default is taken; from_args keeps the record's default for options not declared."""
    from attnprobe.io.options import add_options, from_args, option

    @dataclasses.dataclass
    class Toy:
        size: int = option(3, flag="--size", type=int, help="size (default {default})")
        sharing: bool = option(True, flag="--no-sharing", action="store_false", help="off")
        other: str = option("x", flag="--other", help="other")

    p = argparse.ArgumentParser()
    add_options(p, Toy, ("size", "sharing"), defaults={"size": 5})
    assert p._option_string_actions["--size"].help == "size (default 5)"
    assert from_args(Toy, p.parse_args([])) == Toy(size=5)
    assert from_args(Toy, p.parse_args(["--no-sharing", "--size", "2"]), other="y") == Toy(2, False, "y")
    with pytest.raises(ValueError, match="fixed by its action"):
        add_options(argparse.ArgumentParser(), Toy, ("sharing",), defaults={"sharing": False})


def test_settings_messages_spell_the_declared_flags():
    """A refused counterfactual rerun names options as the records declare them (no second spelling)."""
    from attnprobe.counterfactual.job import OPTION_NAMES

    assert {k: OPTION_NAMES[k] for k in ("spec", "max_tokens", "max_new_tokens", "chunk_size", "share_prefixes")} == {
        "spec": "--model", "max_tokens": "--max-tokens", "max_new_tokens": "--max-new-tokens",
        "chunk_size": "--chunk-size", "share_prefixes": "--no-prefix-sharing"}


# One meaning per flag name across commands (issue 38): where two commands used one name for two things,
# the option was renamed; the old spelling still parses (hidden from --help) with one warning line.
FLAG_COMMANDS = {
    "--preset": {"run"},  # the runner's agent preset (baseline | nis-agent)
    "--generation-preset": {"study interference"},  # was --preset: generation settings (cpu)
    "--api-key-env": {"ibis all", "ibis run", "run", "study interference"},  # the key a client sends
    "--require-key-env": {"serve"},  # was --api-key-env: the key the server requires
    "--request-timeout": {"ibis all", "ibis run", "run", "study interference"},  # a client waits for a reply
    "--receive-timeout": {"serve"},  # was --request-timeout: the server receives a request
    "--batch-size": set(),  # four meanings, now four names:
    "--prompts-per-batch": {"ibis all", "ibis run"},
    "--questions-per-batch": {"run"},
    "--trajectories-per-call": {"counterfactual", "study masking"},
    "--episodes-per-batch": {"study interference"},
    "--policy": {"counterfactual", "study masking", "study interference"},  # adds a policy / setting to run
    "--only-setting": {"study attention"},  # was --policy there: keeps only that setting
    "--force-capture": set(),  # removed from ibis all; a hidden old name of --force on ibis capture
}


def _visible(parser, flag):
    action = parser._option_string_actions.get(flag)
    return action is not None and action.help is not argparse.SUPPRESS


@pytest.mark.parametrize("flag", sorted(FLAG_COMMANDS))
def test_each_flag_name_has_one_meaning(flag):
    assert {name for name, p in PARSERS.items() if _visible(p, flag)} == FLAG_COMMANDS[flag]


@pytest.mark.parametrize("argv,dest,value,new", [
    (["study", "interference", "q", "--out", "o", "--preset", "cpu"], "preset", "cpu", "--generation-preset"),
    (["study", "interference", "q", "--out", "o", "--batch-size", "4"], "batch_size", 4, "--episodes-per-batch"),
    (["study", "attention", "o", "--policy", "mask:1"], "only", ["mask:1"], "--only-setting"),
    (["ibis", "run", "--batch-size", "3"], "batch_size", 3, "--prompts-per-batch"),
    (["run", "--out", "o", "--batch-size", "2"], "batch_size", 2, "--questions-per-batch"),
    (["counterfactual", "t.jsonl", "--out", "o", "--batch-size", "5"], "batch_size", 5, "--trajectories-per-call"),
    (["serve", "--api-key-env", "K"], "api_key_env", "K", "--require-key-env"),
    (["serve", "--request-timeout", "7"], "request_timeout", 7.0, "--receive-timeout"),
    (["ibis", "capture", "--force-capture"], "force", True, "--force"),
])
def test_old_spellings_still_parse_with_one_warning(argv, dest, value, new):
    from attnprobe.io.options import deprecation_warnings

    args = build_parser().parse_args(argv)
    old = next(a for a in argv if a.startswith("--") and a not in ("--out",))
    assert getattr(args, dest) == value
    assert deprecation_warnings(args) == [f"{old} is deprecated here; use {new} (same meaning)"]
    new_argv = [new if a == old else a for a in argv]
    assert getattr(build_parser().parse_args(new_argv), dest) == value  # the new spelling, no warning
    assert deprecation_warnings(build_parser().parse_args(new_argv)) == []


def test_ibis_all_has_no_force_capture():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ibis", "all", "--force-capture"])
    from attnprobe.studies.ibis.pipeline import IbisOptions

    assert "force_capture" not in {f.name for f in dataclasses.fields(IbisOptions)}


def test_the_warning_is_one_line_on_stderr(capsys, tmp_path):
    from attnprobe.cli.main import main

    assert main(["study", "attention", str(tmp_path / "none"), "--policy", "mask:1", "--policy", "none"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "attnprobe: --policy is deprecated here; use --only-setting (same meaning)"
    assert len(err) == 2 and err[1].startswith("attnprobe: error: ")  # the folder is not a study
