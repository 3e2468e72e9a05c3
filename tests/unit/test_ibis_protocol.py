"""Issue 39: the IBIS protocol is one value (name and resolved reminder) from the options to every stage, job,
framing and report; records keep the keys ``protocol`` and ``reminder`` they always had."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from attnprobe.resources import data_path
from attnprobe.studies.ibis.behaviour import generation_settings
from attnprobe.studies.ibis.framings import IbisProtocol, as_protocol, build_framing
from attnprobe.studies.ibis.items import load_items
from attnprobe.studies.ibis.jobs import AttentionJob, BehaviourJob
from attnprobe.studies.ibis.layout import ModelFolderLayout
from attnprobe.studies.ibis.pipeline import IbisOptions

ITEM = load_items(data_path("ibis_items.jsonl"))[0]


def test_the_value_resolves_its_reminder():
    assert IbisProtocol() == IbisProtocol("paper", "listing") and IbisProtocol().reminder == "listing"
    assert IbisProtocol("matched").reminder == "identical" and IbisProtocol("paper", "identical").reminder == "identical"
    assert as_protocol("matched") == IbisProtocol("matched", "identical")
    with pytest.raises(ValueError, match="protocol must be one of"):
        IbisProtocol("other")
    with pytest.raises(ValueError, match="paper protocol only"):
        IbisProtocol("matched", "listing")
    assert IbisOptions().ibis_protocol == IbisProtocol("paper", "listing")
    assert replace(IbisOptions(), reminder="identical").ibis_protocol == IbisProtocol("paper", "identical")


def test_records_keep_their_keys_and_values():
    backend = SimpleNamespace(no_call_tokens=None)
    assert generation_settings(backend, max_new_tokens=64, protocol=IbisProtocol("paper", "identical")) == {
        "max_new_tokens": 64, "decoding": "greedy", "protocol": "paper", "reminder": "identical", "no_call_tokens": None}
    listing = build_framing(ITEM, "agentic", IbisProtocol())
    identical = build_framing(ITEM, "agentic", IbisProtocol("paper", "identical"))
    assert listing.meta["ibis"]["reminder"] == "listing" and identical.meta["ibis"]["reminder"] == "identical"
    assert listing.messages[-1]["content"] != identical.messages[-1]["content"]  # the value reaches the text
    assert build_framing(ITEM, "agentic", "paper").to_dict() == listing.to_dict()  # a name: its default reminder


def test_jobs_carry_the_value(tmp_path):
    job = BehaviourJob(tmp_path / "b", [ITEM], protocol=IbisProtocol("paper", "identical"))
    assert job.protocol == IbisProtocol("paper", "identical")
    assert AttentionJob(tmp_path / "a", [ITEM], protocol="matched").protocol == IbisProtocol("matched")
    keys = [w.key for w in AttentionJob(tmp_path / "a", [ITEM], protocol="matched").items()]
    assert keys[-1].endswith("/observer_shifted")  # the matched protocol's position control


def test_a_report_re_aggregates_with_the_reminder_the_run_recorded(tmp_path):
    layout = ModelFolderLayout(tmp_path)
    layout.run.write_text(json.dumps({"model": "m", "protocol": "paper", "reminder": "identical"}))
    assert layout.ibis_protocol() == IbisProtocol("paper", "identical")  # was: the paper protocol's default
    layout.run.write_text(json.dumps({"model": "m", "protocol": "matched"}))
    assert layout.ibis_protocol() == IbisProtocol("matched", "identical")
    layout.run.write_text(json.dumps({"model": "m"}))  # a folder from before protocols: matched
    assert layout.ibis_protocol() == IbisProtocol("matched")
    layout.run.write_text(json.dumps({"model": "m", "protocol": "matched", "reminder": "listing"}))  # hand-edited
    assert layout.ibis_protocol() == IbisProtocol("matched", "identical")


def test_write_report_aggregates_with_the_recorded_protocol(tmp_path, monkeypatch):
    """The report's re-aggregation gets the run's protocol value, reminder included (it got the bare name)."""
    from attnprobe.studies.ibis import attention, report

    layout = ModelFolderLayout(tmp_path)
    layout.run.write_text(json.dumps({"model": "m", "protocol": "paper", "reminder": "identical"}))
    layout.items.write_text(json.dumps(ITEM.to_dict()) + "\n")
    layout.captures.mkdir()
    seen = []
    monkeypatch.setattr(attention, "aggregate", lambda items, folder, **kw: seen.append((len(items), kw)))
    monkeypatch.setattr(report, "compute_metrics", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        report.write_report(tmp_path)
    assert seen == [(1, {"protocol": IbisProtocol("paper", "identical")})]
