"""The IBIS stages live in studies/ibis/pipeline.py (issue 28); the CLI builds their options record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _parse(*argv):
    from attnprobe.cli.main import build_parser

    return build_parser().parse_args(["ibis", *argv])


def test_options_record_of_run_and_report():
    from attnprobe.cli.ibis import ibis_options
    from attnprobe.studies.ibis.pipeline import DEFAULT_RESULTS, target

    opts = ibis_options(_parse("run", "--limit", "2", "--no-call-tokens", "0", "--results", "r"))
    assert (opts.generator, opts.limit, opts.results, opts.force) == ("transformers", 2, Path("r"), False)
    rep = ibis_options(_parse("report"))  # no generator options: the stage defaults
    assert rep.generator == "transformers" and rep.results == DEFAULT_RESULTS
    assert target(opts).folder.parent == Path("r") and target(opts).name == target(rep).name


def test_items_are_selected_by_id_and_limit():
    from attnprobe.studies.ibis.items import ItemError, load_items
    from attnprobe.studies.ibis.pipeline import IbisOptions, select_items

    every = load_items(IbisOptions().items_path)
    ids = [every[2].id, every[0].id]
    assert [it.id for it in select_items(IbisOptions(ids=ids))] == [every[0].id, every[2].id]  # file order
    assert [it.id for it in select_items(IbisOptions(limit=1))] == [every[0].id]
    with pytest.raises(ItemError, match="unknown item ids: nope"):
        select_items(IbisOptions(ids=["nope"]))


def test_openai_generator_needs_its_endpoint():
    from attnprobe.studies.ibis.pipeline import IbisOptions, target

    with pytest.raises(ValueError, match="--base-url and --served-model"):
        target(IbisOptions(generator="openai", base_url="http://x"))


def test_default_options_run_a_behaviour_job(tmp_path):
    """Issue 39: ``IbisOptions()`` holds the command's documented defaults (--max-new-tokens 4096, 12 prompts
    per batch, --no-call-tokens 1024), so a Python caller runs the behaviour stage with them (max_new_tokens
    was None and BehaviourJob called int(None) on it); a scripted chat answers every framing with a search."""
    from dataclasses import replace

    from support.scripted_chat import ScriptedChat, tool_call

    from attnprobe.execution.local import in_process
    from attnprobe.studies.ibis.behaviour import BehaviourBackend, read_decisions
    from attnprobe.studies.ibis.pipeline import IbisOptions, select_items, stage_run, target

    defaults = IbisOptions()
    assert (defaults.max_new_tokens, defaults.batch_size, defaults.no_call_tokens) == (4096, 12, 1024)
    opts = replace(defaults, folder=tmp_path / "m", limit=2)
    chat = ScriptedChat(lambda messages, tools: ("I will search.", [tool_call("c1", "web_search", query="x")]))
    items, where = select_items(opts), target(opts)
    with in_process(BehaviourBackend(chat)) as ex:
        counts = stage_run(opts, where, items, ex)
    assert (counts.done, counts.failed) == (6, 0)  # 2 items x 3 framings
    recs = read_decisions(where.layout.decisions)
    assert len(recs) == 6 and {r["decision"] for r in recs} == {"web_search"}
    assert json.loads(where.layout.run.read_text())["stages"]["behaviour"]["max_new_tokens"] == 4096
