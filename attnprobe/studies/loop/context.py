"""A setting's context policy inside the loop.

The setting itself (parsing, the per-step view, the once-per-round refinement, the ``meta.history`` link)
lives in :mod:`attnprobe.agents.context`, shared with the NIS-Agent runner; this module re-exports it under
its old names and keeps what only the study needs: a setting's folder name.
"""

from __future__ import annotations

from attnprobe.agents.context import Setting, parse_setting
from attnprobe.io import safe_name
from attnprobe.io.urls import redact

__all__ = ["Setting", "parse_setting", "slug"]


def slug(spec: str) -> str:
    """A folder name for a setting (``ircot:oq+refine:bm25:3`` -> ``ircot-oq+refine-bm25-3``): readable,
    and injective through :func:`attnprobe.io.safe_name` (which hashes what is not already safe). A refiner
    URL's credentials are not part of it (:func:`attnprobe.io.urls.redact`): the folder of
    ``refine:openai:http://user:pw@h/v1:m`` is that of ``refine:openai:http://***@h/v1:m``, the name study.json
    records it under."""
    return safe_name(redact(spec).replace(":", "-").replace("/", "_"), "setting")
