"""Progress (issue 13, item 13): the "loading model" line, the Python API's ``progress=`` switch and
progress inside batches of the local executor. Fake workloads and a fake backend, no model."""

from __future__ import annotations

import importlib
import logging
import re
from types import SimpleNamespace

import pytest
from support.jobs import ListJob

from attnprobe.execution import LocalExecutor

# attnprobe.capture is also the function attnprobe.capture(), so import the modules by name
api = importlib.import_module("attnprobe.capture.api")
models = importlib.import_module("attnprobe.capture.models")


@pytest.fixture
def records():
    """INFO records of attnprobe loggers, whatever an earlier cli.main() did to propagation."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append
    lg = logging.getLogger("attnprobe")
    old = lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.DEBUG)
    yield seen
    lg.removeHandler(handler)
    lg.setLevel(old)


def run_job(tmp_path, values, *, progress, **kw) -> dict:
    return LocalExecutor(lambda: None, progress=progress).run(ListJob(tmp_path, values, **kw))


def test_executor_progress_switch(tmp_path, capsys):
    items = ["a", "b", "c"]
    counts = run_job(tmp_path, items, finished=lambda it: it == "a", stage="demo work", progress=False)
    assert counts == {"done_before": 1, "done": 2, "failed": 0}
    # no bar (the executor's "1 of 3 already done, skipped" log line may reach stderr through a handler an
    # earlier CLI test left on the logger: that line is not a bar)
    assert not re.search(r"demo work: +\d+%\|", capsys.readouterr().err)
    run_job(tmp_path, items, finished=lambda it: it == "a", stage="demo work", progress=True)
    err = capsys.readouterr().err
    assert re.search(r"demo work: 100%\|[^|]*\| 2/2 ", err), err


def test_batch_says_what_it_runs_before_it_ends(tmp_path, capsys):
    """A batch generated in one call shows "running a batch of N" before it finishes (not a silent 0/N)."""
    seen = []

    def work(job, batch):
        seen.append(capsys.readouterr().err)  # what the user sees while the batch runs

    counts = run_job(tmp_path, list(range(5)), work=work, stage="gen", batch_size=3, progress=True)
    assert counts["done"] == 5
    assert "0/5 [" in seen[0] and "running a batch of 3" in seen[0]
    assert "3/5 [" in seen[1] and "running a batch of 2" in seen[1]
    assert re.search(r"5/5 \[[^\]]*item/s\] *\n?$", capsys.readouterr().err)  # postfix cleared at the end


def test_a_job_notes_what_its_batch_is_doing(tmp_path, capsys):
    """``job.note`` shows the step in flight beside the bar (the runner: "q03: call 7 (worker)"); the count
    moves when the batch is written, never past the total."""
    seen = []

    def work(job, batch):
        for it in batch:
            job.note(f"item {it}")
            seen.append(capsys.readouterr().err)

    counts = run_job(tmp_path, list("abcd"), work=work, stage="calls", batch_size=2, progress=True)
    assert counts["done"] == 4
    assert ["0/4" in seen[0], "0/4" in seen[1], "2/4" in seen[2], "2/4" in seen[3]] == [True] * 4
    assert "item b" in seen[1] and "item d" in seen[3]
    err = capsys.readouterr().err
    assert "4/4" in err and "5/4" not in err and "6/4" not in err


def traj(name: str) -> SimpleNamespace:
    return SimpleNamespace(id=name, n=10, query_positions=())  # the plan's view too (make_plan is faked)


def fake_capture_setup(monkeypatch) -> tuple[SimpleNamespace, list]:
    """capture_many over a fake model and backend; returns (model, the progress flags the backend got)."""
    flags: list = []
    backend = SimpleNamespace(name="fake", run=lambda model, plans, chunk_size, progress, **kw: flags.append(progress)
                              or [None] * len(plans))
    monkeypatch.setattr(api, "get_backend", lambda name: backend)
    monkeypatch.setattr(api, "prepare", lambda model, traj, **kw: traj)
    monkeypatch.setattr(api, "select_queries", lambda rendered, queries: [])
    monkeypatch.setattr(api, "weights_hash", lambda spec: None)
    monkeypatch.setattr(api, "make_plan", lambda *a, **kw: a[0])
    monkeypatch.setattr(api, "assemble", lambda model, t, *a: f"result {t.id}")
    return SimpleNamespace(extra={"chunk_size": 8}, backend="fake", spec="x", num_layers=2), flags


TRAJS = [traj("t1"), traj("t2"), traj("t3")]


def test_capture_progress_switch(monkeypatch, capsys):
    model, flags = fake_capture_setup(monkeypatch)
    assert api.capture_many(model, TRAJS, batch_size=2) == ["result t1", "result t2", "result t3"]
    assert capsys.readouterr().err == "" and flags == [False, False]  # default: silent
    assert api.capture_many(model, TRAJS, batch_size=2, progress=False) == [
        "result t1", "result t2", "result t3"]
    assert capsys.readouterr().err == ""
    api.capture_many(model, TRAJS, batch_size=2, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"capture: 100%\|[^|]*\| 3/3 ", err) and flags[-2:] == [True, True]
    assert api.capture(model, traj("t1"), progress=True) == "result t1"  # one trajectory: only the backend's bar
    assert capsys.readouterr().err == "" and flags[-1] is True


def test_loading_model_line(monkeypatch, tmp_path, records):
    folder = tmp_path / "MyModel"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    loads = []
    monkeypatch.setattr(models, "get_backend",
                        lambda name: SimpleNamespace(load=lambda spec, dtype, **kw: loads.append((spec, dtype, kw))))
    monkeypatch.setattr(models, "_ANNOUNCED", set())
    models.load_model(folder, dtype="bf16", device="cpu")
    models.load_model(folder, dtype="bf16", device="cpu")  # the backend's cache answers: said once
    models.load_model(folder, backend="vllm", tensor_parallel_size=2)
    lines = [(r.levelno, r.getMessage()) for r in records if r.name == "attnprobe.capture.models"]
    assert lines == [(logging.INFO, f"loading model MyModel from {folder} (transformers, bfloat16, device cpu)"),
                     (logging.INFO, f"loading model MyModel from {folder} (vllm, float32, tensor_parallel_size 2)")]
    assert len(loads) == 3


def test_loading_line_hidden_by_quiet(monkeypatch, tmp_path, capsys):
    from attnprobe.cli.main import setup_logging

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(models, "get_backend", lambda name: SimpleNamespace(load=lambda spec, dtype, **kw: None))
    monkeypatch.setattr(models, "_ANNOUNCED", set())
    try:
        setup_logging(quiet=True)
        models.load_model(tmp_path)
        assert capsys.readouterr().err == ""
        monkeypatch.setattr(models, "_ANNOUNCED", set())
        setup_logging()
        models.load_model(tmp_path)
        assert capsys.readouterr().err == f"attnprobe: loading model {tmp_path.name} from {tmp_path} (transformers, float32)\n"
    finally:
        for name in ("attnprobe", "attnprobe_hooks", "attnprobe_app"):
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).propagate = True
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_gguf_bar_follows_the_no_progress_switch(monkeypatch, capsys):
    """transformers draws the GGUF de-quantization bar with tqdm directly; the backend's wrapper makes
    it honour HF_HUB_DISABLE_PROGRESS_BARS, which the CLI sets for --no-progress / -q."""
    import transformers.modeling_gguf_pytorch_utils as gguf

    from attnprobe_hooks.transformers.backend import _quiet_gguf_bar

    _quiet_gguf_bar()
    _quiet_gguf_bar()  # idempotent: wrapped once
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    list(gguf.tqdm(range(3), desc="Converting GGUF"))
    assert "Converting GGUF" not in capsys.readouterr().err
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    list(gguf.tqdm(range(3), desc="Converting GGUF"))
    assert "Converting GGUF" in capsys.readouterr().err


def test_cli_no_progress_sets_the_switch_for_the_command_only(monkeypatch):
    import os

    from attnprobe.cli.main import library_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    with library_bars(True):
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


@pytest.mark.parametrize("argv, words", [
    (["capture", "x.jsonl", "--out", "o", "--chunk-size", "0"], "argument --chunk-size: must be at least 1, got 0"),
    (["serve", "--port", "99999"], "argument --port: port must be 0-65535, got 99999"),
])
def test_bad_numbers_are_refused_while_parsing(argv, words, capsys):
    """Found by the issue-13 audit: these were refused only after the model had loaded."""
    from attnprobe.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err
