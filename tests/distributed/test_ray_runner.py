"""``attnprobe run --ray`` (issue 28): the runner's job on two Ray replicas of the tiny random-weight SmolLM2
writes the records a local run writes (the calls, in another order, and the results, apart from their
times), and a rerun finds everything done. Starts a local Ray cluster: slow."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnprobe[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the replicas' thread count: same float summation order, the same greedy tokens
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    torch.set_num_threads(threads)


def records(out):
    calls = sorted(out.read_text().splitlines())  # replicas append in the order they finish
    results = sorted(({k: v for k, v in json.loads(x).items() if k != "seconds"}
                      for x in out.with_suffix(".results.ndjson").read_text().splitlines()),
                     key=lambda r: r["run_id"])
    return calls, results


def test_run_on_two_replicas_writes_the_records_of_a_local_run(cluster, tiny_smol_folder, tmp_path, capsys):
    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    argv = ["run", str(data_path("questions.jsonl")), "--limit", "3", "--preset", "baseline", "--manager-steps", "1",
            "--worker-steps", "1", "--max-new-tokens", "12", "--model", str(tiny_smol_folder), "--no-progress", "--out"]
    assert main([*argv, str(tmp_path / "local.jsonl")]) == 0
    ray_out = tmp_path / "ray.jsonl"
    assert main([*argv, str(ray_out), "--ray", "--ray-replicas", "2", "--ray-shard-tokens", "1"]) == 0
    assert f"run: 3 run, 0 already done, 0 failed -> {ray_out}" in capsys.readouterr().err
    local, on_ray = records(tmp_path / "local.jsonl"), records(ray_out)
    assert on_ray == local and len(local[1]) == 3 and local[0]
    assert {r["model"] for r in local[1]} == {"tiny-smollm2"}
    run = json.loads((tmp_path / "distributed.json").read_text())["runs"][-1]
    assert run["stage"] == "run baseline" and run["done"] == 3 and len(run["replicas"]) == 2
    assert main([*argv, str(ray_out), "--ray", "--ray-replicas", "2"]) == 0  # a rerun: nothing left
    assert f"run: 0 run, 3 already done, 0 failed -> {ray_out}" in capsys.readouterr().err
