"""``attnprobe COMMAND --help`` imports no heavy library (issue 38): building the parser and printing every
command's help load the option records only; torch, transformers, scipy, scikit-learn, pandas, streamlit,
openai, plotly and ray are imported when a command runs. Checked by the modules a fresh interpreter holds
afterwards, not by a clock (a busy machine makes any time limit flaky)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "scipy", "sklearn", "pandas", "streamlit", "openai", "plotly", "ray",
         "safetensors", "tokenizers", "huggingface_hub", "gguf", "vllm")

# Runs in a fresh interpreter: every command's --help through main(), as the console script does.
SCRIPT = """
import argparse, contextlib, io, json, sys
from attnprobe.cli.main import build_parser, main

def paths(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from paths(sub, (*path, name))

commands = [[]] + [list(p) for p in paths(build_parser())]
codes = {}
for command in commands:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*command, "--help"])
        except SystemExit as exc:
            codes[" ".join(command)] = (exc.code, "usage:" in out.getvalue())
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def test_every_help_imports_no_heavy_library():
    script = f"HEAVY = {HEAVY!r}\n{SCRIPT}"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["codes"]) > 15  # every command and subcommand (ibis all, study attention ...)
    assert {tuple(v) for v in result["codes"].values()} == {(0, True)}  # each printed its usage and exited 0
    roots = sorted({m.split(".")[0] for m in result["heavy"]})
    assert roots == [], f"--help imported {roots} (first modules: {result['heavy'][:5]})"


def test_statistics_load_scipy_and_sklearn_when_used():
    """attnprobe.stats imports without them and still computes with them (the lazy modules resolve)."""
    script = ("import sys, attnprobe.stats as s\n"
              "before = sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'sklearn'})\n"
              "lo, hi = s.wilson_ci(3, 10)\n"
              "auc = s.roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])\n"
              "print(before, round(lo, 4), round(hi, 4), auc)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "0.1078", "0.6032", "0.75"]


def test_a_command_builds_only_its_own_parser_and_it_equals_the_full_ones():
    """`attnprobe COMMAND ...` imports the module of COMMAND only (main.COMMAND_MODULES); the parser it
    builds shows the same help as the full parser's, for every command (a wrong or missing entry fails)."""
    from attnprobe.cli.main import COMMAND_MODULES, build_parser

    full = {n: p for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
            for n, p in a.choices.items()}
    assert set(COMMAND_MODULES) == set(full)
    for name, parser in full.items():
        own = next(a for a in build_parser([name, "--help"])._actions if isinstance(a.choices, dict))
        assert own.choices[name].format_help() == parser.format_help(), name


def test_a_commands_help_imports_no_other_commands_module():
    script = ("import contextlib, io, sys\nfrom attnprobe.cli.main import main\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              "    try:\n        main(['capture', '--help'])\n    except SystemExit:\n        pass\n"
              "print(sorted(m for m in sys.modules if m.startswith('attnprobe.cli.') or m.startswith('attnprobe.studies')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["['attnprobe.cli.capture',", "'attnprobe.cli.main',", "'attnprobe.cli.options']"]
