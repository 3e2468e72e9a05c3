"""The IBIS stages live in studies/ibis/pipeline.py (issue 28); the CLI builds their options record."""

from __future__ import annotations

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
