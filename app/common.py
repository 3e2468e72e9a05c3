"""Streamlit glue shared by the pages: the data directory, cached loaders, pagination, errors."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from attnprobe.errors import AttnprobeError
from attnprobe.results.layout import CaptureLayout
from attnprobe.studies.loop.layout import StudyLayout
from attnprobe_app import data as D
from attnprobe_app import shaping as SH
from attnprobe_app import study_data as SD

PAGE_SIZE = 50


def configured_data_dir() -> str | None:
    """``--data DIR`` after ``streamlit run app/streamlit_app.py --``, else $ATTNPROBE_APP_DATA."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--data" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--data="):
            return a.split("=", 1)[1]
    return os.environ.get(D.ENV_DATA)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _layout_mtime(path: Callable[[], Path]) -> float:
    """The time of a study layout's path (0 when it is refused: the page reports that where it reads it)."""
    try:
        return _mtime(path())
    except AttnprobeError:
        return 0.0


# Loaded objects are cached with cache_resource: they are kept as live objects in memory and never
# serialized (st.cache_data would round-trip them through a byte serializer on every hit).
@st.cache_resource(ttl=20, show_spinner="Scanning the data directory…")
def inventory(root: str) -> D.Inventory:
    return D.discover(Path(root))


@st.cache_resource(max_entries=16, show_spinner="Loading capture…")
def _capture(root: str, rel: str, mtime: float):
    return D.load_capture(Path(root), rel)


def capture(root: Path, rel: str):
    return _capture(str(root), rel, _mtime(CaptureLayout.meta(D.resolve_inside(root, rel))))


@st.cache_resource(max_entries=16)
def _capture_views(root: str, rel: str, mtime: float) -> dict[str, Any]:
    res = _capture(root, rel, mtime)
    return {"token_roles": res.token_roles(), "token_texts": res.token_texts(), "turn_texts": res.turn_texts()}


def capture_views(root: Path, rel: str) -> dict[str, Any]:
    return _capture_views(str(root), rel, _mtime(CaptureLayout.meta(D.resolve_inside(root, rel))))


@st.cache_resource(max_entries=64, show_spinner=False)
def _heatmap(root: str, rel: str, mtime: float, layer, head):
    from attnprobe.results.analysis import heatmap

    return heatmap(_capture(root, rel, mtime), layer, head)


def heatmap(root: Path, rel: str, layer=None, head=None):
    return _heatmap(str(root), rel, _mtime(CaptureLayout.meta(D.resolve_inside(root, rel))), layer, head)


@st.cache_resource(max_entries=8, show_spinner="Loading IBIS results…")
def _ibis(root: str, rel: str, mtimes: tuple):
    return D.load_ibis(Path(root), rel)


def ibis(root: Path, rel: str) -> D.IbisFolder:
    folder = D.resolve_inside(root, rel)
    mt = tuple(_mtime(folder / n) for n in D.IBIS_WATCHED)
    return _ibis(str(root), rel, mt)


@st.cache_resource(max_entries=32, show_spinner="Loading studies…")  # keyed by study.json times: no ttl needed
def _studies(root: str, rels: tuple, mtimes: tuple) -> tuple[list[SD.Study], list[str]]:
    return SD.load_studies(Path(root), list(rels))


def studies(root: Path, inv: D.Inventory) -> tuple[list[SD.Study], list[str]]:
    """(readable studies, 'skipped: ...' lines) of the study folders the scan found."""
    rels = tuple(inv.studies)
    return _studies(str(root), rels, tuple(_layout_mtime(lambda r=r: StudyLayout(Path(root) / r, root=Path(root))
                                                         .study_json) for r in rels))


@st.cache_resource(max_entries=64, show_spinner=False)  # keyed by the files' times: no ttl needed
def _steps(root: str, _study: SD.Study, rel: str, setting: str, qid: str, mtimes: tuple) -> SD.Steps:
    return SD.question_steps(Path(root), _study, setting, qid)


def study_steps(root: Path, study: SD.Study, setting: str, qid: str) -> SD.Steps:
    """The recorded calls of one question under one setting, with their captures (cached per file times)."""
    layout = study.layout(root)
    st = layout.setting(setting)
    mt = (_layout_mtime(lambda: st.calls(qid)), _layout_mtime(lambda: st.calls_file),
          _layout_mtime(lambda: st.capture_dir), _layout_mtime(lambda: layout.study_json))
    return _steps(str(root), study, study.rel, setting, qid, mt)


