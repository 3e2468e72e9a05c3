"""Which trajectories `capture` prefills together: the calls of one recorded run, in extension order."""

from __future__ import annotations

from attnprobe.capture import job as cj
from attnprobe.capture.job import CaptureJob, CaptureOptions, sharing_groups
from attnprobe.execution.job import batches
from attnprobe.trajectory.schema import Trajectory

SYS = {"role": "system", "content": "You search."}


def call_chain(q: str, n: int) -> list[Trajectory]:
    """A recorded run's calls: call k+1's messages extend call k's."""
    msgs = [SYS, {"role": "user", "content": q}]
    out = []
    for k in range(n):
        msgs = [*msgs, {"role": "assistant", "content": f"{q} step {k}"}]
        out.append(Trajectory(id=f"{q}#{k}", messages=list(msgs)))
        msgs = [*msgs, {"role": "user", "content": f"obs {k}"}]
    return out


def test_calls_of_one_run_form_a_group_in_extension_order_and_loners_stay_alone():
    a, b = call_chain("qa", 3), call_chain("qb", 2)
    lone = Trajectory(id="lone", messages=[SYS, {"role": "user", "content": "other"}])
    got = sharing_groups([a[2], lone, b[1], a[0], a[1], b[0]])
    assert [t.id for t, _ in got] == ["qa#0", "qa#1", "qa#2", "lone", "qb#0", "qb#1"]
    groups = [g for _, g in got]
    assert groups[0] == groups[1] == groups[2] is not None
    assert groups[3] is None
    assert groups[4] == groups[5] not in (None, groups[0])


def test_a_family_is_cut_into_groups_of_the_limit(monkeypatch, tmp_path):
    monkeypatch.setattr(cj, "GROUP_LIMIT", 2)
    chain = call_chain("q", 5)
    got = sharing_groups(chain)
    assert [g for _, g in got][:4] == [got[0][1], got[0][1], got[2][1], got[2][1]] and got[0][1] != got[2][1]
    assert got[4][1] is None  # a group of one is captured alone
    job = CaptureJob(tmp_path, chain, CaptureOptions(), weights="w")
    assert [[it.key for it in b] for b in batches(job.items(), 1)] == [["q#0", "q#1"], ["q#2", "q#3"], ["q#4"]]
    off = CaptureJob(tmp_path, chain, CaptureOptions(share_prefixes=False), weights="w")
    assert all(it.group is None for it in off.items())
