"""Open a generation backend by kind: the one place that maps options to a :class:`ChatBackend`.

    chat = open_backend("transformers", model="default")                       # in process
    chat = open_backend("openai", base_url="http://127.0.0.1:8000/v1", served_model="Qwen2.5-7B", concurrency=8)
    chat = open_backend("vllm", model="default", engine={"tensor_parallel_size": 2})  # vLLM in process

Kinds live in :data:`BACKENDS` (kind -> opener); adding one is one function and one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import JobBase
from attnprobe.generation.chat import ChatBackend
from attnprobe.io.options import option, positive_int, positive_seconds
from attnprobe.io.urls import http_url


def _open_transformers(*, model: str, dtype: str, device: str, stop_at_call: bool | None, **_: Any) -> ChatBackend:
    from attnprobe.capture.models import load_model
    from attnprobe.generation.transformers_chat import TransformersChat

    return TransformersChat(load_model(model, dtype=dtype, device=device), stop_at_call=stop_at_call)


def _open_openai(*, model: str, base_url: str | None, served_model: str | None, api_key_env: str, timeout: float,
                 max_reply_bytes: int | None = None, concurrency: int = 1, **_: Any) -> ChatBackend:
    from attnprobe.generation.openai_chat import OpenAIChat

    if not base_url:
        raise AttnprobeError("the openai generation backend needs a base URL (e.g. http://127.0.0.1:8000/v1)")
    cap = {"max_reply_bytes": max_reply_bytes} if max_reply_bytes else {}
    return OpenAIChat(base_url, served_model or model, api_key_env=api_key_env, timeout=timeout,
                      concurrency=concurrency, **cap)


def _open_vllm(*, model: str, dtype: str, stop_at_call: bool | None, engine: dict | None = None,
               capture: bool = False, **_: Any) -> ChatBackend:
    from attnprobe.generation.vllm_chat import VllmChat

    return VllmChat.open(model, dtype=dtype, stop_at_call=stop_at_call, capture=capture, **(engine or {}))


BACKENDS: dict[str, Callable[..., ChatBackend]] = {
    "transformers": _open_transformers,
    "openai": _open_openai,
    "vllm": _open_vllm,
}


def backend_kinds() -> list[str]:
    return list(BACKENDS)


def open_backend(kind: str, *, model: str = "default", dtype: str = "float32", device: str = "cpu",
                 base_url: str | None = None, served_model: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 300.0, stop_at_call: bool | None = None,
                 max_reply_bytes: int | None = None, concurrency: int = 1,
                 engine: dict | None = None, capture: bool = False) -> ChatBackend:
    """A chat backend of ``kind`` ("transformers" | "openai" | "vllm").

    transformers: loads ``model`` (any spec ``load_model`` accepts) with ``dtype`` on ``device``;
    ``stop_at_call`` None = stop generating at a complete call of an offered tool whenever tools are
    offered. openai: ``base_url`` (required), ``served_model`` (default: ``model``), the key from the
    environment variable ``api_key_env``, ``timeout`` seconds per request, replies of at most
    ``max_reply_bytes`` (default :data:`attnprobe.generation.openai_chat.MAX_REPLY_BYTES`), up to
    ``concurrency`` requests in flight per batch. vllm: vLLM's offline engine in process on ``model``
    with ``dtype``; ``engine``: the capture backend's engine options (``tensor_parallel_size``,
    ``chunk_size``, ``max_model_len``, ``kv_cache_gib``, ... see docs/vllm.md). ``capture``: the backend scores
    requests that ask for it while they run (capture in the loop: the vllm engine then carries the capture
    extension; transformers always can; openai cannot: the commands refuse capture with it).
    """
    try:
        opener = BACKENDS[kind]
    except KeyError:
        raise AttnprobeError(f"unknown generation backend {kind!r} (choose from {', '.join(BACKENDS)})") from None
    return opener(model=model, dtype=dtype, device=device, base_url=base_url, served_model=served_model,
                  api_key_env=api_key_env, timeout=timeout, stop_at_call=stop_at_call, max_reply_bytes=max_reply_bytes,
                  concurrency=concurrency, engine=engine, capture=capture)


def chat_for(model: Any, **chat_options: Any) -> ChatBackend:
    """The one way a job's model becomes a chat backend: a loaded model (what a Ray replica holds, or what
    an API caller hands in) is wrapped in the in-process chat with ``chat_options`` (``stop_at_call``, ...);
    anything else is already a chat (an endpoint, vLLM, a scripted chat, a study's own wrapper) and is
    returned as is."""
    from attnprobe.capture.models import LoadedModel

    if isinstance(model, LoadedModel):
        from attnprobe.generation.transformers_chat import TransformersChat

        return TransformersChat(model, **chat_options)
    return model


class ChatJob(JobBase):
    """A job whose ``run`` chats (``needs = "chat"``): :meth:`prepare` makes the executor's model a chat
    through :func:`chat_for` with the job's ``chat_options``, then :meth:`prepare_chat` (default: the chat
    itself) lets the job wrap it once per loaded model."""

    needs = "chat"

    def prepare(self, model: Any) -> Any:
        return self.prepare_chat(chat_for(model, **self.chat_options))

    def prepare_chat(self, chat: Any) -> Any:
        return chat


@dataclass(frozen=True)
class GenerationOptions:
    """The "generation" option group as a record (declared once: :mod:`attnprobe.io.options`): where the
    agent's replies come from. The per-call token limit and temperature are not here: they belong to the
    study's own record (``RunSettings``, ``LoopConfig``, the IBIS options), whose seeds set them apart."""

    generator: str | None = option(
        None, flag="--generator", choices=backend_kinds(),
        help="generate in process with --model (transformers; vllm: vLLM's offline engine with prefix caching, "
             "docs/vllm.md) or through an OpenAI-compatible endpoint (openai); default: openai when --base-url "
             "is given, else transformers")
    base_url: str | None = option(None, flag="--base-url", type=http_url,
                                  help="endpoint for --generator openai, e.g. http://127.0.0.1:8000/v1 (http or "
                                       "https, a host, a port 1-65535)")
    served_model: str | None = option(None, flag="--served-model",
                                      help="model name to request from the endpoint (--generator openai)")
    api_key_env: str = option("OPENAI_API_KEY", flag="--api-key-env",
                              help="environment variable holding the endpoint's API key (default {default})")
    request_timeout: float | None = option(
        None, flag="--request-timeout", type=positive_seconds, metavar="SECONDS",
        help="--generator openai: seconds to wait for a reply, and to read it, per try (default 600 for "
             "study/ibis runs, 300 otherwise; failed tries are retried twice)")
    max_reply_bytes: int | None = option(None, flag="--max-reply-bytes", type=positive_int, metavar="BYTES",
                                         help="--generator openai: the most bytes read from one reply (default "
                                              "8000000)")
    concurrency: int = option(1, flag="--concurrency", type=positive_int, metavar="N",
                              help="--generator openai: requests in flight at once when a batch of calls is sent "
                                   "(default {default}; vLLM, SGLang and hosted APIs batch them)")

    @property
    def kind(self) -> str:
        """The generator: as given, else openai when an endpoint is given, else transformers."""
        return self.generator or ("openai" if self.base_url else "transformers")

    def open(self, *, model: str = "default", dtype: str = "float32", device: str = "cpu", timeout: float = 300.0,
             stop_at_call: bool | None = None, engine: dict | None = None, kind: str | None = None,
             capture: bool = False) -> ChatBackend:
        """The chat backend these options describe (:func:`open_backend`) for the model options' weights;
        ``timeout``: the command's default, which ``--request-timeout`` beats."""
        return open_backend(kind or self.kind, model=model, dtype=dtype, device=device, base_url=self.base_url,
                            served_model=self.served_model, api_key_env=self.api_key_env,
                            timeout=self.request_timeout or timeout, stop_at_call=stop_at_call,
                            max_reply_bytes=self.max_reply_bytes, concurrency=self.concurrency, engine=engine,
                            capture=capture)
