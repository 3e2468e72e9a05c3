"""``study interference --capture-in-loop --ray`` (issue 40): the episodes run on a Ray replica, so the job whose
``run`` wrote the captures lives there; the driver counts the calls captured in the loop from the capture
folders (study.json ``captured_in_the_loop``, study.md's line and the log line), not from a counter the replica
kept. Starts a local Ray cluster: slow."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnprobe[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_capture_in_the_loop_on_a_replica_is_counted_from_the_files(tiny_smol_folder, tmp_path, capsys):
    import torch

    from attnprobe.cli.main import main
    from attnprobe.resources import data_path
    from attnprobe.studies.loop.layout import StudyLayout
    from tests.support.loop_capture import in_loop_folders

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        out = tmp_path / "study"
        assert main(["study", "interference", str(data_path("questions_loop.jsonl")), "--scaffold", "seed002",
                     "--policy", "none", "--policy", "mask:1", "--limit", "1", "--max-turns", "2",
                     "--generation-preset", "cpu", "--structured-actions", "--max-new-tokens", "40",
                     "--episodes-per-batch", "2", "--model", str(tiny_smol_folder), "--capture-in-loop",
                     "--layers", "0,1", "--bootstrap", "20", "--out", str(out), "--no-progress",
                     "--ray", "--ray-replicas", "1"]) == 0
    finally:
        ray.shutdown()
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    study = json.loads((out / "study.json").read_text())
    per = {s: sum(1 for _ in StudyLayout(out).calls_file(s).open()) for s in study["settings"]}
    calls = sum(per.values())
    assert calls >= 2 and len(in_loop_folders(out)) == calls
    assert study["captured_in_the_loop"] == {s: {"captured": n, "calls": n} for s, n in per.items()}
    assert f"capture in the loop: {calls} of {calls} recorded calls captured while generating, 0 left" in err, err
