"""attnprobe_hooks: capture hooks for each backend, plus the backend-neutral scoring math.

Installed under the import name ``attnprobe_hooks`` (folder ``hooks/``) so that it cannot clash
with other packages called ``hooks``.
"""

from attnprobe_hooks.scoring import QueryScorer, score_query_rows

__all__ = ["QueryScorer", "score_query_rows"]
