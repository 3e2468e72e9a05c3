"""IBIS results of different variants (dtype, weights, endpoint) are never mixed (issue 13, item 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprobe.resources import data_path
from attnprobe.studies.ibis.compare import compare_row
from attnprobe.studies.ibis.folder import model_folder, model_name, prepare_folder, variant
from attnprobe.studies.ibis.items import load_items


def _prepare(folder, items, v):
    prepare_folder(folder, items, name="SmolLM2", protocol="paper", this_variant=v, items_source="shipped")


def test_each_variant_gets_its_own_folder_and_mixing_is_refused(tmp_path):
    items = load_items(data_path("ibis_items.jsonl"))[:2]
    assert model_folder(tmp_path, "SmolLM2") == tmp_path / "SmolLM2"
    assert model_folder(tmp_path, "SmolLM2", dtype="bfloat16") == tmp_path / "SmolLM2__bfloat16"
    assert model_folder(tmp_path, "SmolLM2", dtype="bfloat16", protocol="matched") == \
        tmp_path / "SmolLM2__bfloat16__matched"
    assert model_name("default") == "SmolLM2-135M-Instruct" and model_name("/m/x.gguf") == "x"
    assert model_name("/m/x.gguf", served_model="served") == "served"
    f32, bf16 = variant(dtype="float32"), variant(dtype="bfloat16")
    folder = tmp_path / "one"
    _prepare(folder, items, f32)
    run = json.loads((folder / "run.json").read_text())
    assert run["variant"]["dtype"] == "float32" and len(run["variant"]["weights"]) == 16
    _prepare(folder, items, f32)  # the same variant resumes
    with pytest.raises(ValueError, match="another variant.*dtype was 'float32', now 'bfloat16'"):
        _prepare(folder, items, bf16)
    # an endpoint run adds its identity; another served model is refused too
    _prepare(folder, items, variant(endpoint="http://h/v1", served_model="m1"))
    with pytest.raises(ValueError, match="served_model was 'm1', now 'm2'"):
        _prepare(folder, items, variant(endpoint="http://h/v1", served_model="m2"))
    # compare labels rows by folder, so two variants of one model are two bars, not one stacked bar
    m = {"model": "SmolLM2", "run": json.loads((folder / "run.json").read_text())}
    assert compare_row(m, Path("r/SmolLM2__bfloat16"))["label"] == "SmolLM2__bfloat16"
    assert compare_row(m, folder)["dtype"] == "float32"
