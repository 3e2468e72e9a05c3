"""`attnprobe capture` under faults (issue 13, items 3, 4, 5, 6, 11): the resume key holds the
trajectory's content hash and the settings; interrupted saves are recovered; corrupt metadata is
named and recaptured; variants are never mixed; a full disk and a SIGKILL lose nothing.

Hand-written 108-token trajectories, one layer, the decision query: each capture is small. The resume test
runs on the tiny random-weight SmolLM2 (support/tiny_model.py); the SIGKILL test on the bundled model.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from attnprobe import io as aio
from attnprobe.capture.models import ModelSpec
from attnprobe.cli.main import main

FAST = ["--layers", "0", "--queries", "decision", "--chunk-size", "64", "--no-progress"]
VOLATILE = {"capture_seconds"}


def _traj(i: int, fact: int | None = None) -> dict:
    fact = i * 7 if fact is None else fact
    return {"id": f"tiny-{i}", "task": f"Find fact {i}", "messages": [
        {"role": "system", "content": "You are a search agent."},
        {"role": "user", "content": f"Find fact number {i}."},
        {"role": "assistant", "content": "I will search.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": f"fact {i}"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"Fact {i} is {fact}."},
        {"role": "assistant", "content": f"The answer is {fact}."}]}


def _write(path, trajs) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in trajs))
    return str(path)


def _snapshot(out) -> dict:
    """Every visible result: its files' bytes, meta.json without wall times."""
    snap = {}
    for folder in sorted(out.iterdir()):
        if not folder.is_dir():
            continue
        files = {f.name: f.read_bytes() for f in sorted(folder.iterdir())}
        meta = json.loads(files.pop("meta.json"))
        snap[folder.name] = (files, {k: v for k, v in meta.items() if k not in VOLATILE})
    return snap


def _stderr_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [x for x in err.splitlines() if x.strip()]


