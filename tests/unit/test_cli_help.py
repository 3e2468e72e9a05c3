"""Every command's options mean one thing and say why their defaults differ, and every ``--help`` is plain
text (issue 29): parsed from the real parser, no model."""

from __future__ import annotations

import argparse
import re

import pytest

from attnprobe.cli.main import build_parser


def commands(parser=None, path=()):
    """(command path, parser) for the top level and every command and subcommand."""
    parser = parser or build_parser()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def subparser(*path):
    return dict(commands())[tuple(path)]


def option(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


ROLES = re.compile(r"``|:(func|class|mod|meth|data|attr):`")


def test_no_help_shows_rest_markup():
    bad = {" ".join(p) or "attnprobe": ROLES.search(parser.format_help()).group(0)
           for p, parser in commands() if ROLES.search(parser.format_help())}
    assert bad == {}
    assert len(dict(commands())) > 15  # every subcommand was visited (study masking/interference/attention ...)


def test_a_repeated_policy_means_separate_settings_and_plus_composes():
    p = build_parser()
    study = p.parse_args(["study", "interference", "q.jsonl", "--policy", "mask:1", "--context-policy",
                          "ircot:oq+refine:bm25:3", "--out", "o"])
    assert study.settings == ["mask:1", "ircot:oq+refine:bm25:3"]  # two settings, the second composed
    run = p.parse_args(["run", "q.jsonl", "--context-policy", "ircot:oq+refine:bm25:3", "--out", "o"])
    assert run.context_policy == "ircot:oq+refine:bm25:3"  # one setting, composed with +
    with pytest.raises(SystemExit):
        p.parse_args(["run", "q.jsonl", "--context-policy", "mask:1", "--context-policy", "ircot:oq", "--out", "o"])


def test_defaults_that_differ_say_why_in_each_help():
    run, study = subparser("run"), subparser("study", "interference")
    assert option(run, "--max-new-tokens").default == 4096
    assert option(study, "--max-new-tokens").default is None  # per scaffold: seed002 8192, ircot 128
    assert "seed 000 C.3" in option(run, "--max-new-tokens").help
    assert "'study interference' follows its scaffold's seed" in option(run, "--max-new-tokens").help
    assert "'run' uses 4096, seed 000 C.3" in option(study, "--max-new-tokens").help
    capture, attention = subparser("capture"), subparser("study", "attention")
    assert (option(capture, "--queries").default, option(attention, "--queries").default) == \
        ("reasoning", "reasoning+decision")
    assert "'study attention' defaults to reasoning+decision" in option(capture, "--queries").help
    assert "'capture' defaults to reasoning" in option(attention, "--queries").help


def app_pages() -> list[str]:
    """The page names of app/streamlit_app.py's PAGES, read from its source (no streamlit import)."""
    import ast
    from pathlib import Path

    src = (Path(__file__).parents[2] / "app" / "streamlit_app.py").read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "PAGES" for t in n.targets))
    return [k.value for k in node.value.keys]


NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}


def test_readme_and_app_help_count_and_name_the_app_pages():
    from pathlib import Path

    pages = app_pages()
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    said = re.search(r"opens\s+(\w+)\s+pages:(.*?)\n\n", readme, re.S)
    assert said and NUMBERS[said.group(1)] == len(pages) == 6
    assert [p for p in pages if p not in said.group(2)] == []
    app = subparser("app").description
    assert "six pages" in app and [p for p in pages if p not in app] == []
    assert all(kind in app for kind in ("'capture'", "'counterfactual'", "'ibis'", "'compare'", "'study interference'"))
