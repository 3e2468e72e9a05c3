"""attnprobe_hooks: the capture backends, their protocol and registry, and the backend-neutral scoring math.

- ``backend``: the :class:`~attnprobe_hooks.backend.CaptureBackend` protocol, ``CapturePlan`` /
  ``BackendOutput``, ``LoadedModel`` and the registry (``register``, ``get_backend``);
- ``scoring``: :class:`QueryScorer` and :func:`score_query_rows` (online softmax rows reduced to
  segment sums), shared by every backend;
- ``transformers``: the registered attention function and the chunked prefill;
- ``vllm``: the vLLM backend (driver, worker extension, step-to-plan matching, layer discovery).

Installed under the import name ``attnprobe_hooks`` (folder ``hooks/``) so that it cannot clash
with other packages called ``hooks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnprobe_hooks.scoring import QueryScorer, score_query_rows

__all__ = ["QueryScorer", "score_query_rows"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the registry (attnprobe_hooks.backend) does not import torch.
    if name in __all__:
        from attnprobe_hooks import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
