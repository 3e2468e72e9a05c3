"""``attnprobe import``: other agents' logs -> attnprobe trajectories."""

from __future__ import annotations

from pathlib import Path

from attnprobe.cli.options import add_output_options
from attnprobe.trajectory.importers import FORMATS


def cmd_import(args) -> int:
    """Every input is read and validated (ids unique across all of them) before the output is written."""
    from attnprobe.io import ensure_writable_file
    from attnprobe.trajectory.importers import iter_import
    from attnprobe.trajectory.schema import check_unique_ids, save_trajectories

    out = ensure_writable_file(Path(args.out), "output trajectory file")
    trajs = [t for path in args.inputs for t in iter_import(path, args.format)]
    check_unique_ids(trajs)
    save_trajectories(trajs, out)
    print(f"wrote {len(trajs)} trajectories to {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("import", help="convert other agents' logs into attnprobe trajectories",
                       description="Read agent logs and write them as one attnprobe trajectory file (JSON Lines, "
                                   "validated), ready for 'capture'. Formats: openai (message lists, one per line "
                                   "or {messages, tools, id}), masking (qid/question/full_messages records), "
                                   "smolagents (memory messages), tags (Search-R1 / IRCoT tag text: {id, prompt, "
                                   "response} with the rollout as one assistant message, as the agent saw it, or "
                                   "{messages} with the agent's own message boundaries). Tag text is kept byte for "
                                   "byte and labelled, never re-rendered: each <search>...</search> span (tags "
                                   "included) is annotated as the agent's tool call, each "
                                   "<information>...</information> block as an external observation, the rest of "
                                   "an assistant turn stays reasoning; user messages before the first assistant "
                                   "turn (the instructions) are not read for tags. Refused, naming file, line and "
                                   "character: a document block that answers no query or never closes, a nested "
                                   "<search> (Search-R1's loop would read it as part of the query; an import asks "
                                   "for clean logs), an empty query. Counterfactual "
                                   "policies act on the rounds this text holds (docs/counterfactual.md).")
    p.add_argument("inputs", nargs="+", help=".json or .jsonl files")
    p.add_argument("--format", required=True, choices=FORMATS, help="log format of the inputs")
    add_output_options(p, out_required=True, out_help="output trajectory file (.jsonl)", force=False, progress=False)
    p.set_defaults(func=cmd_import)
