"""Fixtures for the app tests: real outputs, built once per session: of the tiny random-weight SmolLM2
(support/tiny_model.py; the bundled tokenizer and layout) for the page tests, of the bundled model for the
browser (``bundled_app_data``, slow).

Set ATTNPROBE_APP_TEST_DATA=DIR to keep the built data in DIR/tiny and DIR/bundled and reuse it across runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.appdata import build
from support.time_limit import one_off


def _built(tmp_path_factory, name: str, loaded, model_args: tuple[str, ...], studies: bool = False) -> Path:
    keep = os.environ.get("ATTNPROBE_APP_TEST_DATA")
    base = (Path(keep) if keep else tmp_path_factory.getbasetemp() / "app_data") / name
    if not (base / "BUILT").is_file():
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        with one_off():  # built once per session for every page test: not charged to the first one (20 s rule)
            build(base, loaded, model_args, studies)
    return base


@pytest.fixture(scope="session")
def app_data(tmp_path_factory, tiny_smol, tiny_smol_folder) -> Path:
    return _built(tmp_path_factory, "tiny", tiny_smol, ("--model", str(tiny_smol_folder)))


@pytest.fixture(scope="session")
def bundled_app_data(tmp_path_factory, request) -> Path:
    return _built(tmp_path_factory, "bundled", request.getfixturevalue("smol"), (), studies=True)


def pytest_terminal_summary(terminalreporter):
    """The app pages' first-draw times in every run's summary (CI too: a passing test's print is captured)."""
    from support.appdata import FIRST_DRAWS

    for line in FIRST_DRAWS:
        terminalreporter.write_line(f"app {line}")
