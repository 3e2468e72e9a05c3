"""The suite runs one compute thread per process when other jobs hold the cores (issue 38: with two
OpenMP threads at load 8 on 2 cores, three non-slow tiny-model tests took 13-37 s; with one, 1.5-3.9 s)."""

from __future__ import annotations

from support.threads import THREADS_ENV, suite_threads


def test_one_thread_when_the_cores_are_taken_else_the_libraries_choice():
    assert suite_threads(8.0, 2, {}) == 1
    assert suite_threads(2.0, 2, {}) == 1
    assert suite_threads(0.5, 2, {}) is None  # an idle machine (CI): unchanged
    assert suite_threads(8.0, 2, {"OMP_NUM_THREADS": "2"}) is None  # the caller chose
    assert suite_threads(0.1, 2, {THREADS_ENV: "3"}) == 3
    assert suite_threads(9.0, 2, {THREADS_ENV: "0"}) is None



def test_the_suite_time_limit_is_registered(request):
    """The conftest registers the 20 s rule (an edit once left it unreachable after a return)."""
    assert request.config.pluginmanager.get_plugin("attnprobe-time-limit") is not None
