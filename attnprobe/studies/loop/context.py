"""A setting's context policy inside the loop.

The setting itself (parsing, the per-step view, the once-per-round refinement, the ``meta.history`` link)
lives in :mod:`attnprobe.agents.context`, shared with the NIS-Agent runner; this module re-exports it under
its old names and keeps what only the study needs: a setting's folder name.
"""

from __future__ import annotations

import hashlib
import re

from attnprobe.agents.context import Setting, parse_setting
from attnprobe.io import safe_name
from attnprobe.io.urls import redact

__all__ = ["Setting", "parse_setting", "slug"]

# a policy part whose spelling has no free text: ':' -> '-' can be read back, so its name is kept as it was
_FIXED_PART = re.compile(r"none|mask:\d+|mask-obs:\d+|ircot:(?:o|oq|oqp)|refine(?:-latest)?:bm25(?::\d+)?")


def legacy_slug(spec: str) -> str:
    """The folder name of attnprobe before issue 38 (``:`` -> ``-``, ``/`` -> ``_``, then
    :func:`attnprobe.io.safe_name`): not one-to-one for specs with a URL or a model name
    (``...:a/b`` and ``...:a_b``); :func:`slug` keeps it only where it is."""
    return safe_name(spec.replace(":", "-").replace("/", "_"), "setting")


def slug(spec: str) -> str:
    """The folder name of a setting's canonical spec, one-to-one and readable.

    A setting made only of parts without free text (``none``, ``mask:K``, ``mask-obs:K``, ``ircot:o|oq|oqp``,
    ``refine:bm25:N``) keeps the name it always had (:func:`legacy_slug`: ``mask:5`` -> ``mask-5``,
    ``ircot:oq+refine:bm25:3`` -> ``ircot-oq_refine-bm25-3-503a6f5b``), since ``:`` -> ``-`` can be read back
    there. A setting with free text (``refine:openai:URL:MODEL``, whose URL and model may hold ``/``, ``_``,
    ``-`` and ``:``) is named by a readable prefix plus ``-`` and 12 hex digits of the SHA-256 of the whole
    spec, so ``...:a/b`` and ``...:a_b`` get two folders. :meth:`StudyLayout.check` refuses two settings of
    one study that would still share a folder (a hash collision, names equal up to case) before anything
    runs. A refiner URL's credentials are not part of it (:func:`attnprobe.io.urls.redact`): the folder of
    ``refine:openai:http://user:pw@h/v1:m`` is that of ``refine:openai:http://***@h/v1:m``, the name study.json
    records it under."""
    spec = redact(spec)
    if all(_FIXED_PART.fullmatch(part) for part in spec.split("+")):
        return legacy_slug(spec)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.replace(":", "-")).strip("._-")[:60] or "setting"
    return f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
