"""Every study's job on the Ray executor (a local cluster, 2 CPU replicas, transformers, bundled model)
equals the same job on the local executor; a replica killed mid-run loses nothing and writes nothing
twice; a rerun does nothing.

One cluster and one pool of replicas for the whole module (Ray start ~5 s, a model load per replica).
Torch runs one thread in the replicas and here, so the results are bit-identical.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnprobe[ray]')")

from attnprobe.capture.job import CaptureJob, CaptureOptions  # noqa: E402
from attnprobe.distributed import RUN_FILE, Cluster, RayExecutor  # noqa: E402
from attnprobe.errors import AttnprobeError  # noqa: E402
from attnprobe.results.result import CaptureResult  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MAX_TOKENS = 256  # the shipped trajectories, truncated so the module stays fast
OPTS = {"queries": "reasoning+decision", "max_tokens": MAX_TOKENS, "truncate": True}


def capture_job(trajectories, out, **kw):
    return CaptureJob(out, trajectories, CaptureOptions(**OPTS), **kw)
VOLATILE = {"capture_seconds", "cli_settings"}  # the capture job records its settings for the resume check


@pytest.fixture(scope="module")
def cluster():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the replicas' thread count: same float summation order
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pool(cluster, tiny_smol_folder):
    # one item per shard so a kill always finds work left; no replacement for the killed replica
    # the tiny random-weight SmolLM2: replicas and the single process are compared bit for bit, on any weights
    with RayExecutor(str(tiny_smol_folder), cluster=Cluster(replicas=2, shard_tokens=1, max_replacements=0),
                     progress=False) as p:
        yield p


@pytest.fixture(scope="module")
def trajectories():
    from attnprobe.resources import SAMPLE_TRAJECTORIES, data_path
    from attnprobe.trajectory.schema import load_trajectories

    return [t for f in SAMPLE_TRAJECTORIES for t in load_trajectories(data_path(f))]


def _assert_same(got: CaptureResult, want: CaptureResult) -> None:
    for name in ("input_ids", "query_positions", "segment_attention", "layer_head_attention", "token_attention",
                 "offsets"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=f"{got.trajectory_id}: {name}")  # bit-identical
    assert got.segments == want.segments and got.queries == want.queries and got.text == want.text
    assert {k: v for k, v in got.meta.items() if k not in VOLATILE} == \
        {k: v for k, v in want.meta.items() if k not in VOLATILE}


def test_ibis_attention_on_two_replicas_equals_single_process(pool, tiny_smol, tmp_path):
    smol = tiny_smol
    from attnprobe.resources import data_path
    from attnprobe.studies.ibis.attention import run_attention
    from attnprobe.studies.ibis.items import load_items
    from attnprobe.studies.ibis.jobs import AttentionJob, capture_dir

    items = load_items(data_path("ibis_items.jsonl"))[:2]
    # batches of 2 pairs (each one sharing pass), 3 shards; the single process cuts the same batches
    counts = pool.run(AttentionJob(tmp_path / "dist", items, batch_size=2))
    assert counts == {"done_before": 0, "done": 6, "failed": 0}
    assert run_attention(smol, items, tmp_path / "single", progress=False, batch_size=2)["captured"] == 6
    for it in items:
        for fr in ("agentic", "observer", "direct"):
            got = CaptureResult.load(capture_dir(tmp_path / "dist", it.id, fr))
            _assert_same(got, CaptureResult.load(capture_dir(tmp_path / "single", it.id, fr)))
            assert got.meta["ibis"]["framing"] == fr and got.meta["ibis"]["item_id"] == it.id
    run = json.loads((tmp_path / "dist" / RUN_FILE).read_text())["runs"][-1]
    assert run["stage"] == "attention" and run["shards"] == 3 and run["written"] == 6
    assert [r["status"] for r in run["replicas"]] == ["idle", "idle"] and run["replicas_lost"] == 0
    assert all(r["torch_threads"] == 1 and r["load_seconds"] > 0 for r in run["replicas"])
    # per-replica throughput (a replica that loaded late may have found no work left)
    assert sum(r["items"] for r in run["replicas"]) == 6
    assert all(r["items_per_minute"] > 0 and r["tokens"] > 0 for r in run["replicas"] if r["items"])


def test_ibis_behaviour_on_two_replicas_equals_single_process(pool, tiny_smol, tmp_path):
    """Decisions come back to the driver, which alone appends decisions.jsonl; greedy text and the
    forced-choice log-probabilities equal the single-process run (same thread count)."""
    smol = tiny_smol
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.resources import data_path
    from attnprobe.studies.ibis.behaviour import BehaviourBackend, read_decisions
    from attnprobe.studies.ibis.items import load_items
    from attnprobe.studies.ibis.jobs import BehaviourJob, run_behaviour

    items = load_items(data_path("ibis_items.jsonl"))[:2]
    kw = {"max_new_tokens": 24, "protocol": "matched"}
    counts = pool.run(BehaviourJob(tmp_path / "dist", items, batch_size=3, **kw))
    assert counts == {"done_before": 0, "done": 6, "failed": 0}
    single = run_behaviour(BehaviourBackend(TransformersChat(smol)), items, tmp_path / "single", progress=False,
                           batch_size=3, **kw)
    assert single["decided"] == 6

    def by_pair(folder):
        return {(r["item_id"], r["framing"]): {k: v for k, v in r.items() if k != "seconds"}
                for r in read_decisions(folder / "decisions.jsonl")}

    got, want = by_pair(tmp_path / "dist"), by_pair(tmp_path / "single")
    assert got.keys() == want.keys() and len(got) == 6
    for k in want:
        assert got[k] == want[k], k
    assert any(r["forced_choice"] for r in got.values())  # the matched protocol has a forced choice
    lines = (tmp_path / "dist" / "decisions.jsonl").read_text(encoding="utf-8").split("\n")
    assert len([x for x in lines if x]) == 6  # each decision written once
    # a rerun asks no replica
    assert pool.run(BehaviourJob(tmp_path / "dist", items, batch_size=3, **kw)) == {
        "done_before": 6, "done": 0, "failed": 0}


def test_counterfactual_on_two_replicas_equals_single_process(pool, tiny_smol, tmp_path):
    """Step folders written by the replicas equal the single-process run bit for bit (arrays) and in
    every recorded number; next actions included; a rerun does nothing."""
    smol = tiny_smol
    from safetensors.numpy import load_file
    from support.cfrun import run_counterfactuals

    from attnprobe.agents.policies import parse_policy
    from attnprobe.counterfactual.job import CounterfactualJob, counterfactual_settings
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.counterfactual.steps import plan_steps
    from attnprobe.resources import data_path
    from attnprobe.trajectory.schema import load_trajectories

    trajs = load_trajectories(data_path("reasoning_content.jsonl"))[:2]
    opts = RunOptions(actions=True, max_new_tokens=8)
    specs = ["mask:1", "ircot:oq"]
    kw = {"min_past": 2, "batch_size": 1}

    def job():
        names, steps = plan_steps(trajs, specs, min_past=2)
        settings = pool.call(counterfactual_settings, names, opts)
        return CounterfactualJob(tmp_path / "dist", steps, specs, settings, opts, batch_size=1)

    counts = pool.run(job())
    # steps at turns 2, 3, 4 of each trajectory; a trajectory's steps are one batch, one shard each
    assert counts == {"done_before": 0, "done": 6, "failed": 0}
    assert json.loads((tmp_path / "dist" / "distributed.json").read_text(encoding="utf-8"))["runs"][0]["shards"] == 2

    single = run_counterfactuals(smol, trajs, [parse_policy(p) for p in specs], tmp_path / "single", opts=opts, **kw)
    assert single["done"] == 6
    folders = sorted(p.parent.relative_to(tmp_path / "single") for p in (tmp_path / "single").glob("*/*/step_*/record.json"))
    assert len(folders) == 12
    for rel in folders:
        a, b = tmp_path / "dist" / rel, tmp_path / "single" / rel
        ra, rb = (json.loads((x / "record.json").read_text(encoding="utf-8")) for x in (a, b))
        assert ra == rb, rel
        for part in ("masses.safetensors", "original/scores.safetensors", "counterfactual/scores.safetensors"):
            fa, fb = load_file(str(a / part)), load_file(str(b / part))
            assert fa.keys() == fb.keys()
            for k in fb:
                np.testing.assert_array_equal(fa[k], fb[k], err_msg=f"{rel}/{part}:{k}")
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "dist").rglob("record.json")}
    assert pool.run(job()) == {"done_before": 6, "done": 0, "failed": 0}
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "dist").rglob("record.json")} == stamps


def test_a_function_runs_on_a_replica_and_its_exception_comes_back_as_itself(pool):
    assert pool.call(getattr, "name") == "tiny-smollm2"  # getattr(loaded_model, "name")
    with pytest.raises(AttributeError, match="no_such_field"):
        pool.call(getattr, "no_such_field")


def test_a_job_of_no_known_study_runs_on_ray_as_it_runs_locally(pool, tmp_path):
    """The executors know no study: a job defined here (the model's name written per item) runs on
    the replicas with no edit in attnprobe.distributed, and its collected results equal a local run."""
    import support.jobs
    from support.jobs import NameJob

    from attnprobe.execution import LocalExecutor

    # the replicas cannot import the tests' support package: ship the job's class by value
    ray.cloudpickle.register_pickle_by_value(support.jobs)

    ray_job, local_job = NameJob(tmp_path / "ray", 5), NameJob(tmp_path / "local", 5)
    assert pool.run(ray_job) == {"done_before": 0, "done": 5, "failed": 1}
    assert LocalExecutor(lambda: type("M", (), {"name": "tiny-smollm2"})(), progress=False).run(
        local_job) == {"done_before": 0, "done": 5, "failed": 1}
    assert sorted(ray_job.collected) == sorted(local_job.collected) == [f"{i}:tiny-smollm2" for i in
                                                                        (0, 1, 2, 4, 5)]
    for d in ("ray", "local"):
        errors = [json.loads(x) for x in (tmp_path / d / "errors.jsonl").read_text().splitlines()]
        assert [(e["stage"], e["i"], e["error"]) for e in errors] == [("name", 3, "ValueError: item 3 is bad")]
    assert pool.run(NameJob(tmp_path / "ray", 5))["done_before"] == 5


def test_a_replica_killed_mid_run_loses_nothing_and_writes_nothing_twice(pool, tiny_smol, tiny_smol_folder, trajectories,
                                                                          tmp_path):
    smol, tiny = tiny_smol, str(tiny_smol_folder)  # the job names the replicas' model (its resume check)
    from attnprobe.capture.api import capture_many
    from attnprobe.io import safe_name

    out = tmp_path / "dist"
    box: dict = {}
    job = threading.Thread(target=lambda: box.update(counts=pool.run(capture_job(trajectories, out, model=tiny))))
    job.start()
    victim = pool.slots[0]
    while not any(out.glob("*/meta.json")) and job.is_alive():
        time.sleep(0.02)
    finished_at_kill = len(list(out.glob("*/meta.json")))
    ray.kill(victim.handle)
    job.join(timeout=600)
    assert not job.is_alive()
    assert finished_at_kill < len(trajectories)  # the kill happened mid-run
    assert box["counts"] == {"done_before": 0, "done": 4, "failed": 0}

    run = json.loads((out / RUN_FILE).read_text())["runs"][-1]
    assert run["replicas_lost"] == 1 and victim.status == "died"
    assert run["written_twice"] == 0
    # every item once: written and reported, or written by the killed replica just before it died
    assert run["written"] + run["written_before_a_retry"] == 4
    assert sorted(p.name for p in out.iterdir()) == sorted([RUN_FILE] + [safe_name(t.id) for t in trajectories])

    for w in capture_many(smol, trajectories, **OPTS, share_prefixes=False):  # the single-process capture, saved the same way
        single = w.save(tmp_path / "single" / safe_name(w.trajectory_id))
        _assert_same(CaptureResult.load(out / safe_name(w.trajectory_id)), CaptureResult.load(single))

    # a rerun does nothing: no replica is asked, no file is touched
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*")}
    assert pool.run(capture_job(trajectories, out, model=tiny)) == {"done_before": 4, "done": 0, "failed": 0}
    with RayExecutor("default", cluster=Cluster(address="127.0.0.1:9"), progress=False) as unreachable:
        assert unreachable.run(capture_job(trajectories, out, model=tiny)) == {"done_before": 4, "done": 0, "failed": 0}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*")} == stamps
    runs = json.loads((out / RUN_FILE).read_text())["runs"]
    assert [r["shards"] for r in runs[1:]] == [0, 0]


def test_no_node_with_the_requested_gpus_is_one_clear_error(cluster, trajectories, tmp_path):
    with RayExecutor("default", cluster=Cluster(gpus_per_replica=1), progress=False) as p:
        with pytest.raises(AttnprobeError, match=r"no node of the Ray cluster can host one replica: each needs "
                                                 r"1 CPU, 1 GPU \(cluster: 1 node\(s\), 2 CPU, 0 GPU\)"):
            p.run(capture_job(trajectories[:1], tmp_path))
    assert not any(tmp_path.glob("*/meta.json"))


def test_a_model_no_replica_can_load_fails_with_its_own_error(cluster, trajectories, tmp_path):
    from attnprobe.errors import ModelNotFoundError

    with RayExecutor(str(tmp_path / "missing.gguf"), cluster=Cluster(replicas=1, cpus_per_replica=0),
                     progress=False) as p:
        with pytest.raises(ModelNotFoundError, match="GGUF file not found: .*missing.gguf"):
            p.run(capture_job(trajectories[:1], tmp_path / "out", model=str(tmp_path / "missing.gguf")))
        assert [s.status for s in p.slots] == ["failed to load"]


def test_one_bad_item_fails_alone_in_a_shard_and_a_retry_skips_what_the_job_wrote(tiny_smol, tiny_smol_folder, trajectories,
                                                                                   tmp_path):
    """The replica's shard logic, in this process (no Ray needed for it)."""
    from attnprobe.capture.job import CaptureJob, CaptureOptions
    from attnprobe.distributed import Replica, fs_now
    from attnprobe.trajectory.schema import Trajectory

    replica = Replica(str(tiny_smol_folder), "transformers", "float32", {}, 1)  # the cached model: no second load
    tiny = Trajectory(id="tiny", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])
    job = CaptureJob(tmp_path, [trajectories[0], tiny], CaptureOptions(queries="decision", max_tokens=120),
                     model=str(tiny_smol_folder))
    shard = [job.items()]  # one batch of both: it fails, then each item runs alone
    start = fs_now(tmp_path)
    first = replica.run(job, shard, start)
    assert [r["status"] for r in first] == ["failed", "written"]
    assert first[0]["error_type"] == "TooLongError" and "refused before tokenizing" in first[0]["error"]
    assert CaptureResult.load(tmp_path / "tiny").meta["cli_settings"]["max_tokens"] == 120
    # the same shard again in the same job (a retry): the written item is skipped, the failed one retried
    assert [r["status"] for r in replica.run(job, shard, start)] == ["failed", "skipped"]
    # a later job (start after the write) redoes it: the driver decided it needs work
    assert [r["status"] for r in replica.run(job, [shard[0][1:]], fs_now(tmp_path) + 1)] == ["written"]
