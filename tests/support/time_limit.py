"""The suite's own time limit: a test without the ``slow`` marker that takes over 20 s (setup + call) fails
the session (exit 1) and is named in the summary, so the main suite stays within CI's budget (issue 27).

ATTNPROBE_TEST_TIME_LIMIT (seconds; 0 turns it off) relaxes it, for a documented reason only, e.g. a
development machine known to be loaded by other jobs; CI keeps the default. Time spent inside
:func:`one_off` (a cache filled once per machine, like the bundled GGUF's conversion, about 35 s on a fresh
CI cache) is not charged to the test that happens to trigger it."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

_ONE_OFF = [0.0]  # seconds spent in one_off() since the last test report


@contextlib.contextmanager
def one_off():
    """Exclude the time inside from the current test's time (a once-per-machine cache fill, not the test)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _ONE_OFF[0] += time.perf_counter() - start

TIME_LIMIT_ENV = "ATTNPROBE_TEST_TIME_LIMIT"
DEFAULT_TIME_LIMIT = 20.0


class TimeLimit:
    """Sums setup + call time of each test without the ``slow`` marker (teardown is shared fixtures'
    cleanup) and fails the session, naming the tests, when one went over the limit."""

    def __init__(self, limit: float, exempt_dirs: tuple[str, ...] = ()):
        self.limit, self.durations, self.slow, self.exempt_dirs = limit, {}, set(), exempt_dirs

    def exempt(self, nodeid: str) -> bool:
        return any(part in self.exempt_dirs for part in nodeid.split("::")[0].split("/")[:-1])

    def pytest_collection_modifyitems(self, items):
        self.slow = {it.nodeid for it in items if it.get_closest_marker("slow")}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        spent, _ONE_OFF[0] = _ONE_OFF[0], 0.0
        if spent:  # on the report, so that it reaches the controller under pytest-xdist too
            outcome.get_result().user_properties.append(("one_off_seconds", spent))

    def pytest_runtest_logreport(self, report):
        if report.when in ("setup", "call") and report.nodeid not in self.slow \
                and "slow" not in getattr(report, "keywords", {}) and not self.exempt(report.nodeid):
            excused = sum(v for k, v in report.user_properties if k == "one_off_seconds")
            self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration - excused

    def over(self) -> list[tuple[float, str]]:
        return sorted(((d, n) for n, d in self.durations.items() if d > self.limit), reverse=True)

    def pytest_sessionfinish(self, session):
        if self.limit > 0 and self.over() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        over = self.over() if self.limit > 0 else []
        if over:
            terminalreporter.write_line(
                f"{len(over)} test(s) without the 'slow' marker took over {self.limit:g} s (setup + call); make "
                f"them faster (tiny models, scripted chats, shared fixtures) or mark them slow "
                f"({TIME_LIMIT_ENV} relaxes the limit):", red=True)
            for d, n in over:
                terminalreporter.write_line(f"  {d:.1f}s {n}", red=True)


def register_time_limit(config, exempt_dirs: tuple[str, ...] = ()) -> None:
    """``exempt_dirs``: folders (by name) whose tests are not timed, e.g. a phase with its own budget."""
    raw = os.environ.get(TIME_LIMIT_ENV, "").strip()
    try:
        limit = float(raw) if raw else DEFAULT_TIME_LIMIT
    except ValueError:
        raise pytest.UsageError(f"{TIME_LIMIT_ENV}={raw!r} is not a number of seconds") from None
    config.pluginmanager.register(TimeLimit(limit, exempt_dirs), "attnprobe-time-limit")
