"""No file outside an output folder is written or followed (issue 27): a received study folder with a
symlinked lock, log, attention.md, capture/ or history/ makes us neither overwrite nor read the link's
target; and a truncated scores.safetensors is not a finished capture or counterfactual step. Hand-built
folders (tests/support/studydir.py), no model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.studydir import BASE, OTHER, make_study, toy_capture

from attnprobe import io as aio
from attnprobe.errors import AttnprobeError
from attnprobe.studies.loop.attention import histories, read_study
from attnprobe.studies.loop.attention_study import run_attention  # (imports the capture stack once)
from attnprobe.trajectory.schema import Trajectory

SECRET = "precious, not ours\n"


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside every output folder that no test may change or read into a result."""
    path = tmp_path / "elsewhere" / "secret.txt"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


# ------------------------------------------------------------------ the folder helper
def test_inside_refuses_symlinks_and_dotdot_below_the_folder_only(tmp_path, secret):
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    assert aio.inside(out, out / "a" / "not-yet" / "x.json") == out / "a" / "not-yet" / "x.json"
    link_parent = tmp_path / "linked-out"
    link_parent.symlink_to(out)  # the folder the user named may itself be a link: only what is below counts
    assert aio.inside(link_parent, link_parent / "a") == link_parent / "a"
    (out / "a" / "cap").symlink_to(secret.parent)
    with pytest.raises(aio.OutsideFolder, match=r"/out/a/cap: is a symlink inside .*/out; symlinks in an output "
                                                r"folder are not followed"):
        aio.inside(out, out / "a" / "cap" / "x" / "meta.json")
    with pytest.raises(aio.OutsideFolder, match=r"leads out of"):
        aio.inside(out, out / "a" / ".." / ".." / "elsewhere")
    with pytest.raises(aio.OutsideFolder, match=r"not inside"):
        aio.inside(out, secret)


# ------------------------------------------------------------------ writers
def test_a_symlinked_lock_is_refused_and_its_target_kept(tmp_path, secret):
    """Main opened the lock with O_CREAT and no O_NOFOLLOW: the target was truncated and overwritten with
    the owner JSON (pid, host, command)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / aio.LOCK_NAME).symlink_to(secret)
    with pytest.raises(AttnprobeError, match=r"\.attnprobe\.lock: the lock file of the study folder is a symlink; "
                                             r"not followed \(delete it\)$"):
        with aio.hold_dir_lock(out, "study folder"):
            pass
    assert secret.read_text() == SECRET
    (out / ".results.jsonl.lock").symlink_to(secret)  # the file locks beside an output file too
    with pytest.raises(AttnprobeError, match=r"is a symlink; not followed"):
        with aio.hold_file_lock(out / "results.jsonl", "results"):
            pass
    assert secret.read_text() == SECRET
    os.mkfifo(out / ".fifo.lock")  # neither blocks nor is taken as a lock
    with pytest.raises(AttnprobeError, match=r"\.fifo\.lock: the lock file of the x is a FIFO \(named pipe\), "
                                             r"not a regular file"):
        with aio.hold_lock(out / ".fifo.lock", "x"):
            pass
    with aio.hold_lock(out / ".ok.lock", "x"):  # a plain lock still works, and is removed on release
        assert json.loads((out / ".ok.lock").read_text())["pid"] == os.getpid()
    assert not (out / ".ok.lock").exists()


def test_study_attention_with_a_symlinked_lock_leaves_the_target_alone(tmp_path, secret):
    """The lock `study attention` (and `study interference`, `run`) takes on the study folder: refused before
    the executor (None) is used."""
    out = make_study(tmp_path / "study")
    (out / aio.LOCK_NAME).symlink_to(secret)
    with pytest.raises(AttnprobeError, match=r"is a symlink; not followed"):
        run_attention(None, out, model=SimpleNamespace(spec="toy", backend="transformers", dtype="float32"))
    assert secret.read_text() == SECRET


def test_appends_never_go_through_a_symlink(tmp_path, secret):
    out = tmp_path / "out"
    out.mkdir()
    (out / "errors.jsonl").symlink_to(secret)
    with pytest.raises(AttnprobeError, match=r"errors\.jsonl: is a symlink; not followed"):
        aio.log_error(out / "errors.jsonl", "capture", {"item": "x"}, ValueError("boom"))
    assert secret.read_text() == SECRET
    # a torn tail's backup beside the file: a symlinked .torn is not appended to either
    (out / "log.jsonl").write_bytes(b'{"a": 1}\n{"a": 2')
    (out / "log.jsonl.torn").symlink_to(secret)
    with pytest.raises(OSError, match=r"log\.jsonl"):
        aio.append_jsonl(out / "log.jsonl", {"a": 3})
    assert secret.read_text() == SECRET


def test_atomic_writes_replace_a_symlink_never_its_target(tmp_path, secret):
    """Temp file + rename replaces the link itself (verified, unchanged); a folder written by AtomicDir over
    a symlinked folder replaces the link and leaves no hidden link behind (main kept it as .x.tmp-*)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "study.md").symlink_to(secret)
    aio.atomic_write_text(out / "study.md", "new\n")
    assert secret.read_text() == SECRET
    assert not (out / "study.md").is_symlink() and (out / "study.md").read_text() == "new\n"
    (out / "cap").symlink_to(secret.parent)
    toy_capture("t").save(out / "cap")
    assert sorted(p.name for p in secret.parent.iterdir()) == ["secret.txt"]
    assert not (out / "cap").is_symlink() and (out / "cap" / "meta.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["cap", "study.md"]


# ------------------------------------------------------------------ readers of a study folder
def test_a_symlinked_attention_md_is_not_copied_into_study_md(tmp_path, secret):
    from attnprobe.studies.loop.attention_report import HEADING, with_attention

    out = tmp_path / "study"
    out.mkdir()
    (out / "attention.md").symlink_to(secret)
    assert with_attention("# Study\n\n| table |\n", out) == "# Study\n\n| table |\n"
    (out / "attention.md").unlink()
    (out / "attention.md").write_text(f"{HEADING}\n\nshares\n")
    assert with_attention("# Study\n", out) == f"# Study\n\n{HEADING}\n\nshares\n"


def test_study_attention_refuses_symlinked_capture_history_and_study_json(tmp_path, secret):
    """Refused in one line before the executor is used (None here: any use would fail) and before any
    write; main captured into, and read histories from, the links' targets."""
    from attnprobe.studies.loop.layout import StudyLayout

    out = make_study(tmp_path / "study")
    model = SimpleNamespace(spec="toy", backend="transformers", dtype="float32")
    cap = StudyLayout(out).setting_dir(OTHER) / "capture"
    os.rename(cap, tmp_path / "elsewhere" / "capture")
    cap.symlink_to(tmp_path / "elsewhere" / "capture")
    with pytest.raises(AttnprobeError, match=r"mask-1_refine-bm25-a01c95f0/capture: is a symlink inside"):
        run_attention(None, out, model=model)
    assert not (out / "attention.json").exists() and not (out / aio.LOCK_NAME).exists()
    cap.unlink()
    hist = StudyLayout(out).setting_dir(BASE) / "history"
    hist.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(AttnprobeError, match=r"/none/history: is a symlink inside"):
        run_attention(None, out, model=model)
    hist.unlink()
    # one symlinked history file among real ones is left out of the baseline's histories (with a message)
    hist.mkdir()
    (StudyLayout(out).setting_dir(BASE) / "results").mkdir()
    traj = {"id": "q1/history", "messages": [{"role": "user", "content": "question q1?"}],
            "meta": {"inputs": "stamp-q1"}}
    (hist / "q1.jsonl").write_text(json.dumps(traj) + "\n")
    (tmp_path / "elsewhere" / "q2.jsonl").write_text(json.dumps({**traj, "id": "outside",
                                                                   "meta": {"inputs": "stamp-q2"}}) + "\n")
    (hist / "q2.jsonl").symlink_to(tmp_path / "elsewhere" / "q2.jsonl")
    for q in ("q1", "q2"):
        (StudyLayout(out).setting_dir(BASE) / "results" / f"{q}.json").write_text(json.dumps({"question_id": q,
                                                                                 "inputs": f"stamp-{q}"}))
    assert [t.id for t in histories(out, BASE)] == ["q1/history"]
    (out / "study.json").rename(tmp_path / "elsewhere" / "study.json")
    (out / "study.json").symlink_to(tmp_path / "elsewhere" / "study.json")
    with pytest.raises(AttnprobeError, match=r"study\.json: is a symlink inside"):
        read_study(out)


def test_study_interference_refuses_a_symlinked_results_folder_before_running(tmp_path, secret):
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.job import InterferenceJob
    from attnprobe.studies.loop.layout import StudyLayout

    out = tmp_path / "study"
    StudyLayout(out).setting_dir("none").mkdir(parents=True)
    (StudyLayout(out).setting_dir("none") / "results").symlink_to(secret.parent)
    with pytest.raises(AttnprobeError, match=r"/none/results: is a symlink inside"):
        InterferenceJob(out, [{"id": "q1", "question": "?"}], ["none"], LoopConfig("ircot", ircot_form="chat"))


# ------------------------------------------------------------------ truncated safetensors are not done
def test_safetensors_problem_known_answers(tmp_path, secret):
    from safetensors.numpy import save_file

    path = tmp_path / "x.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32)}, str(path))
    size = path.stat().st_size
    assert aio.safetensors_problem(path) is None
    os.truncate(path, size - 4)
    assert aio.safetensors_problem(path) == f"{size - 4} bytes, the header describes {size} (truncated or damaged)"
    os.truncate(path, 20)  # inside the header
    assert aio.safetensors_problem(path).startswith("header of ")
    path.write_bytes(b"abc")
    assert aio.safetensors_problem(path) == "3 bytes: shorter than a safetensors header"
    (tmp_path / "link.safetensors").symlink_to(secret)
    assert aio.safetensors_problem(tmp_path / "link.safetensors") == "a symlink (not followed)"


def _truncate(path: Path, by: int = 16) -> None:
    os.truncate(path, path.stat().st_size - by)


def test_a_truncated_capture_is_not_done(tmp_path):
    from attnprobe.capture.job import CaptureJob, CaptureOptions

    traj = Trajectory(id="t1", messages=[{"role": "user", "content": "hi"}])
    job = CaptureJob(tmp_path / "cap", [traj], CaptureOptions(), model="toy", weights="w")
    res = toy_capture("t1")
    res.meta.update({"cli_settings": job.settings, "weights_hash": "w", "trajectory_hash": traj.content_hash()})
    res.save(job.folder(traj))
    [item] = job.items()
    assert job.done(item)
    _truncate(job.folder(traj) / "scores.safetensors")
    fresh = CaptureJob(tmp_path / "cap", [traj], CaptureOptions(), model="toy", weights="w")
    assert not fresh.done(fresh.items()[0]) and fresh.conflicts() == []  # redone, no --force needed


def test_a_truncated_counterfactual_step_is_not_done(tmp_path):
    from attnprobe.counterfactual.steps import Step
    from attnprobe.counterfactual.store import step_dir, step_done, write_step

    traj = Trajectory(id="t1", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}])
    step = Step(traj, 1, 1)
    settings = {"model": "toy"}
    record = {"settings": settings, "trajectory_hash": traj.content_hash()}
    write_step(step_dir(tmp_path, step, "mask-5"), record, {"m": np.ones(3, dtype=np.float32)},
               toy_capture("o"), toy_capture("c"))
    assert step_done(tmp_path, step, "mask-5", settings)
    for name in ("masses.safetensors", "original/scores.safetensors", "counterfactual/scores.safetensors"):
        path = step_dir(tmp_path, step, "mask-5") / name
        keep = path.read_bytes()
        _truncate(path)
        assert not step_done(tmp_path, step, "mask-5", settings), name
        path.write_bytes(keep)
    assert step_done(tmp_path, step, "mask-5", settings)