@st.cache_resource(max_entries=32, show_spinner=False)  # keyed by the files' times: no ttl needed
def _study_caveats(root: str, _study: SD.Study, rel: str, mtimes: tuple) -> list[str]:
    return SD.study_caveats(Path(root), _study)


def study_caveats(root: Path, study: SD.Study) -> list[str]:
    """The study's caveats (:func:`SD.study_caveats`: reads every setting's calls), cached per file times."""
    layout = study.layout(root)
    mt = (_layout_mtime(lambda: layout.study_json), _layout_mtime(lambda: layout.attention_json),
          *(_layout_mtime(get) for s in study.settings
            for get in (lambda s=s: layout.calls_file(s), lambda s=s: layout.setting(s).calls_dir)))
    return _study_caveats(str(root), study, study.rel, mt)


def paginate(df, key: str, page_size: int = PAGE_SIZE):
    """Show a DataFrame one page at a time (big tables stay fast)."""
    n = len(df)
    if n <= page_size:
        st.dataframe(df, hide_index=True)
        return
    pages = (n + page_size - 1) // page_size
    c1, c2 = st.columns([1, 4])
    page = c1.number_input("page", min_value=1, max_value=pages, value=1, step=1, key=key)
    c2.caption(f"rows {(page - 1) * page_size + 1}-{min(n, page * page_size)} of {n} ({pages} pages)")
    st.dataframe(df.iloc[(page - 1) * page_size: page * page_size], hide_index=True)


def show_problems(problems: list[str], label: str = "could not be read") -> None:
    if problems:
        with st.expander(f"{len(problems)} file(s) {label}", expanded=False):
            for p in problems[:200]:
                st.text(p)
            if len(problems) > 200:
                st.text(f"… and {len(problems) - 200} more")


def no_data(kind: str, how: str) -> None:
    st.info(f"No {kind} found in the data directory.\n\n{how}")


def role_bars(att_row, res) -> Any:
    """One query's attention summed per turn and role, stacked, with the messages a context policy replaced
    (``trajectory_meta.history``) as their own roles: placeholder and refined (never drawn as observations)."""
    import plotly.graph_objects as go

    from attnprobe.results.figures import ROLE_COLORS

    roles = SH.segment_roles(res.segments, res.meta)
    mass = SH.turn_role_mass(att_row, res.segments, roles, res.num_turns)
    fig = go.Figure()
    for role in [r for r in (*ROLE_COLORS, *SH.EXTRA_ROLES) if r in mass and mass[r].any()]:
        fig.add_trace(go.Bar(x=list(range(res.num_turns)), y=mass[role], name=role,
                             marker_color=SH.EXTRA_ROLE_COLORS.get(role) or ROLE_COLORS[role],
                             hovertemplate="turn %{x}<br>" + role + ": %{y:.4f}<extra></extra>"))
    fig.update_layout(barmode="stack", height=330, margin=dict(l=60, r=20, t=10, b=110),
                      xaxis=dict(title="turn", tickmode="linear", dtick=max(1, res.num_turns // 25)),
                      yaxis=dict(title="attention mass"),
                      legend=dict(orientation="h", y=-0.3, yanchor="top", x=0, xanchor="left"))
    return fig


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$])")  # CommonMark escapes any of these; $ would start math


def md_cell(value) -> str:
    """One table cell as Markdown text that shows exactly ``value`` (no emphasis, links, HTML or math)."""
    text = "" if value is None else str(value)
    return _MD_SPECIAL.sub(r"\\\1", text.replace("\r", " ").replace("\n", " "))


def table(rows: list[dict]) -> None:
    """A small full-width table (a few rows) as a Markdown table: every column shows at the page's width,
    and the browser draws it at a fraction of an interactive grid's cost (the Study page's grids were about
    a third of its first draw; docs/app.md, "Speed"). Long tables, and tables in narrow columns (which must
    scroll sideways), stay ``st.dataframe``."""
    if not rows:
        return
    cols = list(rows[0])
    lines = ["| " + " | ".join(md_cell(c) for c in cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(md_cell(r.get(c)) for c in cols) + " |" for r in rows]
    st.markdown("\n".join(lines))
