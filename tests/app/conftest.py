"""Fixtures for the app tests: real outputs of the bundled model, built once per session.

Set ATTNPROBE_APP_TEST_DATA=DIR to keep the built data in DIR and reuse it across runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.appdata import build


@pytest.fixture(scope="session")
def app_data(tmp_path_factory, request) -> Path:
    keep = os.environ.get("ATTNPROBE_APP_TEST_DATA")
    base = Path(keep) if keep else tmp_path_factory.getbasetemp() / "app_data"
    if not (base / "BUILT").is_file():
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        build(base, request.getfixturevalue("smol"))
    return base