def test_resume_key_recovery_and_variants(tiny_smol, tiny_smol_folder, tmp_path, capsys, monkeypatch):
    src = tmp_path / "tiny.jsonl"
    out = tmp_path / "out"
    model = ["--model", str(tiny_smol_folder)]
    args = ["capture", _write(src, [_traj(1), _traj(2), _traj(3)]), "--out", str(out), *FAST, *model]
    assert main(args) == 0
    first = _snapshot(out)
    assert sorted(first) == ["tiny-1", "tiny-2", "tiny-3"]
    meta = first["tiny-1"][1]
    assert meta["variant"] == f"tiny-smollm2/float32/transformers/{meta['weights_hash']}"
    assert len(meta["weights_hash"]) == 16 and len(meta["trajectory_hash"]) == 16
    capsys.readouterr()

    # the faults: tiny-2 edited under the same id, tiny-3's meta.json corrupt, tiny-1 caught between the two
    # renames of a replacement (only its old copy exists), and a half-built work folder
    _write(src, [_traj(1), _traj(2, fact=99), _traj(3)])
    (out / "tiny-3" / "meta.json").write_text('{"trajectory_id": ')
    os.replace(out / "tiny-1", out / ".tiny-1.old-zz9")
    (out / ".tiny-2.tmp-abc12345").mkdir()
    (out / ".tiny-2.tmp-abc12345" / "scores.safetensors").write_bytes(b"half")
    old_hash = first["tiny-2"][1]["trajectory_hash"]
    assert main(args) == 0
    err = _stderr_lines(capsys)
    assert f"attnprobe: {out}: restored tiny-1 from .tiny-1.old-zz9 (a replacement was interrupted)" in err
    assert f"attnprobe: {out}: removed .tiny-2.tmp-abc12345 (left by an interrupted write)" in err
    changed = [x for x in err if "changed since it was captured" in x]
    assert len(changed) == 1 and changed[0].startswith(f"attnprobe: trajectory 'tiny-2' changed since it was "
                                                       f"captured (content hash {old_hash} -> ")
    assert (f"attnprobe: unreadable capture metadata, recapturing 'tiny-3': {out / 'tiny-3' / 'meta.json'}, "
            "line 1: invalid JSON (Expecting value at column 19)") in err
    assert "attnprobe: resuming: 1 of 3 trajectories already captured in " + str(out) in err
    second = _snapshot(out)
    assert sorted(p.name for p in out.iterdir()) == ["tiny-1", "tiny-2", "tiny-3"]
    assert second["tiny-1"] == first["tiny-1"] and second["tiny-3"] == first["tiny-3"]  # same bytes
    assert second["tiny-2"][1]["trajectory_hash"] != old_hash
    assert second["tiny-2"][0]["scores.safetensors"] != first["tiny-2"][0]["scores.safetensors"]
    assert json.loads(second["tiny-2"][0]["text.json"])["text"].count("Fact 2 is 99.") == 1

    assert main(args) == 0
    assert f"attnprobe: resuming: 3 of 3 trajectories already captured in {out}" in _stderr_lines(capsys)

    # variants are never mixed: refused before any model is loaded, naming the setting that differs
    def refuse(spec):
        raise AssertionError("no model may be loaded for a refused resume")

    monkeypatch.setattr(ModelSpec, "load", refuse)
    assert main([*args, "--dtype", "bfloat16"]) == 2
    assert _stderr_lines(capsys) == [
        f"attnprobe: error: {out} holds captures made with other settings: {out / 'tiny-1' / 'meta.json'}: "
        "dtype was 'float32', now 'bfloat16' (and 2 more); use --force to redo or another --out"]
    tampered = json.loads((out / "tiny-3" / "meta.json").read_text())
    real_weights = tampered["weights_hash"]
    tampered["weights_hash"] = "0000000000000000"
    (out / "tiny-3" / "meta.json").write_text(json.dumps(tampered))
    assert main(args) == 2
    assert _stderr_lines(capsys) == [
        f"attnprobe: error: {out} holds captures made with other settings: {out / 'tiny-3' / 'meta.json'}: "
        f"weights fingerprint was 0000000000000000, now {real_weights} (the model files changed); "
        "use --force to redo or another --out"]
    monkeypatch.undo()

    # a full disk while replacing tiny-1 (--force): one line naming the file; the old result is intact
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(aio.os, "fsync", full)
    one = _write(tmp_path / "one.jsonl", [_traj(1)])
    assert main(["capture", one, "--out", str(out), "--force", *FAST, *model]) == 2
    err = _stderr_lines(capsys)
    where = re.escape(str(out / "tiny-1"))  # the first file fsynced: directory order
    assert re.fullmatch(rf"attnprobe: error: {where}/(meta\.json|text\.json|scores\.safetensors): "
                        r"no space left on device \(disk full\)", err[-1]), err
    assert all(x.startswith("attnprobe: ") for x in err)
    assert _snapshot(out)["tiny-1"] == first["tiny-1"]
    assert sorted(p.name for p in out.iterdir()) == ["tiny-1", "tiny-2", "tiny-3"]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from attnprobe import io as aio
    from attnprobe.cli.main import main

    victim, point = sys.argv[1], sys.argv[2]
    publish = aio.AtomicDir._publish

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    def killing_publish(self, tmp):
        if self.target.name != victim:
            return publish(self, tmp)
        if point == "before-rename":  # the new folder is complete under its temporary name
            die()
        aio.atomic._exchange = lambda a, b: False  # two renames, killed between them
        real = os.replace
        def replace(a, b):
            real(a, b)
            die()
        aio.os.replace = replace
        return publish(self, tmp)

    aio.AtomicDir._publish = killing_publish
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.slow
def test_sigkill_mid_save_then_rerun_equals_a_clean_run(tiny_smol_folder, tmp_path, capsys):
    fast = [*FAST, "--model", str(tiny_smol_folder)]  # the kill points, not the weights, are under test
    src = _write(tmp_path / "tiny.jsonl", [_traj(1), _traj(2), _traj(3)])
    clean, out = tmp_path / "clean", tmp_path / "out"
    assert main(["-q", "capture", src, "--out", str(clean), *fast]) == 0
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def killed_run(victim: str, point: str, *extra: str) -> None:
        proc = subprocess.run([sys.executable, "-c", KILLER, victim, point, "-q", "capture", src, "--out", str(out),
                               *fast, *extra], capture_output=True, text=True, env=env)
        assert proc.returncode == -9, proc.stderr[-2000:]

    killed_run("tiny-2", "before-rename")  # first run dies saving its second trajectory
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["tiny-1"]
    killed_run("tiny-1", "between-renames", "--force")  # a --force run dies with tiny-1 renamed away
    assert not (out / "tiny-1").exists()
    assert any(p.name.startswith(".tiny-1.old-") for p in out.iterdir())
    capsys.readouterr()
    assert main(["capture", src, "--out", str(out), *fast]) == 0
    err = _stderr_lines(capsys)
    assert any(x.startswith(f"attnprobe: {out}: restored tiny-1 from .tiny-1.old-") for x in err)
    assert "attnprobe: resuming: 1 of 3 trajectories already captured in " + str(out) in err
    assert sorted(p.name for p in out.iterdir()) == ["tiny-1", "tiny-2", "tiny-3"]  # each once, nothing hidden
    assert _snapshot(out) == _snapshot(clean)
