"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``, ``attnprobe serve``, hosted
APIs), through the ``openai`` package.

The API key comes from the environment variable named by ``api_key_env`` (never from files); without
one, a placeholder is sent (local servers ignore it). Every failure (connection refused, timeout,
HTTP error status, a reply that is not a chat completion) is raised as an :class:`AttnprobeError`
with a one-line message naming the endpoint. When the server returns no structured ``tool_calls``,
calls are parsed from the text by :mod:`attnprobe.generation.toolparse`.

The body is read by attnprobe, not the client: at most ``max_reply_bytes`` (a server that streams without
end cannot fill memory) and within ``timeout`` seconds in all (a server that trickles bytes cannot stall a
run); a body that is not UTF-8 JSON is one line naming the URL, with at most 120 characters of it quoted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.generation.chat import DEFAULT_MAX_NEW_TOKENS, ChatReply, ChatRequest, OneByOne, tool_names
from attnprobe.generation.toolparse import call_ids, parse_tool_calls

NO_KEY = "EMPTY"  # sent when the key variable is unset: the client needs one, local servers ignore it
MAX_REPLY_BYTES = 8_000_000  # a reply of 8,192 tokens with logprobs is well under 1 MB


def structured():
    """:mod:`attnprobe.generation.structured` (the action grammars), imported only when a request asks for
    structured actions."""
    import attnprobe.generation.structured as module

    return module


# Usage counts a reply may claim (issue 38): the prompt at most the request body's bytes (every token of what was
# sent is at least one byte of it) plus PROMPT_SLACK for text the server adds (chat-template markers, an injected
# default system prompt); the completion at most the max_new_tokens asked plus COMPLETION_SLACK (an end token some
# servers count); cached tokens at most the prompt's.
PROMPT_SLACK = 1024
COMPLETION_SLACK = 16


