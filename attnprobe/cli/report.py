"""``attnprobe report``: an HTML report over capture folders."""

from __future__ import annotations

from pathlib import Path

from attnprobe.cli.options import add_output_options


def cmd_report(args) -> int:
    from attnprobe.counterfactual.report import SECTION
    from attnprobe.results.report import write_report

    path = write_report(Path(args.results), Path(args.out) if args.out else None, extra=[SECTION])
    print(f"report written to {path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="write an HTML report (plotly) over capture folders",
                       description="Heatmaps and per-step breakdowns per trajectory, decay curves and headline "
                                   "shares overall, for every capture folder below RESULTS (written by 'capture' "
                                   "or 'demo'). One self-contained HTML file.")
    p.add_argument("results", help="folder with capture results")
    add_output_options(p, out_help="report path (default RESULTS/report.html)", force=False, progress=False)
    p.set_defaults(func=cmd_report)
