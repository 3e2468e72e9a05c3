"""The one batching rule both executors use: groups stay whole and count as one unit."""

from __future__ import annotations

from attnprobe.execution.job import WorkItem, batches


def keys(bs):
    return [[it.key for it in b] for b in bs]


def test_items_without_groups_are_cut_size_at_a_time_in_order():
    items = [WorkItem(key=str(i)) for i in range(5)]
    assert keys(batches(items, 2)) == [["0", "1"], ["2", "3"], ["4"]]
    assert keys(batches(items, 0)) == [["0"], ["1"], ["2"], ["3"], ["4"]]  # at least one per batch


def test_a_group_is_one_unit_whatever_the_batch_size():
    g = [WorkItem(key=f"a{i}", group="a") for i in range(3)] + [WorkItem(key="x")] + \
        [WorkItem(key=f"b{i}", group="b") for i in range(2)]
    assert keys(batches(g, 1)) == [["a0", "a1", "a2"], ["x"], ["b0", "b1"]]
    assert keys(batches(g, 2)) == [["a0", "a1", "a2", "x"], ["b0", "b1"]]
    assert keys(batches(g, 9)) == [["a0", "a1", "a2", "x", "b0", "b1"]]


def test_a_scattered_group_is_gathered_at_its_first_item():
    g = [WorkItem(key="a0", group="a"), WorkItem(key="x"), WorkItem(key="a1", group="a")]
    assert keys(batches(g, 1)) == [["a0", "a1"], ["x"]]
