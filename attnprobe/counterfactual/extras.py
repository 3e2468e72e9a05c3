"""The fields issue 19 adds to a counterfactual step record, in one place: the policy's details, the
refined messages' dropped / kept-again split, the next action read against the trajectory's own tools,
and the teacher-forced log-probability of the recorded step under both contexts.

:func:`extra_fields` works on what ``counterfactual.run.run_batch`` has in hand before it writes a
step; :func:`augment_step_folder` applies it to a finished step folder (no capture again; a model only
for the log-probability).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnprobe.agents.policies import Counterfactual, Policy
from attnprobe.agents.tagtext import agent_view, apply_policy
from attnprobe.counterfactual.actions import compare_actions, logprob_block, recorded_logprob, tool_vocabulary
from attnprobe.counterfactual.layout import ORIGINAL_DIR, RECORD_FILE, CounterfactualLayout
from attnprobe.counterfactual.records import QUERY_NAMES
from attnprobe.counterfactual.refined import refined_mass_split
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory


def extra_fields(record: dict, original: CaptureResult, cfx: Counterfactual, trajectory: Trajectory,
                 step_index: int, *, model=None, rendering: str = "auto", max_tokens: int | None = None,
                 original_logprob: dict | None = None) -> dict:
    """``record`` with the issue-19 fields added (in place, and returned):

    - ``details``: the policy's details (for refiners: per refined message its query and which original
      sentences it kept);
    - ``queries[q]["refined_split"]``: :func:`attnprobe.counterfactual.refined.refined_mass_split` of
      the original row (when the policy refined something);
    - ``action["own"]``: :func:`attnprobe.counterfactual.actions.compare_actions` with the vocabulary of
      the trajectory's declared tools and the calls before the step (when the record has actions);
    - ``logprob``: :func:`recorded_logprob` of the recorded step message under the original and the
      counterfactual prefix (with ``model``; ``original_logprob`` reuses the original's when the
      caller computed it for another policy at the same step)."""
    if cfx.details:
        record["details"] = json.loads(json.dumps(cfx.details))
    refined = cfx.details.get("refined") or {}
    if refined:
        for q, name in enumerate(QUERY_NAMES):
            record["queries"][name]["refined_split"] = refined_mass_split(original, refined, q)
    prefix = trajectory.messages[:step_index]
    if isinstance(record.get("action"), dict):
        vocab = tool_vocabulary(trajectory.tools, prefix)
        record["action"]["own"] = compare_actions(record["action"]["original"], record["action"]["counterfactual"],
                                                  vocab)
    if model is not None:
        step = trajectory.messages[step_index]
        lp_o = original_logprob or recorded_logprob(model, prefix, step, trajectory.tools, rendering=rendering,
                                                    max_tokens=max_tokens)
        lp_c = recorded_logprob(model, cfx.messages, step, trajectory.tools, rendering=rendering,
                                max_tokens=max_tokens)
        record["logprob"] = logprob_block(lp_o, lp_c)
    return record


def augment_step_folder(directory: str | Path, trajectory: Trajectory, policy: Policy, *, model=None,
                        original_logprob: dict | None = None) -> dict:
    """:func:`extra_fields` on a finished step folder (the policy re-applied to the recorded prefix,
    the original capture read back); rewrites ``record.json`` atomically and returns the record."""
    from attnprobe.io import atomic_write_text, load_json

    directory = Path(directory)
    record = load_json(directory / RECORD_FILE)
    i = int(record["step_message_index"])
    trajectory = agent_view(trajectory)  # the steps were chosen on the agent's view (counterfactual.steps)
    cfx = apply_policy(policy, trajectory.messages[:i])
    if [int(k) for k in cfx.source] != [int(k) for k in record["source"]]:
        raise ValueError(f"{directory}: the policy no longer gives the recorded counterfactual (source differs)")
    original = CaptureResult.load(directory / ORIGINAL_DIR)
    rendering = (record.get("rendering") or {}).get("original", "auto")
    extra_fields(record, original, cfx, trajectory, i, model=model, rendering=rendering,
                 original_logprob=original_logprob)
    atomic_write_text(directory / RECORD_FILE, json.dumps(record, indent=1, ensure_ascii=False))
    return record


def steps_of(root: str | Path, trajectory_id: str, policy_name: str) -> Sequence[Path]:
    """The finished step folders of one (trajectory, policy) under a run folder."""
    return CounterfactualLayout(Path(root)).step_records(trajectory_id, policy_name)
