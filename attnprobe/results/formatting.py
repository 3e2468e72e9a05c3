"""Number formatting and the Jinja environment shared by the reports (HTML, Markdown) and the app."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import jinja2


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def format_ci(value: float | None, ci: Sequence[float | None] | None = None, *, pct: bool = False,
              signed: bool = True, digits: int | None = None, unit: str | None = None) -> str:
    """``value [lo, hi]``, e.g. ``+0.0123 [-0.0040, +0.0290]``; ``n/a`` for a missing value.

    pct: the numbers are shares shown as percentage points (x 100, 1 digit, `` pp`` after the interval).
    The interval is left out when ``ci`` or one of its ends is missing; ``unit`` overrides the suffix."""
    if _missing(value):
        return "n/a"
    scale = 100.0 if pct else 1.0
    spec = f"{'+' if signed else ''}.{digits if digits is not None else (1 if pct else 4)}f"
    out = format(scale * value, spec)
    if ci is not None and len(ci) == 2 and not any(_missing(v) for v in ci):
        out += f" [{format(scale * ci[0], spec)}, {format(scale * ci[1], spec)}]"
    return out + (unit if unit is not None else " pp" if pct else "")


def _fmt(x, spec: str = "") -> str:
    return "–" if x is None else format(x, spec)


def template_env(package: str) -> jinja2.Environment:
    """Templates in ``<package>/templates`` (package data, so an installed wheel finds them); HTML is
    autoescaped, Markdown is not; an unknown name is an error rather than empty text."""
    env = jinja2.Environment(loader=jinja2.PackageLoader(package, "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["format_ci"] = format_ci
    env.filters["fmt"] = _fmt  # {{ x | fmt("+.3f") }} = format(x, "+.3f"); None (undefined) -> "–"
    env.filters["json"] = json.dumps  # plain JSON (jinja's tojson sorts keys and escapes for HTML)
    return env
