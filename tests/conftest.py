"""Shared fixtures (the bundled model and its tiny random-weight twin are loaded once per test session), and
the suite's own time limit: a test without the ``slow`` marker that takes over 20 s fails the session."""

from __future__ import annotations

import pytest
from support.paths import SAMPLE_FILES, TRAJ_DIR
from support.threads import limit_threads
from support.time_limit import one_off, register_time_limit

pytest_plugins = ("pytester",)  # tests/unit/test_suite_time_limit.py runs the time limit on generated files


def pytest_configure(config):
    # one compute thread per process when other jobs hold the cores (support/threads.py: 7x faster there)
    config.attnprobe_threads = limit_threads()
    # tests/vllm_backend is its own CI phase (.ci/vllm.sh, its own venv and budget; an engine starts in minutes)
    register_time_limit(config, exempt_dirs=("vllm_backend",))


def pytest_report_header(config):
    n = getattr(config, "attnprobe_threads", None)
    return f"compute threads per process: {n} (tests/support/threads.py)" if n else None


@pytest.fixture(scope="session")
def bundled_folder():
    """The bundled GGUF converted to a Hugging Face folder: once per cache (about 35 s when ATTNPROBE_CACHE is
    empty, as in a fresh CI run; a hash check after), not charged to the suite's 20 s limit."""
    from attnprobe.model_convert import converted_folder

    with one_off():
        return converted_folder("default", progress=False)


@pytest.fixture(scope="session")
def smol(bundled_folder):
    import attnprobe

    return attnprobe.load_model("default")


@pytest.fixture(scope="session")
def tiny_smol_folder(tmp_path_factory, bundled_folder):
    """The tiny random-weight SmolLM2 (support/tiny_model.py) as a model folder, for ``--model``."""
    from support.tiny_model import write_tiny_smol

    return write_tiny_smol(tmp_path_factory.mktemp("tiny") / "tiny-smollm2")  # recorded model name: tiny-smollm2


@pytest.fixture(scope="session")
def tiny_smol(tiny_smol_folder):
    """The tiny SmolLM2 loaded as any local folder is (same backend, hooks and cache as ``smol``)."""
    import attnprobe

    return attnprobe.load_model(str(tiny_smol_folder))


@pytest.fixture(scope="session")
def samples():
    import attnprobe

    out = {}
    for name in SAMPLE_FILES:
        for traj in attnprobe.load_trajectories(TRAJ_DIR / name):
            out[traj.id] = traj
    return out


@pytest.fixture(autouse=True)
def _cli_logging_restored():
    """A test that runs ``attnprobe.cli.main`` sets up the CLI's log handlers (no propagation to the
    root logger); restore the loggers after it so that later tests' ``caplog`` sees their records."""
    import logging

    names = ("attnprobe", "attnprobe_hooks", "attnprobe_app")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in names}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate

