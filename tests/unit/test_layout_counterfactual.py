"""The counterfactual stage's run folder layout (issue 28): its names spelled only in
counterfactual/layout.py, one done rule, one record validator shared by the stage and the app, and
the app's reads kept inside its data directory. Hand-built step folders (support/cfstep.py), no model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from support.cfstep import make_step
from support.spelled import outside, spelled
from support.studydir import toy_capture

from attnprobe.counterfactual import layout as CL
from attnprobe.counterfactual.layout import CounterfactualLayout
from attnprobe.counterfactual.steps import Step
from attnprobe.counterfactual.store import load_step, write_step
from attnprobe.errors import AttnprobeError
from attnprobe.io import OutsideFolder
from attnprobe.trajectory.schema import Trajectory

NAMES = [CL.RECORD_FILE, CL.MASSES_FILE, CL.SUMMARY_JSON, CL.SUMMARY_MD]


def test_the_run_folder_names_are_spelled_only_in_layout_py():
    found = spelled(NAMES)
    assert outside(found, {n: ("attnprobe/counterfactual/layout.py",) for n in NAMES}) == {}
    assert {n: len(v) for n, v in found.items()} == {n: 1 for n in NAMES}


def _step() -> Step:
    traj = Trajectory(id="t1", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}])
    return Step(traj, 1, 1)


SETTINGS = {"model": "toy", "rendering": "auto"}


def _write(out: Path, step: Step, settings: dict = SETTINGS) -> Path:
    folder = CounterfactualLayout(out).step_dir(step, "mask-5")
    write_step(folder, {"settings": settings, "trajectory_hash": step.trajectory.content_hash()},
               {"m": np.ones(3, dtype=np.float32)}, toy_capture("o"), toy_capture("c"))
    return folder


def test_step_dir_is_trajectory_policy_step(tmp_path):
    layout = CounterfactualLayout(tmp_path)
    step = _step()
    assert layout.step_dir(step, "mask-5") == tmp_path / "t1" / "mask-5" / "step_0001"
    assert step.key == f"{CL.STEP_PREFIX}0001"
    assert layout.summary_json == tmp_path / "summary.json" and layout.summary_md == tmp_path / "summary.md"


def test_step_done_missing_stale_changed_and_good(tmp_path):
    layout, step = CounterfactualLayout(tmp_path), _step()
    assert not layout.step_done(step, "mask-5", SETTINGS)  # missing
    folder = _write(tmp_path, step)
    assert layout.step_done(step, "mask-5", SETTINGS)  # good
    assert not layout.step_done(step, "mask-5", {**SETTINGS, "rendering": "native"})  # other settings stamp
    changed = Step(Trajectory(id="t1", messages=[{"role": "user", "content": "hi!"},
                                                 {"role": "assistant", "content": "a"}]), 1, 1)
    assert not layout.step_done(changed, "mask-5", SETTINGS)  # the trajectory's content changed
    old = time.time() - 100
    os.utime(folder / CL.RECORD_FILE, (old, old))
    assert not layout.step_done(step, "mask-5", SETTINGS, since=time.time() - 10)  # written before this run
    assert layout.step_done(step, "mask-5", SETTINGS, since=old - 1)
    (folder / CL.ORIGINAL_DIR / "meta.json").unlink()
    assert not layout.step_done(step, "mask-5", SETTINGS)  # a capture missing


def test_a_symlinked_policy_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "cf"
    (out / "t1").mkdir(parents=True)
    (out / "t1" / "mask-5").symlink_to(elsewhere)
    with pytest.raises(OutsideFolder, match="mask-5: is a symlink inside"):
        CounterfactualLayout(out).step_done(_step(), "mask-5", SETTINGS)


def test_problem_is_the_records_validator_and_the_app_reads_through_it(tmp_path):
    from attnprobe_app.views.counterfactual import find_steps

    run = tmp_path / "cf" / "t" / "mask_0"
    make_step(run / "step_0003")
    record, arrays = load_step(run / "step_0003")  # the stage's reader
    assert CounterfactualLayout.problem(record, app=True) is None  # what the page shows is there
    assert CounterfactualLayout.problem(record) == "missing 'queries.decision.original'"  # the summary needs more
    assert set(CL.MASS_ARRAYS) <= set(arrays)
    app = CounterfactualLayout(Path("."), tmp_path)  # the page's: rooted at the data directory
    assert app.read_record("cf/t/mask_0/step_0003", app=True) == record
    assert find_steps(tmp_path) == (["cf/t/mask_0/step_0003"], [])
    bad = {**record, "roles": "system"}
    (run / "step_0003" / CL.RECORD_FILE).write_text(json.dumps(bad))
    assert CounterfactualLayout.problem(bad) == "missing 'queries.decision.original'"  # roles: the page's only
    assert CounterfactualLayout.problem(bad, app=True) == "'roles' is not a list of names"
    with pytest.raises(AttnprobeError) as exc:
        app.read_record("cf/t/mask_0/step_0003", app=True)
    assert str(exc.value) == "cf/t/mask_0/step_0003/record.json: 'roles' is not a list of names"
    with pytest.raises(AttnprobeError, match=r"^cf/t/mask_0/step_0003/masses.safetensors: missing mass_original"):
        from safetensors.numpy import save_file

        save_file({"removed_tokens": np.zeros(3, np.int8)}, str(run / "step_0003" / CL.MASSES_FILE))
        app.read_masses("cf/t/mask_0/step_0003", check=True)


def test_is_folder_marks_step_folders_for_discovery(tmp_path):
    from attnprobe_app import data as D

    assert CounterfactualLayout.is_folder({"record.json", "masses.safetensors", "x"})
    assert not CounterfactualLayout.is_folder({"record.json"})
    make_step(tmp_path / "cf" / "t" / "mask_0" / "step_0003")
    inv = D.discover(tmp_path)
    assert inv.captures == []  # its original/ and counterfactual/ captures belong to the step's page


def test_a_record_linked_out_of_the_data_directory_is_refused_for_the_app(tmp_path):
    data, run = tmp_path / "data", tmp_path / "data" / "cf" / "t" / "mask_0"
    make_step(run / "step_0003")
    secret = tmp_path / "secret.json"
    secret.write_text((run / "step_0003" / CL.RECORD_FILE).read_text())
    (run / "step_0003" / CL.RECORD_FILE).unlink()
    (run / "step_0003" / CL.RECORD_FILE).symlink_to(secret)
    with pytest.raises(OutsideFolder, match="it is outside the data directory"):
        CounterfactualLayout(Path("."), data).read_record("cf/t/mask_0/step_0003", app=True)
    with pytest.raises(OutsideFolder, match="record.json: is a symlink inside"):  # the CLI follows no link
        load_step(run / "step_0003")
