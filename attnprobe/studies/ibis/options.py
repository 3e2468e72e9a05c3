"""The options of ``attnprobe ibis report`` and ``attnprobe compare``, declared once (a light module: the
parser is built from it without importing the report's templates and figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnprobe.io.options import non_negative_int, option, positive_int
from attnprobe.studies.ibis.layout import COMPARE_HTML, REPORT_HTML

PLOTLYJS_HELP = "embed plotly.js in {page} (works offline; default) or load it from the CDN"


@dataclass(frozen=True)
class ReportOptions:
    """The options of ``attnprobe ibis report`` (and of ``ibis all``'s report), declared once."""

    bootstrap: int = option(10000, flag="--bootstrap", type=positive_int,
                            help="bootstrap resamples for CIs (default {default})")
    seed: int = option(0, flag="--seed", type=non_negative_int, help="random seed of the bootstrap and permutations")
    permutations: int = option(200, flag="--permutations", type=non_negative_int,
                               help="query-group permutations for the flip-AUC p-values (fold-mean AUC)")
    plotlyjs: str = option("inline", flag="--plotlyjs", choices=("inline", "cdn"),
                           help=PLOTLYJS_HELP.format(page=REPORT_HTML))


@dataclass(frozen=True)
class CompareOptions:
    """The options of ``attnprobe compare`` (its --out is the output group's)."""

    folders: Sequence[Path] = option(flag="folders", nargs="+", type=Path, help="model folders or results roots")
    plotlyjs: str = option("inline", flag="--plotlyjs", choices=("inline", "cdn"),
                           help=PLOTLYJS_HELP.format(page=COMPARE_HTML))
