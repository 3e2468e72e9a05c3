"""attnprobe's Streamlit app (installed as the package ``attnprobe_app``).

Entry point: ``app/streamlit_app.py`` (``attnprobe app --data DIR`` runs it with Streamlit).
"""

from pathlib import Path

ENTRY = Path(__file__).resolve().parent / "streamlit_app.py"
