"""The one driver (attnprobe.execution.study.run_study) on a toy study whose jobs write real files: what it
does in which order (plan before the lock, the settings check, conflicts, one executor for every group,
parts, finish), what it refuses, and that nothing loads when nothing is left."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import JobBase, WorkItem
from attnprobe.execution.local import LocalExecutor
from attnprobe.execution.study import Counts, Outcome, Plan, Study, part, run_study
from attnprobe.io.settings import SETTINGS_FILE


@dataclass
class SquareJob(JobBase):
    """Writes n*n (times the model's factor) to out/<stage>-<n>.json; done when that file exists."""

    out: Path
    numbers: list[int]
    stage: str = "square"

    def items(self):
        return [WorkItem(key=str(n), data=n) for n in self.numbers]

    def done(self, item, since=None):
        return (self.out / f"{self.stage}-{item.data}.json").exists()

    def run(self, model, batch):
        for it in batch:
            if it.data < 0:
                raise AttnprobeError(f"negative: {it.data}")
            (self.out / f"{self.stage}-{it.data}.json").write_text(json.dumps(it.data * it.data * model))
        return [None] * len(batch)


@dataclass(frozen=True)
class ToyOptions:
    out: Path
    numbers: tuple[int, ...] = (1, 2, 3)
    factor: int = 1
    force: bool = False
    conflicts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToyLayout:
    root: Path


@dataclass
class ToyStudy:
    name: str = "toy"
    folder: str = "toy folder"
    Options: type = ToyOptions
    seen: list = field(default_factory=list)

    def layout(self, options):
        return ToyLayout(Path(options.out))

    def plan(self, options, layout):
        if not options.numbers:
            raise AttnprobeError("no numbers")  # refused before any folder or model
        first = SquareJob(layout.root, [n for n in options.numbers if n % 2], stage="odd")

        def second(ex):  # built where the model is: its items depend on it
            self.seen.append(ex.model)
            return SquareJob(layout.root, [n for n in options.numbers if not n % 2], stage="even")

        return Plan([[first], [second]], stamp={"factor": options.factor}, names={"factor": "--factor"},
                    conflicts=lambda: list(options.conflicts), data=len(options.numbers))

    def finish(self, options, layout, counts: Counts):
        total = counts.total
        values = sorted(json.loads(p.read_text()) for p in layout.root.glob("*.json") if p.name[0] != ".")
        return Outcome(lines=[f"{values}"], notes=[total.line("toy", to=layout.root)], exit_code=total.exit_code,
                       value=counts.plan.data)


def _opener(factor=1):
    opened = []

    def open_executor():
        opened.append(1)
        return LocalExecutor(lambda: factor, progress=False)

    return opened, open_executor


def test_the_driver_runs_every_group_on_one_executor_and_finishes(tmp_path):
    study = ToyStudy()
    assert isinstance(study, Study)
    opened, open_ex = _opener(factor=10)
    out = run_study(study, ToyOptions(tmp_path / "o", numbers=(1, 2, 3, 4), factor=10), open_ex)
    assert opened == [1] and study.seen == [10]  # one executor; the lazy job saw its loaded model
    assert out.lines == ["[10, 40, 90, 160]"] and out.exit_code == 0 and out.value == 4
    assert {k: v.__dict__ for k, v in out.counts.jobs.items()} == {
        "odd": {"done_before": 0, "done": 2, "failed": 0}, "even": {"done_before": 0, "done": 2, "failed": 0}}
    assert out.notes == [f"toy: 4 run, 0 already done, 0 failed -> {tmp_path / 'o'}"]
    assert json.loads((tmp_path / "o" / SETTINGS_FILE).read_text()) == {"toy": {"factor": 10}}
    assert not (tmp_path / "o" / ".attnprobe.lock").exists()
    again = run_study(study, ToyOptions(tmp_path / "o", numbers=(1, 2, 3, 4), factor=10), open_ex)
    assert again.counts.total.__dict__ == {"done_before": 4, "done": 0, "failed": 0}


def test_other_settings_and_conflicts_are_refused_before_the_executor_opens(tmp_path):
    study, (opened, open_ex) = ToyStudy(), _opener()
    run_study(study, ToyOptions(tmp_path, factor=1), open_ex)
    opened.clear()
    with pytest.raises(AttnprobeError, match=r"toy ran there with other options: --factor was 1, now 2; use --force"):
        run_study(study, ToyOptions(tmp_path, factor=2), open_ex)
    with pytest.raises(AttnprobeError, match=r"holds results made with other settings: a \(and 1 more\); use --force"):
        run_study(study, ToyOptions(tmp_path, conflicts=("a", "b")), open_ex)
    assert opened == []
    with pytest.raises(AttnprobeError, match="no numbers"):
        run_study(study, ToyOptions(tmp_path / "new", numbers=()), open_ex)
    assert not (tmp_path / "new").exists() and opened == []
    forced = run_study(study, ToyOptions(tmp_path, factor=2, force=True, conflicts=("a",)), open_ex)
    assert forced.exit_code == 0 and json.loads((tmp_path / SETTINGS_FILE).read_text()) == {"toy": {"factor": 2}}


def test_a_failed_item_is_exit_1_and_a_run_that_finished_nothing_records_nothing(tmp_path):
    out = run_study(ToyStudy(), ToyOptions(tmp_path, numbers=(-1,)), _opener()[1])
    assert out.exit_code == 1 and out.counts.total.failed == 1
    assert not (tmp_path / SETTINGS_FILE).exists()


def test_nothing_to_plan_opens_no_executor_and_a_part_runs_on_the_parents(tmp_path):
    class Empty(ToyStudy):
        def plan(self, options, layout):
            return Plan([])

    opened, open_ex = _opener()
    assert run_study(Empty(), ToyOptions(tmp_path / "e"), open_ex).lines == ["[]"] and opened == []

    inner = ToyStudy(name="inner")

    class Outer(ToyStudy):
        def plan(self, options, layout):
            return Plan([[part(inner, ToyOptions(layout.root / "inner", numbers=(5,)))]])

        def finish(self, options, layout, counts):
            return Outcome(lines=counts.parts["inner"].lines, exit_code=counts.total.exit_code)

    out = run_study(Outer(), ToyOptions(tmp_path / "outer"), open_ex)
    assert opened == [1] and out.lines == ["[25]"]  # the part ran on the executor its parent opened
    assert out.counts.jobs["odd"].done == 1 and (tmp_path / "outer" / "inner" / "odd-5.json").exists()

