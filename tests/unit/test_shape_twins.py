"""Issue 28's twins: a job is told what model it got (no probing for ``complete``), one dtype table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attnprobe.capture.models import LoadedModel
from attnprobe.generation.chat import ChatReply
from attnprobe.model_files import DTYPES


class BatchOnly:
    """A chat backend that answers batches only (the protocol's complete_batch), with no ``complete``."""

    kind = "scripted"
    name = "batch-only"

    def complete_batch(self, requests):
        return [ChatReply("ok") for _ in requests]


def test_behaviour_job_keeps_a_chat_backend_without_complete(tmp_path):
    from attnprobe.studies.ibis.jobs import BehaviourJob

    job = BehaviourJob(tmp_path, [], force=True)
    chat = BatchOnly()
    backend = job.prepare(chat)
    assert backend.chat is chat and backend.in_process is False  # before: wrapped as a loaded model


def test_behaviour_job_wraps_a_loaded_model_in_an_in_process_chat(tmp_path):
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.studies.ibis.jobs import BehaviourJob

    tok = SimpleNamespace(chat_template=None, eos_token_id=0, pad_token_id=0)
    loaded = LoadedModel(model=SimpleNamespace(), tokenizer=tok, spec="x", name="x", backend="transformers",
                         dtype="float32", source="hf-folder")
    backend = BehaviourJob(tmp_path, [], force=True).prepare(loaded)
    assert backend.in_process is True and isinstance(backend.chat, TransformersChat)
    assert backend.chat.loaded is loaded


def test_server_module_takes_the_dtype_table_and_its_aliases(monkeypatch):
    from attnprobe.generation.server import options

    seen = {}
    monkeypatch.setattr(options, "serve", lambda model, **kw: seen.setdefault("dtype", kw["dtype"]) and 0)
    assert options.main(["--dtype", "bf16"]) == 0 or seen  # before: 'bf16' was refused (exit 2)
    assert seen["dtype"] == "bfloat16" and "bfloat16" in DTYPES
    with pytest.raises(SystemExit):
        options.main(["--dtype", "int8"])
