"""The counterfactual part of ``attnprobe report``: one section per run folder, with the summary tables.

``attnprobe.results.report`` knows no study; the CLI hands it :data:`SECTION`, which claims every
folder holding a step record (so a step's two captures are not reported as trajectories) and builds
the section from them. A record that cannot be read is listed as skipped and left out of the numbers.
"""

from __future__ import annotations

import logging
from pathlib import Path

from attnprobe.counterfactual.layout import RECORD_FILE, STEP_PREFIX
from attnprobe.counterfactual.summary import TABLE_HEAD, summarize, table_rows
from attnprobe.errors import AttnprobeError
from attnprobe.io import load_json
from attnprobe.results.report import ExtraSection, Section

log = logging.getLogger(__name__)

QUERIES = (("decision", "at the decision position (the token that predicts the step's action)"),
           ("reasoning", "at the step's reasoning start (seed 002's query)"))
LEGEND = ("Per policy, over every step in the folder: the removed mass, the mean share of attention the "
          "original context put on tokens the counterfactual context no longer holds (percent, 95% bootstrap "
          "interval over steps), the mass on the messages the policy changed (markers and a refiner's kept "
          "sentences included), the part of the removed mass on observation content, where the mass went in "
          "the counterfactual (change per destination group, percentage points; the changes sum to the mass on "
          "changed messages), how often the next action changed (Wilson interval; "
          "'not run' without --actions), and prompt tokens saved. Steps of one trajectory are not "
          "independent: with few trajectories read the intervals as descriptive. Definitions: "
          "docs/counterfactual.md.")


def _read(step: Path, skipped: list[tuple[str, str]]) -> dict | None:
    path = step / RECORD_FILE
    try:
        rec = load_json(path)
        if not isinstance(rec, dict) or "policy" not in rec or "queries" not in rec:
            raise AttnprobeError(f"{path}: not a counterfactual step record")
    except AttnprobeError as exc:
        log.warning("skipping %s", exc)
        skipped.append((str(step), str(exc)))
        return None
    return rec


def build_section(root: Path, steps: list[Path], skipped: list[tuple[str, str]]) -> Section | None:
    """The section over every step folder found below ``root``: grouped by run folder (the folder
    holding ``<trajectory>/<policy>/step_*``), one part each."""
    runs: dict[Path, list[Path]] = {}
    for step in steps:
        if len(step.relative_to(root).parts) >= 3 and step.name.startswith(STEP_PREFIX):
            runs.setdefault(step.parents[2], []).append(step)
    parts = []
    for i, run in enumerate(sorted(runs)):
        pairs = [(str(s), r) for s in sorted(runs[run]) if (r := _read(s, skipped)) is not None]
        summary = summarize(pairs, skipped=skipped)  # a malformed record is listed and left out
        records = [r for _, r in pairs if r.get("policy") in summary]
        if not summary:
            continue
        rel = run.relative_to(root).as_posix()
        parts.append({
            "anchor": f"cf{i}", "name": "." if rel == "." else rel, "head": TABLE_HEAD,
            "info": [("steps", len(records)), ("trajectories", len({r.get("trajectory_id") for r in records})),
                     ("policies", ", ".join(summary))],
            "tables": [(f"Attention {title}", table_rows(summary, q)) for q, title in QUERIES]})
    return Section("Counterfactuals", "counterfactual", LEGEND, parts) if parts else None


SECTION = ExtraSection(RECORD_FILE, build_section)
