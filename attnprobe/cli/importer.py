"""``attnprobe import``: other agents' logs -> attnprobe trajectories."""

from __future__ import annotations

from pathlib import Path


def cmd_import(args) -> int:
    from attnprobe.trajectory.importers import iter_import
    from attnprobe.trajectory.schema import save_trajectories

    trajs = [t for path in args.inputs for t in iter_import(path, args.format)]
    save_trajectories(trajs, Path(args.out))
    print(f"wrote {len(trajs)} trajectories to {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("import", help="convert other agents' logs into attnprobe trajectories",
                       description="Formats: openai (message lists, one per line or {messages, tools, id}), "
                                   "masking (qid/question/full_messages records), smolagents (memory messages).")
    p.add_argument("inputs", nargs="+", help=".json or .jsonl files")
    p.add_argument("--format", required=True, choices=["openai", "masking", "smolagents"])
    p.add_argument("--out", required=True, help="output .jsonl")
    p.set_defaults(func=cmd_import)
