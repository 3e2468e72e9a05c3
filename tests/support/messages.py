"""Hand-built messages for tests: an OpenAI-format tool call."""

from __future__ import annotations

import json


def call(cid: str, name: str, **args) -> dict:
    """One entry of an assistant message's ``tool_calls`` (arguments as a JSON string)."""
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
