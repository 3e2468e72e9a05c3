"""A counterfactual run with ``--layers full`` says so: both captures of a step record the selection
("full") as a plain capture does, and the resume settings keep the word, not its letters."""

from __future__ import annotations

from pathlib import Path

from support.cfrun import run_counterfactuals
from support.messages import call

from attnprobe.agents.policies import mask_observations
from attnprobe.counterfactual.run import RunOptions, settings_dict
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory


def _trajectory() -> Trajectory:
    msgs = [{"role": "system", "content": "You are a search agent."}, {"role": "user", "content": "Task: holmium?"}]
    for j in range(6):
        msgs.append({"role": "assistant", "content": f"Step {j}.", "tool_calls": [call(f"c{j}", "web_search", q=str(j))]})
        msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": f"fact {j}"})
    msgs.append({"role": "assistant", "content": "Done."})
    return Trajectory(id="cf-layers", messages=msgs, tools=[])


def test_full_layers_are_recorded_in_both_captures_and_the_settings(tiny_smol, tmp_path):
    out = tmp_path / "cf"
    run_counterfactuals(tiny_smol, [_trajectory()], [mask_observations(1)], out, turns=[6],
                        opts=RunOptions(layers="full", progress=False))
    steps = sorted(Path(out).glob("*/*/step_*"))
    assert len(steps) == 1
    for part in ("original", "counterfactual"):
        meta = CaptureResult.load(steps[0] / part).meta
        assert meta["layer_selection"] == "full", part  # was None: the selection was lost
        assert meta["layers_requested"] == list(range(tiny_smol.num_layers))  # no hybrid mix: every layer
    assert settings_dict(tiny_smol, "mask-obs:1", RunOptions(layers="full"))["layers"] == "full"  # was [f, u, l, l]
    assert settings_dict(tiny_smol, "mask-obs:1", RunOptions(layers=[0, 2]))["layers"] == [0, 2]
