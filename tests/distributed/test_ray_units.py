"""attnprobe.distributed without a running cluster: shards, token estimates, addresses, CLI options."""

from __future__ import annotations

import argparse
import os

import pytest

from attnprobe.distributed import (
    CHARS_PER_TOKEN,
    Cluster,
    add_cluster_options,
    check_address,
    cluster_from_args,
    estimate_tokens,
    fs_now,
    is_done,
    make_shards,
    written_by_job,
)
from attnprobe.errors import AttnprobeError
from attnprobe.trajectory.schema import Trajectory


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
    assert estimate_tokens(t) == 385 / CHARS_PER_TOKEN == 110
    assert estimate_tokens(t, max_tokens=50) == 50


def test_default_done_check_is_meta_json_with_the_given_values(tmp_path):
    out = tmp_path / "item"
    assert not is_done(out)
    out.mkdir()
    (out / "meta.json").write_text('{"cli_settings": {"chunk_size": 512}}')
    assert is_done(out)
    assert is_done(out, {"cli_settings": {"chunk_size": 512}})
    assert not is_done(out, {"cli_settings": {"chunk_size": 256}})


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
    assert written_by_job(new, start)
    assert not written_by_job(old, start)  # the driver asked for it again (--force, changed settings)
    assert not written_by_job(tmp_path / "missing", start)


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
    assert cluster_from_args(p.parse_args(["a.jsonl"])) is None
    args = p.parse_args(["a.jsonl", "--ray", "--ray-replicas", "3", "--ray-gpus-per-replica", "2"])
    assert cluster_from_args(args) == Cluster(address="local", replicas=3, gpus_per_replica=2.0)
    args = p.parse_args(["a.jsonl", "--ray=auto", "--ray-shard-tokens", "50000"])
    assert cluster_from_args(args) == Cluster(address="auto", shard_tokens=50000)
    args = p.parse_args(["--ray", "a.jsonl", "b.jsonl"])  # --ray swallowed a file name
    with pytest.raises(AttnprobeError, match="'a.jsonl' is not local"):
        cluster_from_args(args)
    with pytest.raises(ValueError, match="--ray-replicas must be >= 1"):
        cluster_from_args(p.parse_args(["a.jsonl", "--ray", "--ray-replicas", "0"]))


def test_an_unreachable_cluster_is_one_clear_error_fast():
    pytest.importorskip("ray", reason="needs the extra attnprobe[ray]")
    import time

    from attnprobe.distributed import connect

    t0 = time.perf_counter()
    with pytest.raises(AttnprobeError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:9: "):
        connect(Cluster(address="127.0.0.1:9"))
    assert time.perf_counter() - t0 < 10  # ray.init alone retries for minutes
