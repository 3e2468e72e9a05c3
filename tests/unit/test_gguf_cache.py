"""The on-disk cache of converted GGUF files: keyed by the file's content and the dtype.

The conversion itself (dequantize, save, reload: the same tensors, tokenizer and logits as reading the GGUF
file, measured 0.0 difference on the bundled model) is exercised wherever the bundled model loads, and
pinned by the baseline test; here the cache rule, with the conversion replaced by a recorder.
"""

from __future__ import annotations

import json

import pytest

import attnprobe.model_convert as mc


@pytest.fixture
def converts(monkeypatch):
    made = []

    def fake_convert(src, out, *, dtype="float32", overwrite=False):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / mc.MARKER).write_text(json.dumps({"source_sha256": mc._sha256(src), "dtype": dtype}))
        made.append((src.read_bytes(), dtype))
        return out

    monkeypatch.setattr(mc, "convert_gguf", fake_convert)
    return made


def test_converted_once_per_content_and_dtype(tmp_path, converts):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"weights-1")
    a = mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False)
    assert mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False) == a
    assert converts == [(b"weights-1", "float32")]
    src.touch()  # a reinstalled wheel: new mtime, same bytes -> still the cached folder
    assert mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False) == a and len(converts) == 1
    b = mc.converted_folder(src, dtype="bfloat16", cache_dir=tmp_path / "c", progress=False)
    assert b != a and converts[-1] == (b"weights-1", "bfloat16")
    src.write_bytes(b"weights-2")  # other content: another folder, converted anew
    c = mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False)
    assert c not in (a, b) and converts[-1] == (b"weights-2", "float32") and len(converts) == 3


def test_a_damaged_cache_entry_is_converted_again(tmp_path, converts):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"weights-1")
    a = mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False)
    (a / mc.MARKER).write_text("{not json")
    assert mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False) == a and len(converts) == 2
    (a / mc.MARKER).write_text(json.dumps({"source_sha256": "0" * 64}))
    assert mc.converted_folder(src, cache_dir=tmp_path / "c", progress=False) == a and len(converts) == 3
