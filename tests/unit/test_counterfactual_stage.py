"""The counterfactual stage owns its outputs: its one door (support.cfrun) writes OUT/summary.json and OUT/summary.md whichever
command runs it (``attnprobe counterfactual``, ``study attention``), from hand-written step records and an
executor that runs nothing (no model; the shipped trajectory's steps said done)."""

from __future__ import annotations

import json

from support.cfrun import run_on

from attnprobe.counterfactual.analysis import GROUPS
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.summary import markdown_table, summarize
from attnprobe.resources import data_path

FILES = [data_path("long_research.jsonl")]  # steps to plan (the executor below says each one is done already)


class _Executor:
    """Enough of an executor for the stage: settings per policy, nothing to run."""

    def call(self, fn, names, opts):
        return {n: {} for n in names}

    def run(self, job):
        return {"done_before": len(job.steps), "done": 0, "failed": 0}


def _record(traj: str, removed: float) -> dict:
    groups = dict.fromkeys(GROUPS, 0.0)
    q = {"removed_mass": removed, "changed_message_mass": removed, "removed_observation_mass": removed,
         "redistribution": {**groups, "placeholder": removed}, "original": {**groups, "past_observation": 0.5},
         "counterfactual": groups}
    return {"policy": "mask:5", "trajectory_id": traj, "changed": True, "tokens": {"saved": 100, "saved_share": 0.1},
            "decision_exact": {"original": True, "counterfactual": True}, "queries": {"decision": q, "reasoning": q}}


def _folder(tmp_path):
    out = tmp_path / "cf"
    recs = [_record("a", 0.1), _record("b", 0.3)]
    for i, r in enumerate(recs):
        d = out / r["trajectory_id"] / "mask_5" / f"step_{i:04d}"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(r))
    bad = out / "a" / "mask_5" / "step_0099"
    bad.mkdir()
    (bad / "record.json").write_text("{not json")
    return out, recs


def test_the_stage_writes_both_summary_files(tmp_path):
    out, recs = _folder(tmp_path)
    report = run_on(_Executor(), out, files=FILES, opts=RunOptions(), choice_min_past=6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(summarize(recs))) == json.loads(json.dumps(report["summary"]))
    assert summary["mask:5"]["steps"] == 2 and abs(summary["mask:5"]["decision"]["removed_mass"]["mean"] - 0.2) < 1e-12
    md = (out / "summary.md").read_text()
    want_tables = [f"## query: {q}\n\n{markdown_table(summarize(recs), q)}" for q in ("decision", "reasoning")]
    assert md.startswith("Steps with >= 6 past turns.\n\nSkipped 1 unreadable step record(s): ")
    assert md.endswith("\n" + "\n".join(want_tables)) and "capture model" not in md
    assert "| mask:5 | 2 | 20.0 [" in md


def test_summary_md_names_both_models_when_the_capture_model_is_not_the_agents(tmp_path):
    out, _ = _folder(tmp_path)
    run_on(_Executor(), out, files=FILES, opts=RunOptions(), choice_min_past=2,
           models="capture model tiny-smollm2, agent model scripted-chat")
    lines = (out / "summary.md").read_text().splitlines()
    assert lines[:4] == ["Steps with >= 2 past turns.", "",
                         "Capture model tiny-smollm2, agent model scripted-chat: the attention is the capture "
                         "model's reading of the agent's contexts, not the agent's own.", ""]
