"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``, ``attnprobe serve``, hosted
APIs), through the ``openai`` package.

The API key comes from the environment variable named by ``api_key_env`` (never from files); without
one, a placeholder is sent (local servers ignore it). Every failure (connection refused, timeout,
HTTP error status, a reply that is not a chat completion) is raised as an :class:`AttnprobeError`
with a one-line message naming the endpoint. When the server returns no structured ``tool_calls``,
calls are parsed from the text by :mod:`attnprobe.generation.toolparse`.
"""

from __future__ import annotations

import os
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.generation.chat import ChatReply, tool_names
from attnprobe.generation.toolparse import call_ids, parse_tool_calls

NO_KEY = "EMPTY"  # sent when the key variable is unset: the client needs one, local servers ignore it


def _one_line(text: Any, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OpenAIChat:
    """Chat completions from an OpenAI-compatible endpoint (see the module docstring).

    ``timeout`` is per request in seconds; ``max_retries`` retries connection errors, timeouts,
    HTTP 408/409/429 and 5xx with backoff (the ``openai`` client's policy).
    """

    kind = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 300.0,
                 max_retries: int = 2):
        import openai

        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.name = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.has_key = bool(os.environ.get(api_key_env))
        self._client = openai.OpenAI(api_key=os.environ.get(api_key_env) or NO_KEY, base_url=self.base_url,
                                     timeout=timeout, max_retries=max_retries)

    def _create(self, payload: dict[str, Any]):
        import openai

        try:
            return self._client.chat.completions.create(**payload)
        except openai.APITimeoutError:
            raise AttnprobeError(f"{self.url}: no reply within {self.timeout:g} s") from None
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

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_tokens: int = 256,
                 temperature: float = 0.0) -> ChatReply:
        messages = [{k: v for k, v in m.items() if k != "annotations"} for m in messages]  # attnprobe's labels
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                   "temperature": temperature}
        if tools:
            payload["tools"] = tools
        resp = self._create(payload)
        if isinstance(resp, (str, bytes)):  # the client hands back a body it could not parse as JSON
            kind = "an HTML page" if str(resp).lstrip()[:1] == "<" else "not JSON"
            raise AttnprobeError(f"{self.url}: the reply is not a chat completion ({kind}: {_one_line(resp, 120)})")
        try:
            choice = resp.choices[0]
            msg = choice.message
            text = msg.content or ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            tool_calls = [{"id": tc.id, "type": tc.type or "function",
                           "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                          for tc in (msg.tool_calls or [])]
            usage = resp.usage
            input_tokens = int(getattr(usage, "prompt_tokens", None) or 0)
            output_tokens = int(getattr(usage, "completion_tokens", None) or 0)
            finish = choice.finish_reason or "stop"
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            raise AttnprobeError(f"{self.url}: malformed chat completion response: {_one_line(resp)}") from None
        content = text
        if not tool_calls:
            content, parsed = parse_tool_calls(text, tool_names(tools))
            tool_calls = [c.to_openai(i) for c, i in zip(parsed, call_ids(messages, len(parsed)))]
            if not tool_calls:
                content = text.strip()
        return ChatReply(content=content, tool_calls=tool_calls, raw_text=text, input_tokens=input_tokens,
                         output_tokens=output_tokens, finish_reason=finish)
