"""IBIS results of different variants (dtype, weights, endpoint) are never mixed (issue 13, item 11)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from attnprobe.cli.ibis import _folder, _prepare_folder
from attnprobe.resources import data_path
from attnprobe.studies.ibis.compare import compare_row
from attnprobe.studies.ibis.items import load_items


def _args(tmp_path, **kw):
    base = dict(folder=None, results=tmp_path, protocol="paper", dtype="float32", model="default",
                backend="transformers", base_url=None, served_model=None, items=data_path("ibis_items.jsonl"))
    return argparse.Namespace(**{**base, **kw})


def test_each_variant_gets_its_own_folder_and_mixing_is_refused(tmp_path):
    items = load_items(data_path("ibis_items.jsonl"))[:2]
    f32, bf16 = _args(tmp_path), _args(tmp_path, dtype="bfloat16")
    assert _folder(f32, "SmolLM2") == tmp_path / "SmolLM2"
    assert _folder(bf16, "SmolLM2") == tmp_path / "SmolLM2__bfloat16"
    assert _folder(_args(tmp_path, dtype="bfloat16", protocol="matched"), "SmolLM2") == \
        tmp_path / "SmolLM2__bfloat16__matched"
    folder = tmp_path / "one"
    _prepare_folder(folder, items, f32, "SmolLM2", "transformers")
    run = json.loads((folder / "run.json").read_text())
    assert run["variant"]["dtype"] == "float32" and len(run["variant"]["weights"]) == 16
    _prepare_folder(folder, items, f32, "SmolLM2", "transformers")  # the same variant resumes
    with pytest.raises(ValueError, match="another variant.*dtype was 'float32', now 'bfloat16'"):
        _prepare_folder(folder, items, bf16, "SmolLM2", "transformers")
    # an endpoint run adds its identity; another served model is refused too
    ep = _args(tmp_path, backend="openai", base_url="http://h/v1", served_model="m1")
    _prepare_folder(folder, items, ep, "SmolLM2", "openai")
    with pytest.raises(ValueError, match="served_model was 'm1', now 'm2'"):
        _prepare_folder(folder, items, _args(tmp_path, backend="openai", base_url="http://h/v1", served_model="m2"),
                        "SmolLM2", "openai")
    # compare labels rows by folder, so two variants of one model are two bars, not one stacked bar
    m = {"model": "SmolLM2", "run": json.loads((folder / "run.json").read_text())}
    assert compare_row(m, Path("r/SmolLM2__bfloat16"))["label"] == "SmolLM2__bfloat16"
    assert compare_row(m, folder)["dtype"] == "float32"
