"""attnprobe.generation: text generation for the runner and IBIS.

- :mod:`~attnprobe.generation.chat`: :class:`ChatReply` (the one reply type) and the :class:`ChatBackend` protocol;
- :mod:`~attnprobe.generation.transformers_chat`: in-process transformers generation (stop at call, batches,
  forced-choice log-probabilities);
- :mod:`~attnprobe.generation.openai_chat`: any OpenAI-compatible endpoint (the ``openai`` package);
- :mod:`~attnprobe.generation.factory`: :func:`open_backend` (kind -> backend registry);
- :mod:`~attnprobe.generation.server`: the OpenAI-compatible server (``attnprobe serve``);
- :mod:`~attnprobe.generation.toolparse`: the one tool-call parser.
"""

from attnprobe.generation.chat import ChatBackend, ChatReply, Prompt
from attnprobe.generation.factory import BACKENDS, open_backend
from attnprobe.generation.openai_chat import OpenAIChat
from attnprobe.generation.transformers_chat import TransformersChat

__all__ = ["BACKENDS", "ChatBackend", "ChatReply", "OpenAIChat", "Prompt", "TransformersChat", "open_backend"]
