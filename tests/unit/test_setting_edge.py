"""Issue 39: a setting is parsed once where it enters (the CLI's options, or ``as_setting`` for a Python caller)
and carried as a value: equal by its one spelling, immutable, crossing processes as its spec; folders, records
and stamps still name it by its spec."""

import copy
from pathlib import Path

import pytest

from attnprobe.agents.context import NO_SETTING, Setting, as_setting, parse_setting, parse_settings
from attnprobe.agents.policy_specs import PolicySpecError
from attnprobe.cli.main import build_parser, main
from attnprobe.resources import data_path


def test_a_setting_is_a_value():
    a, b = parse_setting("mask:05"), parse_setting("mask:5")
    assert a == b and hash(a) == hash(b) and str(a) == "mask:5" and a.parts == ("mask:5",)
    assert a != parse_setting("mask-obs:5") and a != "mask:5"  # a value, not its string
    assert {a, b, NO_SETTING} == {b, parse_setting("none")} and parse_setting("none") is NO_SETTING
    assert not NO_SETTING.active and a.active
    composed = parse_setting("ircot:oq+refine:bm25")
    assert composed.spec == "ircot:oq+refine:bm25:3" and composed.parts == ("ircot:oq", "refine:bm25:3")
    assert composed.view is not None and composed.refine is not None
    with pytest.raises(AttributeError, match="immutable"):
        a.spec = "mask:6"
    assert copy.copy(a) is a and copy.deepcopy([a])[0] is a  # its policies are stateless: the value itself
    fn, args = composed.__reduce__()  # across processes and Ray: its spec, parsed again there
    assert (fn, args) == (parse_setting, ("ircot:oq+refine:bm25:3",)) and fn(*args) == composed
    assert as_setting(a) is a and as_setting("mask:05") == a


def test_two_spellings_of_one_setting_are_refused_naming_both():
    assert parse_settings(["none", "mask:1", parse_setting("ircot:o")]) == [
        NO_SETTING, parse_setting("mask:1"), parse_setting("ircot:o")]
    with pytest.raises(PolicySpecError, match=r"'mask:05' is the same setting as 'mask:5' \(mask:5\)"):
        parse_settings(["mask:5", "mask:05"])


def test_the_cli_parses_at_its_edge_and_the_study_carries_the_values(tmp_path):
    from attnprobe.cli.loop import interference_options
    from attnprobe.studies.loop.layout import StudyLayout
    from attnprobe.studies.loop.study import INTERFERENCE

    q = str(data_path("questions_loop.jsonl"))
    args = build_parser().parse_args(["study", "interference", q, "--out", str(tmp_path / "s"), "--scaffold",
                                      "seed002", "--policy", "none", "--policy", "mask:01", "--baseline", "mask:1",
                                      "--limit", "1"])
    options = interference_options(args)
    assert options.settings == [NO_SETTING, parse_setting("mask:1")] and options.baseline == parse_setting("mask:1")
    assert all(isinstance(s, Setting) for s in options.settings)
    plan = INTERFERENCE.plan(options, StudyLayout(tmp_path / "s"))
    job = plan.groups[0][0]
    assert [s is t for s, t in zip(job.settings, options.settings)] == [True, True]  # carried, not parsed again
    assert [i.key for i in job.items()] == ["none/" + job.questions[0]["id"], "mask-1/" + job.questions[0]["id"]]
    assert plan.data[1:3] == (["none", "mask:1"], "mask:1")  # the study's files name them by their specs
    assert job.setting("mask:1") is options.settings[1]


def test_a_bad_setting_is_one_line_naming_its_option(tmp_path, capsys):
    q = str(data_path("questions_loop.jsonl"))
    assert main(["study", "interference", q, "--out", str(tmp_path / "s"), "--policy", "mask:x"]) == 2
    assert capsys.readouterr().err.strip() == "attnprobe: error: --policy 'mask:x': K must be an integer, e.g. mask:5"
    assert not (tmp_path / "s").exists()
    assert main(["run", str(data_path("questions.jsonl")), "--out", str(tmp_path / "r.jsonl"),
                 "--context-policy", "mask:1+"]) == 2
    assert "--context-policy 'mask:1+': an empty part" in capsys.readouterr().err
    assert not Path(tmp_path / "r.jsonl").exists()


def test_the_runner_carries_its_setting_and_records_its_spec(tmp_path):
    from attnprobe.cli.run import runner_options

    args = build_parser().parse_args(["run", str(data_path("questions.jsonl")), "--out", str(tmp_path / "r.jsonl"),
                                      "--context-policy", "mask:01+ircot:oq"])
    settings = runner_options(args).settings
    assert settings.context_policy == parse_setting("mask:1+ircot:oq") and settings.name == "nis-agent_mask-1_ircot-oq"  # the default preset
    d = settings.to_dict()
    assert d["context_policy"] == "mask:1+ircot:oq" and "context_rules" in d
    from attnprobe.studies.runner.config import RunSettings

    assert "context_policy" not in RunSettings().to_dict() and RunSettings().context_policy is NO_SETTING
    assert RunSettings(context_policy="mask:05").context_policy == parse_setting("mask:5")  # a Python caller's spec
