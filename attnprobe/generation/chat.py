"""The one reply type, the one request type and the protocol every generation backend follows.

Backends (see :mod:`attnprobe.generation.factory`): in-process transformers
(:mod:`attnprobe.generation.transformers_chat`) and any OpenAI-compatible endpoint
(:mod:`attnprobe.generation.openai_chat`). Both return a :class:`ChatReply` with parsed tool calls
and token counts, so every call can be recorded as a trajectory exactly as sent and received.

Batches: a closed-loop study steps all of its active episodes together and sends one
:class:`ChatRequest` per episode to :meth:`ChatBackend.complete_batch`. A backend answers them in the
same order, however it schedules them (one padded batch, an engine's batch, N requests in flight);
:class:`OneByOne` is the plain fallback, one :meth:`complete` after another. ``episode`` names the
episode a request belongs to: an in-process backend may keep that episode's KV cache between turns
and prefill only what is new (:meth:`ChatBackend.end_episode` frees it). ``actions`` asks for a reply
that follows the scaffold's action grammar (``--structured-actions``; None: free decoding, as the
seeds decode). ``capture`` asks an in-process backend to score the call's attention while it generates
(:mod:`attnprobe.generation.capturing`, issue 40); the reply's ``capture`` holds the scores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from attnprobe.generation.capturing import CaptureSpec, LoopCapture

RAW_ARGUMENTS = "raw_arguments"  # a tool call's arguments as the model wrote them, when they are no JSON object


def normal_tool_call(call: Any) -> Any:
    """A model's tool call in the form the trajectory schema accepts and a model is sent back: the id and the
    name as strings (a server may send an integer; no name is ``unnamed``), the arguments as JSON text (a server may send an object: its
    JSON text, as the model is then sent it). Arguments that are not a JSON object (text that is not JSON,
    a list, a number) become ``"{}"`` and their text is kept in the call's own field :data:`RAW_ARGUMENTS`:
    the call cannot be run, and whoever runs it answers with an error (the loop's browser does). Idempotent;
    anything that is not a call object is left for the schema to refuse."""
    from attnprobe.trajectory.schema import ArgumentsError, call_arguments

    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    out, fn = dict(call), dict(call["function"])
    name = fn.get("name")
    if name is None or (isinstance(name, str) and not name.strip()):
        fn["name"] = "unnamed"
    elif not isinstance(name, str):  # a number, a list: its JSON text (a name no tool has)
        fn["name"] = json.dumps(name, ensure_ascii=False)
    if out.get("id") is not None and not isinstance(out["id"], str):
        out["id"] = json.dumps(out["id"], ensure_ascii=False) if not isinstance(out["id"], int) else str(out["id"])
    args = fn.get("arguments", "{}")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    try:
        ok = isinstance(call_arguments({"arguments": text}), dict)
    except ArgumentsError:
        ok = False
    if ok:
        fn["arguments"] = text
    else:
        fn["arguments"] = "{}"
        out[RAW_ARGUMENTS] = text
    out["function"] = fn
    return out


@dataclass
class Prompt:
    """The prompt exactly as an in-process model saw it."""

    ids: list[int]
    text: str
    rendering: str  # the render mode that was used (native, text, ...)


@dataclass
class ChatReply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI format, normalised (normal_tool_call)
    raw_text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "stop"  # OpenAI semantics: tool_calls | length | stop (or what a server said)
    # Why in-process generation ended: "eos" (the tokenizer's end-of-sequence token came last),
    # "length" (max_new_tokens reached) or "other" (the stop-at-call rule or another stop token);
    # "" when unknown (a server's reply).
    stopped_by: str = ""
    prompt: Prompt | None = None  # in-process backends only
    # the reasoning an endpoint returned apart from the content (vLLM's reasoning parsers: message
    # "reasoning_content" or "reasoning"); None when it gave none (in process it stays in the text)
    reasoning_content: str | None = None
    # the attention scored while generating, when the request asked for it (``ChatRequest.capture``; issue 40)
    capture: LoopCapture | None = None

    def __post_init__(self) -> None:  # every backend's calls in one form (ids strings, arguments JSON text)
        self.tool_calls = [normal_tool_call(c) for c in self.tool_calls or []]

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(frozen=True)
class ActionFormat:
    """The action grammar a structured reply must follow (:mod:`attnprobe.generation.structured` turns it
    into a grammar for each backend). ``scaffold``: "ircot" (``<think>`` then ``<search>`` or ``<answer>``),
    "seed002" (tool calls of ``tools`` or a final response with an ``Exact Answer:`` line), or the
    NIS-Agent runner's formats; ``tools``: the offered tool schemas as one JSON text (hashable, so a
    backend can cache the compiled grammar); ``final``: only an answer is allowed (IRCoT's final call);
    ``max_new_tokens``: the reply's token budget, so that the free-text fields get token caps and an action
    always closes within it (0: character bounds only; token caps apply in process, where llguidance
    counts tokens)."""

    scaffold: str
    tools: str = ""
    final: bool = False
    max_new_tokens: int = 0


DEFAULT_MAX_NEW_TOKENS = 256  # a chat call's generation limit when its caller names none

@dataclass
class ChatRequest:
    """One model call of a batch (see the module docstring)."""

    messages: list[dict]
    tools: list[dict] | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    episode: str | None = None
    actions: ActionFormat | None = None
    # The prompt as token ids, sent as they are (a Search-R1 sequence, attnprobe.agents.searchr1: pieces
    # tokenized apart, which no rendering of ``messages`` reproduces); ``messages`` then say what they hold.
    # In-process backends only (request_prompt); a chat endpoint refuses it.
    prompt_ids: list[int] | None = None
    # Score the call's attention while generating it (in-process backends only; see
    # attnprobe.generation.capturing): the reply's ``capture`` holds the scores.
    capture: CaptureSpec | None = None


def request_prompt(request: ChatRequest, render, tokenizer) -> Prompt:
    """The prompt of ``request`` in process: its ``prompt_ids`` as they are, else ``render(messages, tools)``."""
    if request.prompt_ids is None:
        return render(request.messages, request.tools)
    ids = [int(t) for t in request.prompt_ids]
    return Prompt(ids=ids, text=tokenizer.decode(ids, skip_special_tokens=False), rendering="tokens")


class ChatBackend(Protocol):
    kind: str  # the factory's registry key: "transformers" | "openai"
    name: str  # the model name recorded with every call

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 temperature: float = 0.0) -> ChatReply: ...

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        """One reply per request, in order."""

    def end_episode(self, episode: str) -> None:
        """The episode is finished: free whatever was kept for it."""


class OneByOne:
    """``complete_batch`` as one ``complete`` after another, and nothing kept per episode: the default of
    a backend that cannot batch (a test's scripted chat). Structured actions need a backend that
    implements them, so a request with ``actions`` is refused here."""

    accepts_token_prompts = False  # a scripted chat that reads the messages a token prompt is labelled with

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        out = []
        for r in requests:
            if r.actions is not None:
                raise ValueError(f"{type(self).__name__} cannot constrain replies to an action grammar")
            if r.prompt_ids is not None and not self.accepts_token_prompts:
                raise ValueError(f"{type(self).__name__} cannot be sent a prompt as token ids here")
            if r.capture is not None:
                raise ValueError(f"{type(self).__name__} cannot capture attention while generating (in-process "
                                 "backends only; capture such a study afterwards with 'study attention')")
            out.append(self.complete(r.messages, r.tools, max_new_tokens=r.max_new_tokens, temperature=r.temperature))
        return out

    def end_episode(self, episode: str) -> None:
        return None


def tool_names(tools: list[dict] | None) -> list[str] | None:
    """Names of the offered tools (OpenAI tool schema), or None when no tools are offered."""
    return [t["function"]["name"] for t in tools] if tools else None
