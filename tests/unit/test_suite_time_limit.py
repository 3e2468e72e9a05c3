"""The suite's time limit (support/time_limit.py) on generated test files: a non-slow test over the limit
fails the session and is named; a fast one, or a slow-marked one, passes."""

from __future__ import annotations

CONFTEST = """
from support.time_limit import register_time_limit

def pytest_configure(config):
    register_time_limit(config)
"""

TESTS = """
import time
import pytest

def test_fast():
    pass

def test_sleepy():
    time.sleep(0.3)

@pytest.mark.slow
def test_marked_slow():
    time.sleep(0.3)
"""


def _run(pytester, monkeypatch, limit, *args):
    monkeypatch.setenv("ATTNPROBE_TEST_TIME_LIMIT", limit)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long tests\n")
    pytester.makepyfile(test_gen=TESTS)
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def test_a_non_slow_test_over_the_limit_fails_the_session(pytester, monkeypatch):
    res = _run(pytester, monkeypatch, "0.1")
    res.assert_outcomes(passed=3)  # every test passed; the session fails on time alone
    assert res.ret == 1
    out = res.stdout.str()
    assert "1 test(s) without the 'slow' marker took over 0.1 s" in out
    assert "test_gen.py::test_sleepy" in out and "test_marked_slow" not in out.split("took over")[1]
    assert "test_fast" not in out.split("took over")[1]


def test_fast_tests_and_slow_marked_ones_pass(pytester, monkeypatch):
    res = _run(pytester, monkeypatch, "0.1", "-k", "fast or marked_slow")
    res.assert_outcomes(passed=2)
    assert res.ret == 0 and "took over" not in res.stdout.str()


def test_an_exempt_folder_is_not_timed(pytester, monkeypatch):
    """tests/vllm_backend runs in its own phase with its own budget (.ci/vllm.sh): not timed."""
    monkeypatch.setenv("ATTNPROBE_TEST_TIME_LIMIT", "0.1")
    pytester.makeconftest(CONFTEST.replace("register_time_limit(config)",
                                           "register_time_limit(config, exempt_dirs=('vllm_backend',))"))
    pytester.mkpydir("vllm_backend")
    pytester.makepyfile(**{"vllm_backend/test_engine": "import time\n\ndef test_engine():\n    time.sleep(0.3)\n",
                           "test_other": "import time\n\ndef test_other():\n    time.sleep(0.3)\n"})
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    over = res.stdout.str().split("took over")[1]
    assert res.ret == 1 and "test_other" in over and "test_engine" not in over


def test_a_one_off_cache_fill_in_a_fixture_is_not_charged(pytester, monkeypatch):
    """The bundled GGUF's conversion (once per cache, ~35 s in a fresh CI run) runs inside ``one_off``; the
    rest of the fixture and the test are still timed."""
    monkeypatch.setenv("ATTNPROBE_TEST_TIME_LIMIT", "0.2")
    pytester.makeconftest(CONFTEST + """
import time
import pytest
from support.time_limit import one_off

@pytest.fixture(scope="session")
def cache():
    with one_off():
        time.sleep(0.4)

@pytest.fixture
def slow_fixture():
    time.sleep(0.3)
""")
    pytester.makepyfile(test_gen="""
def test_uses_cache(cache):
    pass

def test_uses_slow_fixture(cache, slow_fixture):
    pass
""")
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    over = res.stdout.str().split("took over")[1]
    assert res.ret == 1 and "test_uses_slow_fixture" in over and "test_uses_cache" not in over


def test_the_limit_is_relaxed_by_the_variable_and_a_bad_value_is_one_line(pytester, monkeypatch):
    assert _run(pytester, monkeypatch, "5").ret == 0  # 0.3 s is under a 5 s limit
    assert _run(pytester, monkeypatch, "0").ret == 0  # 0 turns it off
    res = _run(pytester, monkeypatch, "soon")
    assert res.ret == 4 and "ATTNPROBE_TEST_TIME_LIMIT='soon' is not a number of seconds" in res.stderr.str()