def test_reanalysing_a_step_replaces_a_symlinked_masses_file_not_its_target(tmp_path, secret, monkeypatch):
    """Verified, unchanged: safetensors' save_file (reanalyse_step, the IBIS attention.safetensors) writes a
    temporary file and renames it, so a symlinked target is replaced, never written through."""
    from support.cfstep import make_step

    from attnprobe.counterfactual import store

    folder = tmp_path / "step_0003"
    make_step(folder)
    record = json.loads((folder / "record.json").read_text())
    (folder / "record.json").write_text(json.dumps({**record, "source": [0, 1, 2]}))
    (folder / "masses.safetensors").unlink()
    (folder / "masses.safetensors").symlink_to(secret)
    monkeypatch.setattr(store, "load_step", lambda d: ({**record, "source": [0, 1, 2]}, {}))
    monkeypatch.setattr(store, "step_analysis", lambda *a: ({"decision": {}}, {"m": np.ones(2, np.float32)}))
    traj = Trajectory(id="t", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "Task"},
                                        {"role": "tool", "content": "obs"}, {"role": "assistant", "content": "go"}])
    store.reanalyse_step(folder, traj)
    assert secret.read_text() == SECRET
    assert not (folder / "masses.safetensors").is_symlink()
    assert aio.safetensors_problem(folder / "masses.safetensors") is None


def test_a_counterfactual_run_refuses_a_symlinked_trajectory_folder(tmp_path, secret):
    """Step folders are written by AtomicDir under OUT/<trajectory>/<policy>/: main created them through a
    symlinked trajectory folder, in the link's target."""
    from attnprobe.counterfactual.job import CounterfactualJob
    from attnprobe.counterfactual.steps import Step

    traj = Trajectory(id="t1", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}])
    out = tmp_path / "cf"
    out.mkdir()
    (out / "t1").symlink_to(secret.parent)
    with pytest.raises(AttnprobeError, match=r"/cf/t1: is a symlink inside .*/cf; symlinks in an output folder"):
        CounterfactualJob(out, [Step(traj, 1, 1)], ["mask:5"], {})
    CounterfactualJob(tmp_path / "cf2", [Step(traj, 1, 1)], ["mask:5"], {})  # a real folder is fine


def test_a_dangling_symlink_out_says_what_it_is(tmp_path, capsys):
    """Issue 38: `--out` a symlink to nothing said only "File exists"; every command now says what is there."""
    from attnprobe.cli.main import main

    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "q1", "question": "What is item 1?", "answers": ["1"]}\n')
    traj = tmp_path / "t.jsonl"
    traj.write_text('{"id": "t1", "messages": [{"role": "user", "content": "hi"}]}\n')
    for argv, what in ((["capture", str(traj), "--model", "/nonexistent"], "output folder"),
                       (["study", "interference", str(questions)], "study folder")):
        assert main([*argv, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"attnprobe: error: {out}: the {what} is a dangling symlink (to "
                                           f"{tmp_path / 'nowhere'}, which does not exist); remove the link, or "
                                           "create what it points to\n")
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()
