"""No test asserts an upper time limit (issue 38): on a busy machine ``parse_tool_calls`` took 1.559 s
against a 1.5 s limit and the linear-growth check failed twice. Complexity is checked by how CPU time grows
between sizes (support/complexity.py), a bound on work by counting it (what was tokenized, requests in
flight, ray.init not reached). Allowed: waiting for something with a deadline (``time.monotonic() <
deadline``) and lower bounds (a timeout that must not fire early). The browser test's first-draw budget
(tests/app/test_app_browser.py, a slow test with its own ``ATTNPROBE_APP_DRAW_LIMIT``) is the one measured
product budget and is not an ``assert`` on a clock expression."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"perf_counter", "monotonic", "time", "process_time", "perf_counter_ns", "monotonic_ns"}
DURATION_NAMES = {"elapsed", "seconds", "took", "duration", "t_large", "t_small"}


def _is_clock(node: ast.AST) -> bool:
    """An expression built from a clock reading or a variable that conventionally holds one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in CLOCKS \
                and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "time":
            return True
        if isinstance(sub, ast.Name) and sub.id in DURATION_NAMES:
            return True
    return False


def _is_deadline(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Name) and "deadline" in sub.id for sub in ast.walk(node))


def upper_time_limits(source: str) -> list[int]:
    """Line numbers of ``assert`` statements that bound a clock reading from above."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            operands = [cmp.left, *cmp.comparators]
            for left, op, right in zip(operands, cmp.ops, operands[1:]):
                small, large = (left, right) if isinstance(op, (ast.Lt, ast.LtE)) else \
                    (right, left) if isinstance(op, (ast.Gt, ast.GtE)) else (None, None)
                if small is not None and _is_clock(small) and not _is_deadline(large):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_the_detector_finds_upper_limits_and_allows_deadlines_and_lower_bounds():
    src = ("def f():\n"
           "    assert seconds < 1.5 and calls == []\n"
           "    assert time.perf_counter() - t0 < 10\n"
           "    assert 0.35 < seconds < 1.5\n"
           "    assert 2 * LATENCY > elapsed\n"
           "    assert time.monotonic() < deadline, 'timed out'\n"
           "    assert seconds > 0.35\n"
           "    assert len(calls) < 3\n")
    assert upper_time_limits(src) == [2, 3, 4, 5]


def test_no_test_asserts_an_upper_time_limit():
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        lines = upper_time_limits(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(TESTS))] = lines
    assert found == {}
