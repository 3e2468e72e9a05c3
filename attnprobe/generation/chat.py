"""Chat backends used to *generate* (the runner and IBIS behaviour): in-process transformers and
any OpenAI-compatible endpoint. Both return a :class:`ChatReply` with parsed tool calls and token
counts, so every call can be recorded as a trajectory exactly as sent and received.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol

from attnprobe.errors import AttnprobeError
from attnprobe.generation.toolparse import parse_tool_calls


@dataclass
class ChatReply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI format, arguments as JSON strings
    raw_text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "stop"

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


class ChatBackend(Protocol):
    name: str

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_tokens: int = 256,
                 temperature: float = 0.0) -> ChatReply: ...


def _tool_names(tools: list[dict] | None) -> list[str] | None:
    return [t["function"]["name"] for t in tools] if tools else None


class TransformersChat:
    """Greedy (or sampled) generation with a loaded transformers model.

    The prompt is rendered exactly as ``capture`` renders it (same fallbacks), so a recorded call
    can be captured later and the model sees identical tokens.
    """

    def __init__(self, loaded, *, call_prefix: str = "call"):
        self.loaded = loaded
        self.name = loaded.name
        self._n = 0
        self.call_prefix = call_prefix

    def complete(self, messages, tools=None, *, max_tokens=256, temperature=0.0) -> ChatReply:
        import torch

        from attnprobe.render.rendering import render
        from attnprobe.trajectory.schema import Trajectory

        traj = Trajectory(id="prompt", messages=messages, tools=tools)
        rendered = render(traj, self.loaded.tokenizer, add_generation_prompt=True)
        ids = torch.as_tensor(rendered.input_ids)[None]
        tok = self.loaded.tokenizer
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0,
                                      "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id}
        if temperature > 0:
            gen_kwargs["temperature"] = temperature
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
        new = out[0, ids.shape[1]:]
        finish = "length" if len(new) >= max_tokens else "stop"
        text = tok.decode(new, skip_special_tokens=True)
        content, calls = parse_tool_calls(text, _tool_names(tools))
        tool_calls = []
        for c in calls:
            self._n += 1
            tool_calls.append(c.to_openai(f"{self.call_prefix}{self._n}"))
        return ChatReply(content=content if tool_calls else text.strip(), tool_calls=tool_calls, raw_text=text,
                         input_tokens=int(ids.shape[1]), output_tokens=int(len(new)),
                         finish_reason="tool_calls" if tool_calls else finish)


class OpenAIChat:
    """Any OpenAI-compatible /v1/chat/completions endpoint (vllm serve, attnprobe serve, hosted APIs).

    The API key comes from the environment variable named by ``api_key_env`` (never from files).
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 300.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = model
        self.api_key = os.environ.get(api_key_env, "")
        self.timeout = timeout

    def _post(self, path: str, payload: dict) -> dict:
        req = urllib.request.Request(self.base_url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")[:500]
            raise AttnprobeError(f"{self.base_url}{path}: HTTP {exc.code}: {body}") from None
        except urllib.error.URLError as exc:
            raise AttnprobeError(f"{self.base_url}{path}: cannot connect ({exc.reason})") from None

    def complete(self, messages, tools=None, *, max_tokens=256, temperature=0.0) -> ChatReply:
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                   "temperature": temperature}
        if tools:
            payload["tools"] = tools
        data = self._post("/chat/completions", payload)
        try:
            choice = data["choices"][0]
            msg = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise AttnprobeError(f"{self.base_url}: malformed chat completion response: {str(data)[:300]}") from None
        text = msg.get("content") or ""
        tool_calls = msg.get("tool_calls") or []
        content = text
        if not tool_calls:
            content, parsed = parse_tool_calls(text, _tool_names(tools))
            tool_calls = [c.to_openai(f"call{i + 1}") for i, c in enumerate(parsed)]
            if not tool_calls:
                content = text.strip()
        usage = data.get("usage") or {}
        return ChatReply(content=content, tool_calls=tool_calls, raw_text=text,
                         input_tokens=int(usage.get("prompt_tokens", 0)),
                         output_tokens=int(usage.get("completion_tokens", 0)),
                         finish_reason=choice.get("finish_reason") or "stop")