def usage_counts(url: str, usage: Any, *, sent_bytes: int, max_new_tokens: int) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of a reply's ``usage``, each checked: a whole number, not negative,
    within what was sent and asked (:data:`PROMPT_SLACK`, :data:`COMPLETION_SLACK`); a missing count is 0.
    Anything else is one :class:`AttnprobeError` line naming the endpoint and the field."""
    if usage is None:
        usage = {}
    if not isinstance(usage, dict):
        raise AttnprobeError(f"{url}: usage is {type(usage).__name__}, not an object")
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        raise AttnprobeError(f"{url}: usage.prompt_tokens_details is {type(details).__name__}, not an object")
    out = []
    for field, value, bound, why in (
            ("prompt_tokens", usage.get("prompt_tokens"), sent_bytes + PROMPT_SLACK,
             f"the request's {sent_bytes:,} bytes + {PROMPT_SLACK}"),
            ("completion_tokens", usage.get("completion_tokens"), max_new_tokens + COMPLETION_SLACK,
             f"max_new_tokens {max_new_tokens} + {COMPLETION_SLACK}"),
            ("prompt_tokens_details.cached_tokens", details.get("cached_tokens"), None, "prompt_tokens")):
        if bound is None:
            bound = out[0]
        if value is None:
            value = 0
        shown = _one_line(repr(value), 40)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or (
                isinstance(value, float) and not value.is_integer()):
            raise AttnprobeError(f"{url}: usage.{field} is {shown}, not a whole number of tokens")
        if value < 0 or value > bound:
            raise AttnprobeError(f"{url}: usage.{field} is {shown}, impossible: outside 0..{bound:,} ({why})")
        out.append(int(value))
    return out[0], out[1], out[2]


def _one_line(text: Any, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OpenAIChat(OneByOne):
    """Chat completions from an OpenAI-compatible endpoint (see the module docstring).

    ``timeout`` is per request in seconds (waiting for the reply, and reading it in all);
    ``max_retries`` retries connection errors, timeouts, HTTP 408/409/429 and 5xx with backoff (the
    ``openai`` client's policy); ``max_reply_bytes`` caps the body read; ``concurrency``: requests in
    flight in :meth:`complete_batch` (``--concurrency``; servers such as vLLM and SGLang batch them).
    A request with ``actions`` carries the guided-decoding options the server documents
    (:func:`attnprobe.generation.structured.openai_extra_body`).
    """

    kind = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 300.0,
                 max_retries: int = 2, max_reply_bytes: int = MAX_REPLY_BYTES, concurrency: int = 1):
        import openai

        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.name = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        if int(concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = int(concurrency)
        # Token counts over this object's life, as the in-process backends keep them (the benchmark reads
        # them): "cached" is what the server says its prefix cache served (usage.prompt_tokens_details).
        self.stats = {"calls": 0, "sent": 0, "cached": 0, "generated": 0}
        self._stats_lock = threading.Lock()
        self.has_key = bool(os.environ.get(api_key_env))
        self._client = openai.OpenAI(api_key=os.environ.get(api_key_env) or NO_KEY, base_url=self.base_url,
                                     timeout=timeout, max_retries=max_retries)

    def _create(self, payload: dict[str, Any]):
        import openai

        try:
            with self._client.chat.completions.with_streaming_response.create(**payload) as raw:
                return self._read(raw)
        except openai.APITimeoutError:
            raise AttnprobeError(f"{self.url}: no reply within {self.timeout:g} s (--request-timeout)") from None
        except openai.APIConnectionError as exc:
            reason = exc.__cause__ or exc
            text = _one_line(reason, 200)
            if "disconnected" in text.lower() or "RemoteProtocolError" in type(reason).__name__:
                raise AttnprobeError(f"{self.url}: the server closed the connection without a reply ({text})") from None
            raise AttnprobeError(f"{self.url}: cannot connect ({text})") from None
        except openai.APIStatusError as exc:
            body = getattr(exc, "message", None) or getattr(exc.response, "text", "")
            hint = ""
            if exc.status_code in (401, 403) and not self.has_key:
                hint = f" (no API key: the variable {self.api_key_env} is not set)"
            raise AttnprobeError(f"{self.url}: HTTP {exc.status_code}: {_one_line(body)}{hint}") from None
        except openai.OpenAIError as exc:  # e.g. a response body the client cannot read
            raise AttnprobeError(f"{self.url}: {type(exc).__name__}: {_one_line(exc)}") from None

    def _read(self, raw) -> Any:
        """The reply's JSON, read within the byte cap and the time limit (see the module docstring)."""
        chunks, size, start = [], 0, time.monotonic()
        try:
            for chunk in raw.iter_bytes():
                size += len(chunk)
                if size > self.max_reply_bytes:
                    raise AttnprobeError(f"{self.url}: the reply exceeds {self.max_reply_bytes:,} bytes (the cap: "
                                         "--max-reply-bytes); not read further")
                if time.monotonic() - start > self.timeout:
                    raise AttnprobeError(f"{self.url}: the reply did not finish within {self.timeout:g} s "
                                         f"({size:,} bytes read; --request-timeout)")
                chunks.append(chunk)
        except AttnprobeError:
            raise
        except Exception as exc:  # the HTTP library's read errors (a timeout, a dropped connection)
            detail = f"{type(exc).__name__}: {_one_line(exc, 120)}"
            if "timeout" in type(exc).__name__.lower():
                raise AttnprobeError(f"{self.url}: the reply stalled for {self.timeout:g} s ({size:,} bytes read; "
                                     "--request-timeout)") from None
            raise AttnprobeError(f"{self.url}: the reply broke off after {size:,} bytes ({detail})") from None
        body = b"".join(chunks)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AttnprobeError(f"{self.url}: the reply is not UTF-8 text (byte {exc.start} of {len(body):,}: "
                                 f"{_one_line(body[max(0, exc.start - 40):exc.start + 40], 120)})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            kind = "an HTML page" if text.lstrip()[:1] == "<" else \
                "not JSON" if exc.pos == 0 else f"broken JSON at character {exc.pos}"
            raise AttnprobeError(f"{self.url}: the reply is not a chat completion ({kind}: "
                                 f"{_one_line(text, 120)})") from None

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 temperature: float = 0.0) -> ChatReply:
        return self._complete(ChatRequest(messages, tools, max_new_tokens=max_new_tokens, temperature=temperature))

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        """One reply per request, in order, with up to ``concurrency`` requests in flight.

        One client serves every thread: the ``openai`` client (an ``httpx.Client`` underneath, whose
        connection pool is thread-safe) is meant to be shared, and one pool reuses connections across
        turns. Each request is exactly what :meth:`complete` sends (call ids come from its own messages,
        so they do not depend on the order replies arrive in). A failure fails the batch with the error
        line of the first failed request in request order, the one a sequential loop would have met;
        requests not yet started are then not sent."""
        requests = list(requests)
        if self.concurrency <= 1 or len(requests) <= 1:
            return [self._complete(r) for r in requests]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)),
                                thread_name_prefix="attnprobe-openai") as pool:
            futures = [pool.submit(self._complete, r) for r in requests]
            replies = []
            for fut in futures:
                try:
                    replies.append(fut.result())
                except BaseException:
                    for rest in futures:
                        rest.cancel()
                    raise
        return replies

    def _complete(self, request: ChatRequest) -> ChatReply:
        if request.prompt_ids is not None:
            raise AttnprobeError(f"{self.url}: a chat endpoint is sent messages, not a token sequence: the Search-R1 "
                                 "stream (--ircot-form stream) runs in process (--generator transformers or vllm); "
                                 "--ircot-form chat runs the multi-turn form against a server")
        messages = [{k: v for k, v in m.items() if k != "annotations"} for m in request.messages]  # our labels
        tools, max_new_tokens = request.tools, request.max_new_tokens
        # the OpenAI API's name for the generation limit is max_tokens (the wire's; max_new_tokens here)
        payload: dict[str, Any] = {"model": self.model, "messages": messages,  # a limit is always sent
                                   "max_tokens": DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
                                   "temperature": request.temperature}
        if tools:
            payload["tools"] = tools
        if request.actions is not None:
            payload["extra_body"] = structured().openai_extra_body(request.actions)
        resp = self._create(payload)
        try:
            choice = resp["choices"][0]
            msg = choice["message"]
            text = msg.get("content") or ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            tool_calls = [{"id": tc["id"], "type": tc.get("type") or "function",
                           "function": {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}}
                          for tc in (msg.get("tool_calls") or [])]
            finish = choice.get("finish_reason") or "stop"
            reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None  # as the release reads it
            if reasoning is not None and not isinstance(reasoning, str):
                raise TypeError("reasoning is not a string")
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            raise AttnprobeError(f"{self.url}: malformed chat completion response: "
                                 f"{_one_line(json.dumps(resp)[:400])}") from None
        input_tokens, output_tokens, cached = usage_counts(
            self.url, resp.get("usage"), sent_bytes=len(json.dumps(payload, ensure_ascii=False).encode("utf-8")),
            max_new_tokens=payload["max_tokens"])
        with self._stats_lock:
            for key, n in (("calls", 1), ("sent", input_tokens), ("cached", cached), ("generated", output_tokens)):
                self.stats[key] += n
        content = text
        if not tool_calls:
            content, parsed = parse_tool_calls(text, tool_names(tools))
            tool_calls = [c.to_openai(i) for c, i in zip(parsed, call_ids(messages, len(parsed)))]
            if not tool_calls:
                content = text.strip()
        return ChatReply(content=content, tool_calls=tool_calls, raw_text=text, input_tokens=input_tokens,
                         output_tokens=output_tokens, finish_reason=finish, reasoning_content=reasoning)
