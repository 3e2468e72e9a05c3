"""attnprobe.distributed without a running cluster: shards, token estimates, done-checks, addresses, CLI options."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

from attnprobe.cli.options import add_cluster_options, cluster_options
from attnprobe.distributed import Cluster, check_address, fs_now, make_shards
from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import written_since
from attnprobe.trajectory.schema import CHARS_PER_TOKEN, Trajectory


def test_shards_are_filled_first_fit_decreasing_and_handed_out_largest_first():
    sizes = [100, 10, 10, 10, 50, 50, 120]
    # 120 > target: alone; 100 alone (nothing else fits); 50+50; 10+10+10
    assert make_shards(sizes, 100) == [[6], [0], [4, 5], [1, 2, 3]]
    assert make_shards(sizes, 1) == [[6], [0], [4], [5], [1], [2], [3]]
    assert make_shards(sizes, 10_000) == [[0, 1, 2, 3, 4, 5, 6]]
    assert make_shards([], 5) == []
    with pytest.raises(ValueError):
        make_shards([1], 0)


def test_long_trajectories_do_not_pile_onto_one_shard():
    # one long item and many short ones: by count they would split 4/4; by tokens the long one is alone
    sizes = [800] + [100] * 7
    shards = make_shards(sizes, 800)
    assert shards == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert [sum(sizes[i] for i in s) for s in shards] == [800, 700]


def test_token_estimate_is_message_json_length_over_the_constant():
    t = Trajectory(id="x", messages=[{"role": "user", "content": "a" * 352}])
    # json: [{"role": "user", "content": "aaa..."}] = 33 + 352 characters
    assert t.estimated_tokens() == 385 / CHARS_PER_TOKEN == 110
    assert t.estimated_tokens(cap=50) == 50


def test_capture_done_check_is_settings_weights_and_content(tmp_path):
    from attnprobe.capture.job import CaptureJob, CaptureOptions

    t = Trajectory(id="a/b", messages=[{"role": "user", "content": "hi"}])
    job = CaptureJob(tmp_path, [t], CaptureOptions(chunk_size=512), weights="w1")
    item = job.items()[0]
    assert not job.done(item) and job.conflicts() == []
    folder = job.folder(t)
    folder.mkdir()
    meta = {"cli_settings": job.settings, "weights_hash": "w1", "trajectory_hash": t.content_hash()}
    (folder / "meta.json").write_text(json.dumps(meta))
    job = CaptureJob(tmp_path, [t], CaptureOptions(chunk_size=512), weights="w1")  # a run decides once
    assert not job.done(item) and job.conflicts() == []  # no scores.safetensors: not a finished capture
    from safetensors.numpy import save_file

    save_file({"token_attention": np.zeros((1, 2), np.float32)}, str(folder / "scores.safetensors"))
    job = CaptureJob(tmp_path, [t], CaptureOptions(chunk_size=512), weights="w1")
    assert job.done(item) and job.conflicts() == []
    other = CaptureJob(tmp_path, [t], CaptureOptions(chunk_size=256), weights="w1")
    assert not other.done(item) and other.conflicts() == [
        f"{folder / 'meta.json'}: chunk_size was 512, now 256"]
    auto = CaptureJob(tmp_path, [t], CaptureOptions(), weights="w1")  # the chunk chosen for the device
    assert auto.done(item) and auto.conflicts() == []  # resumes a folder made with any chunk (float rounding only)
    assert CaptureJob(tmp_path, [t], CaptureOptions(chunk_size=512), weights="w2").conflicts()[0].endswith(
        "weights fingerprint was w1, now w2 (the model files changed)")
    changed = Trajectory(id="a/b", messages=[{"role": "user", "content": "hello"}])
    assert not CaptureJob(tmp_path, [changed], CaptureOptions(chunk_size=512), weights="w1").done(item.__class__(
        key="a/b", data=changed))


def test_a_retry_skips_only_what_this_job_wrote(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "meta.json").write_text("{}")
    os.utime(old / "meta.json", (1_000, 1_000))  # written long before the job
    start = fs_now(tmp_path)
    assert start > 1_000 and not list(tmp_path.glob(".job-clock*"))
    new = tmp_path / "new"
    new.mkdir()
    (new / "meta.json").write_text("{}")
    assert written_since(new / "meta.json", start)
    assert not written_since(old / "meta.json", start)  # the driver asked for it again (--force, changed settings)
    assert not written_since(tmp_path / "missing", start)
    assert written_since(old / "meta.json", None)


@pytest.mark.parametrize("text", [None, "local", "auto", "10.0.0.5:6379", "ray://head.example:10001", "[::1]:6379"])
def test_valid_addresses(text):
    assert check_address(text) == text


@pytest.mark.parametrize("text", ["runs/a.jsonl", "head", "ray://head"])
def test_an_address_that_is_a_file_name_is_refused_with_the_fix(text):
    with pytest.raises(AttnprobeError, match="write --ray=ADDRESS"):
        check_address(text)


def test_cluster_options_parse_into_a_cluster():
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    add_cluster_options(p)
    assert cluster_options(p.parse_args(["a.jsonl"])) is None
    args = p.parse_args(["a.jsonl", "--ray", "--ray-replicas", "3", "--ray-gpus-per-replica", "2"])
    assert cluster_options(args) == Cluster(address="local", replicas=3, gpus_per_replica=2.0)
    args = p.parse_args(["a.jsonl", "--ray=auto", "--ray-shard-tokens", "50000"])
    assert cluster_options(args) == Cluster(address="auto", shard_tokens=50000)
    args = p.parse_args(["--ray", "a.jsonl", "b.jsonl"])  # --ray swallowed a file name
    with pytest.raises(AttnprobeError, match="'a.jsonl' is not local"):
        cluster_options(args)
    with pytest.raises(SystemExit):  # refused while parsing
        p.parse_args(["a.jsonl", "--ray", "--ray-replicas", "0"])


def test_an_unreachable_cluster_is_one_clear_error_fast(monkeypatch):
    """Refused by a socket probe before ray.init, which alone retries for minutes (checked by ray.init not
    being reached, not by a time limit: issue 38)."""
    ray = pytest.importorskip("ray", reason="needs the extra attnprobe[ray]")
    from attnprobe.distributed import connect

    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail(f"ray.init reached with {kw}"))
    with pytest.raises(AttnprobeError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:9: "):
        connect(Cluster(address="127.0.0.1:9"))
