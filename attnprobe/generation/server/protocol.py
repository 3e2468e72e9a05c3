"""The request protocol of ``attnprobe serve``: what a /v1/chat/completions body may hold, the limits a
request runs under, and the OpenAI-style error every refusal becomes. No sockets, no model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from attnprobe.errors import TrajectoryError
from attnprobe.generation.chat import DEFAULT_MAX_NEW_TOKENS
from attnprobe.io import loads_strict

DEFAULT_MAX_BODY_BYTES = 8 << 20  # 8 MiB: far above any prompt a context window holds
DEFAULT_READ_TIMEOUT = 30.0  # seconds per socket read
DEFAULT_REQUEST_TIMEOUT = 120.0  # seconds to receive a whole request (line, headers, body)
DEFAULT_MAX_QUEUE = 16  # requests generating or waiting their turn; more are answered 503 at once
DEFAULT_CONTEXT = 8192  # prompt-token limit when the model config names no context length


# Fields that ask a server to constrain the reply (vLLM's structured_outputs and guided_*, SGLang's ebnf / regex /
# json_schema, OpenAI's response_format beyond plain text). attnprobe serve decodes freely, so it refuses them
# rather than answer with free text that a client would record as constrained (issue 38).
STRUCTURED_FIELDS = ("structured_outputs", "guided_grammar", "guided_json", "guided_regex", "guided_choice", "ebnf",
                     "regex", "json_schema")


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "authentication_error" if self.status == 401 else (
            "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may cost. ``max_prompt_tokens`` None = the model's context length."""

    max_prompt_tokens: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_seconds: float | None = None
    api_key: str | None = None
    max_queue: int = DEFAULT_MAX_QUEUE


def context_length(loaded) -> int:
    """The model's context window from its config (``max_position_embeddings``), else DEFAULT_CONTEXT."""
    n = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else DEFAULT_CONTEXT


def parse_chat_request(body: bytes, *, max_new_tokens_cap: int) -> dict:
    """The validated fields of a /v1/chat/completions body, or a RequestError(400) naming the problem.

    Messages and tools go through the trajectory schema (:func:`~attnprobe.trajectory.schema.validate_record`),
    the one place that says what a message may hold, so the server accepts exactly what capture can render.
    """
    from attnprobe.trajectory.schema import validate_record

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"body is not valid UTF-8 (byte {exc.start})") from None
    try:
        req = loads_strict(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                           ) from None
    except RecursionError:
        raise RequestError(400, "body JSON is nested too deeply") from None
    except ValueError as exc:  # a duplicate key, NaN/Infinity, an integer of more than 4300 digits
        raise RequestError(400, f"body is not valid JSON ({str(exc).split(';')[0]})") from None
    if not isinstance(req, dict):
        raise RequestError(400, f"body must be a JSON object, got {type(req).__name__}")
    if req.get("stream"):
        raise RequestError(400, "stream=true is not supported by attnprobe serve: send the request without "
                                "'stream' (the whole reply comes in one response)", param="stream")
    asked = [f for f in STRUCTURED_FIELDS if req.get(f) is not None]
    fmt = req.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        asked.append("response_format")
    if asked:
        raise RequestError(400, f"{asked[0]} is not supported by attnprobe serve: it decodes freely and cannot "
                                "constrain a reply to a grammar or schema (for structured actions use --generator "
                                "transformers in process, or a vLLM or SGLang server)", param=asked[0])
    if req.get("n") not in (None, 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    if "messages" not in req:
        raise RequestError(400, "missing required field 'messages'", param="messages")
    try:
        validate_record({"id": "request", "messages": req["messages"], "tools": req.get("tools")})
    except TrajectoryError as exc:
        raise RequestError(400, f"{exc.field}: {exc.reason}" if exc.field else exc.reason, param=exc.field) from None
    max_new_tokens = req.get("max_completion_tokens")
    if max_new_tokens is None:
        max_new_tokens = req.get("max_tokens")  # the OpenAI wire names the generation limit max_tokens
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_cap)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= max_new_tokens_cap:
        raise RequestError(400, f"max_tokens must be an integer from 1 to {max_new_tokens_cap}, got {max_new_tokens!r}",
                           param="max_tokens")
    temperature = req.get("temperature")
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise RequestError(400, f"temperature must be a number >= 0, got {temperature!r}", param="temperature")
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"model must be a string, got {type(model).__name__}", param="model")
    return {"messages": req["messages"], "tools": req.get("tools") or None, "max_new_tokens": max_new_tokens,
            "temperature": float(temperature), "model": model if isinstance(model, str) else None}
