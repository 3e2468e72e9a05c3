"""attnprobe app: explore captured attention (launch: ``attnprobe app --data DIR``, or
``streamlit run app/streamlit_app.py -- --data DIR``). Reads only inside DIR; no model needed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if __package__ in (None, ""):
    # Run as a script (streamlit run): make this folder importable as the package attnprobe_app.
    pkg = sys.modules.get("attnprobe_app")
    if pkg is None or Path(getattr(pkg, "__file__", "") or "").resolve().parent != _HERE:
        spec = importlib.util.spec_from_file_location("attnprobe_app", _HERE / "__init__.py",
                                                      submodule_search_locations=[str(_HERE)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["attnprobe_app"] = pkg
        spec.loader.exec_module(pkg)

import streamlit as st  # noqa: E402

from attnprobe_app import common as C  # noqa: E402
from attnprobe_app import data as D  # noqa: E402
from attnprobe_app.views import counterfactual, decay, framings, models, study, trajectory  # noqa: E402

PAGES = {"Trajectory": trajectory, "Decay": decay, "Framings": framings, "Models": models,
         "Counterfactual": counterfactual, "Study": study}


def main() -> None:
    st.set_page_config(page_title="attnprobe", layout="wide")
    qp = st.query_params
    default_page = qp.get("page", "Trajectory").capitalize()
    names = list(PAGES)
    with st.sidebar:
        st.markdown("## attnprobe")
        page = st.radio("Page", names, index=names.index(default_page) if default_page in names else 0, key="page")
    if qp.get("page") != page:
        qp["page"] = page
    try:
        root = D.data_root(C.configured_data_dir())
    except D.DataError as exc:
        st.error(str(exc))
        st.stop()
    with st.sidebar:
        st.caption(f"Data directory: `{root}`")
        if st.button("Rescan data directory", key="rescan"):
            C.inventory.clear()
    inv = C.inventory(str(root))
    if inv.empty:
        st.title(page)
        st.info(
            f"The data directory `{root}` holds no attnprobe outputs yet.\n\n"
            "- captures: `attnprobe capture TRAJECTORIES.jsonl --out DIR/captures`\n"
            "- IBIS: `attnprobe ibis all --results DIR/ibis`\n"
            "- across models: `attnprobe compare DIR/ibis --out DIR/compare`\n"
            "- policies in the loop: `attnprobe study interference QUESTIONS.jsonl --policy none --policy "
            "ircot:oq --out DIR/study`\n\n"
            "then press **Rescan data directory**.")
        C.show_problems(inv.problems)
        return
    PAGES[page].render(root, inv)


main()
