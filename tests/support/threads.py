"""One compute thread per test process on a busy machine (issue 38). With other jobs on every core, torch's
OpenMP threads wait on each other at every operation: a tiny-model capture took 27.9 s with 2 threads at
load 8 on 2 cores and 3.8 s with one (tests/reference/test_prefix_sharing_bundled.py; the IBIS stop-at-call
test 13.4 s -> 1.5 s). On an idle machine (CI) nothing changes.

ATTNPROBE_TEST_THREADS=N fixes the count whatever the load (0: leave the libraries' own choice)."""

from __future__ import annotations

import os
import sys

THREADS_ENV = "ATTNPROBE_TEST_THREADS"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def suite_threads(load: float, cpus: int, env: dict[str, str]) -> int | None:
    """The thread count the suite should use, or None to leave it: ATTNPROBE_TEST_THREADS if set, else 1
    when the 1-minute load average is at least the number of cores (the cores are taken), unless the
    caller already chose with OMP_NUM_THREADS."""
    if env.get(THREADS_ENV, "").strip():
        n = int(env[THREADS_ENV])
        return n or None
    if "OMP_NUM_THREADS" in env:
        return None
    return 1 if load >= cpus else None


def limit_threads() -> int | None:
    """Apply :func:`suite_threads` to this process (torch, if already imported) and, through the
    environment, to every subprocess a test starts (CLI runs, servers)."""
    n = suite_threads(os.getloadavg()[0], os.cpu_count() or 1, dict(os.environ))
    if n is None:
        return None
    for var in THREAD_VARS:
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return n
