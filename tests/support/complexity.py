"""Complexity checks that hold on a busy machine (issue 38): how a function's cost *grows* between two input
sizes, never how long it takes. The cost is this process's CPU time (``time.process_time``: time waiting
for a core while other jobs run is not counted), the least of a few repeats, and the bound is a ratio with
a wide margin: 16 times the input may cost at most ``margin`` x 16 times as much (linear: about 16x;
quadratic: 256x)."""

from __future__ import annotations

import time
from collections.abc import Callable

FLOOR_S = 2e-4  # a small input's cost is taken as at least this (timer and call overhead)


def cpu_cost(fn: Callable, *args, repeat: int = 3) -> float:
    """The least CPU time of ``repeat`` calls of ``fn(*args)``."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn(*args)
        best = min(best, time.process_time() - t)
    return best


def growth(fn: Callable, make: Callable[[int], tuple], small: int, large: int, repeat: int = 3) -> float:
    """How many times more CPU ``fn(*make(large))`` costs than ``fn(*make(small))`` (inputs built untimed)."""
    small_args, large_args = make(small), make(large)
    return cpu_cost(fn, *large_args, repeat=repeat) / max(cpu_cost(fn, *small_args, repeat=repeat), FLOOR_S)


def assert_linear(fn: Callable, make: Callable[[int], tuple], small: int, large: int, margin: float = 4.0):
    """``fn`` grows at most ``margin`` times faster than linearly from ``small`` to ``large`` (sizes in any
    unit ``make`` takes; choose large = 16 x small so a quadratic cost, 256x, fails by far)."""
    ratio = growth(fn, make, small, large)
    bound = margin * large / small
    assert ratio < bound, f"{large / small:.0f}x the input cost {ratio:.0f}x the CPU time (linear: about " \
                          f"{large / small:.0f}x; bound {bound:.0f}x)"
    return ratio
