"""Policy and setting specs are canonical: one spelling per setting (so one folder), the rest refused in one line
(issue 27: '++', '+', ' ' were settings; 'mask:2+', 'mask: 2', 'mask:٣' ran mask:2 again under other folders;
an ftp:// refiner passed the check; 'refine:bm25:0' was reported as refine-latest; 'none+mask:2' said "unknown
policy 'none'")."""

from __future__ import annotations

import pytest

from attnprobe.agents.context import parse_setting
from attnprobe.agents.policies import parse_policy
from attnprobe.agents.policy_specs import canonical_setting, canonical_settings


@pytest.mark.parametrize("spec, why", [
    ("++", "an empty part"),
    ("+", "an empty part"),
    (" ", "contains a space"),
    ("", "empty"),
    ("mask:2+", "an empty part"),
    ("+mask:2", "an empty part"),
    ("mask: 2", "contains a space"),
    (" mask:2", "contains a space"),
    ("mask:\u0663", "non-ASCII"),
    ("mask:2\x00", "control character"),
    ("refine:openai:ftp://host/v1:m", "must be an http:// or https:// URL"),
    ("refine:openai:host:m", "must be an http:// or https:// URL"),
    ("none+mask:2", "'none' (no policy) cannot be composed"),
    ("mask:2+mask:02", "mask:2 appears twice"),
    ("refine:bm25+refine:bm25:2", "at most one refine"),
])
def test_bad_settings_are_refused_naming_the_spec(spec, why):
    with pytest.raises(ValueError) as exc:
        parse_setting(spec)
    msg = str(exc.value)
    assert msg.startswith(f"policy {spec!r}") and why in msg and "\n" not in msg


def test_refine_errors_name_the_spec_as_given_not_its_loop_form():
    with pytest.raises(ValueError, match=r"^policy 'refine:bm25:0': N must be >= 1$"):
        parse_setting("refine:bm25:0")


def test_one_spelling_per_setting():
    assert canonical_setting("mask:05") == "mask:5"
    assert canonical_setting("refine:bm25") == "refine:bm25:3"
    assert canonical_setting("ircot:oq+refine:bm25") == "ircot:oq+refine:bm25:3"
    assert parse_setting("mask:005").spec == "mask:5"
    assert parse_setting("none").spec == "none"
    url = "refine:openai:https://127.0.0.1:8000/v1:my-model"
    assert canonical_setting(url) == url
    assert parse_policy("mask:07").name == "mask:7"


def test_two_spellings_of_one_setting_are_refused():
    with pytest.raises(ValueError, match=r"'mask:05' is the same setting as 'mask:5' \(mask:5\)"):
        canonical_settings(["none", "mask:5", "mask:05"])
    assert canonical_settings(["none", "refine:bm25:2", "mask:1"]) == ["none", "refine:bm25:2", "mask:1"]


def test_parse_policy_is_as_strict():
    for bad in ("mask: 2", "mask:\u0663", "refine:openai:ftp://x:m", "mask:"):
        with pytest.raises(ValueError, match="^policy '"):
            parse_policy(bad)


def test_a_huge_bad_spec_gives_a_short_line():
    with pytest.raises(ValueError) as exc:
        parse_setting("x" * 1_000_000)
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("spec, line", [
    ("mask:+3", "policy 'mask:+3': the part 'mask:': K must be an integer, e.g. mask:5"),
    ("mask:3+ircot:x", "policy 'mask:3+ircot:x': the part 'ircot:x': the IRCoT variant must be one of o, oq, oqp"),
    ("mask:x", "policy 'mask:x': K must be an integer, e.g. mask:5"),
])
def test_a_bad_part_is_named_with_the_whole_setting(spec, line):
    """Issue 38: 'mask:+3' was named as 'mask:' (the part '+' split off); the error names the whole spec."""
    with pytest.raises(ValueError) as exc:
        canonical_setting(spec)
    assert str(exc.value) == line


def test_the_agents_layer_names_no_option_and_each_cli_names_its_own(tmp_path, capsys):
    """Issue 39: a refused spec is a plain PolicySpecError ("policy 'mask:x': ..."); the CLI boundary names the
    option it came from (``--policy``; ``run``: ``--context-policy``, without patching the text)."""
    from attnprobe.agents.policy_specs import PolicySpecError
    from attnprobe.cli.main import main
    from attnprobe.studies.runner import RunSettings

    with pytest.raises(PolicySpecError) as exc:
        RunSettings(context_policy="mask:x")
    assert str(exc.value) == "policy 'mask:x': K must be an integer, e.g. mask:5"
    assert exc.value.for_option("--context-policy") == "--context-policy 'mask:x': K must be an integer, e.g. mask:5"
    assert main(["counterfactual", str(tmp_path / "none.jsonl"), "--policy", "mask:x", "--out", str(tmp_path / "o"),
                 "--model", str(tmp_path / "nope.gguf")]) == 2
    assert capsys.readouterr().err.strip() == "attnprobe: error: --policy 'mask:x': K must be an integer, e.g. mask:5"
