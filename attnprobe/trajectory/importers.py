"""Convert other agents' logs into attnprobe trajectories (validated like any other input).

Supported: plain OpenAI message lists, observation-masking style records
(``qid``/``question``/``full_messages``), smolagents memory messages (``tool-call`` /
``tool-response`` roles with ``Calling tools:`` and ``Call id: ... Observation:`` text) and tag-format
agent logs (Search-R1 / IRCoT: ``<search>``, ``<information>``, ``<answer>`` spans), whose text is kept as
it was and labelled by ``annotations`` (:mod:`attnprobe.trajectory.tags`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnprobe.errors import TrajectoryError
from attnprobe.io import load_json, loads_strict, read_jsonl
from attnprobe.trajectory.schema import Trajectory, message_text
from attnprobe.trajectory.tags import SEARCH_OPEN, TagError, scan

FORMATS = ("openai", "masking", "smolagents", "tags")


def _text(content: Any, path, line, field: str) -> str:
    """message_text for content not validated yet: a wrong type is a located error, not a crash."""
    ok = content is None or isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content))
    if not ok:
        raise TrajectoryError(f"expected a string or a list of text parts, got {type(content).__name__}",
                              path=path, line=line, field=field)
    return message_text(content)


def _id(value: Any, path, line, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise TrajectoryError(f"must be a non-empty string (or an integer), got {value!r}", path=path, line=line,
                              field=field)
    return str(value)


def from_openai_messages(messages: list[dict], *, id: str, task: str | None = None, tools=None,
                         **extra: Any) -> Trajectory:
    """A plain OpenAI chat-messages list (optionally with tools)."""
    record = {"id": id, "messages": messages, "framing": "trace", "meta": {"source": "openai"}}
    if task is None and isinstance(messages, list):
        first = next(((i, m) for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
        task = _text(first[1].get("content"), None, None, f"messages[{first[0]}].content") if first else None
    if task is not None:
        record["task"] = task
    if tools is not None:
        record["tools"] = tools
    record.update(extra)
    return Trajectory.from_dict(record)


def from_masking_record(record: dict, *, path: str | None = None, line: int | None = None) -> Trajectory:
    """An observation-masking style record: {qid, question, full_messages, [answer, correct, ...]}."""
    if not isinstance(record, dict):
        raise TrajectoryError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    for key in ("qid", "full_messages"):
        if key not in record:
            raise TrajectoryError("missing required field", path=path, line=line, field=key)
    if not isinstance(record["full_messages"], list) or not record["full_messages"]:
        raise TrajectoryError("must be a non-empty list of messages", path=path, line=line, field="full_messages")
    labels = {k: record[k] for k in ("answer", "correct", "gold_answer", "is_correct") if k in record}
    meta = {k: v for k, v in record.items() if k not in ("qid", "question", "full_messages", "tools", *labels)}
    meta["source"] = "observation-masking"
    out = {"id": _id(record["qid"], path, line, "qid"), "task": record.get("question"), "framing": record.get("framing", "trace"),
           "messages": record["full_messages"], "labels": labels, "meta": meta}
    if record.get("tools") is not None:
        out["tools"] = record["tools"]
    return Trajectory.from_dict(out, path=path, line=line)


_CALL_ID = re.compile(r"^\s*Call id:\s*(\S+)\s*\n(?:Observation:\s*\n?)?", re.S)


def _role(raw: Any) -> str:
    role = str(raw)
    return role.split(".", 1)[1].lower().replace("_", "-") if role.startswith("MessageRole.") else role


def _parse_calls(text: str, where: str, path, line) -> list[dict]:
    body = text.split("Calling tools:", 1)[1].strip() if "Calling tools:" in text else text.strip()
    try:
        calls = loads_strict(body)
    except json.JSONDecodeError:
        try:
            calls = ast.literal_eval(body)  # smolagents writes a Python repr of the list
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            raise TrajectoryError("cannot parse the tool calls of a tool-call message", path=path, line=line,
                                  field=where) from None
    except (ValueError, RecursionError) as exc:  # valid JSON the strict reader refuses: a duplicate key, NaN
        raise TrajectoryError(f"tool calls: {str(exc).split(';')[0]}", path=path, line=line, field=where) from None
    out = []
    for j, c in enumerate(calls if isinstance(calls, list) else [calls]):
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TrajectoryError(f"tool call {j} has no function name (expected {{'function': {{'name': ...}}}})",
                                  path=path, line=line, field=where)
        args = fn.get("arguments", {})
        if not isinstance(args, str):
            try:
                args = json.dumps(args, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:  # NaN/inf (from a Python repr), sets, ...: not JSON
                raise TrajectoryError(f"tool call {j}: arguments are not JSON ({exc})", path=path, line=line,
                                      field=where) from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def from_smolagents_memory(messages: list[dict], *, id: str, path: str | None = None,
                           line: int | None = None, **extra: Any) -> Trajectory:
    """smolagents ``write_memory_to_messages()`` output (roles system/user/assistant/tool-call/tool-response)."""
    out: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise TrajectoryError("a message must be a JSON object", path=path, line=line, field=f"messages[{i}]")
        role = _role(msg.get("role"))
        text = _text(msg.get("content"), path, line, f"messages[{i}].content")
        if role in ("system", "user"):
            out.append({"role": role, "content": text})
        elif role == "assistant":
            out.append({"role": "assistant", "content": text})
        elif role == "tool-call":
            calls = _parse_calls(text, f"messages[{i}].content", path, line)
            if out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
                out[-1]["tool_calls"] = calls
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif role == "tool-response":
            m = _CALL_ID.match(text)
            call_id = m.group(1) if m else None
            body = text[m.end():] if m else text
            open_calls = [c["id"] for c in (out[-1].get("tool_calls") or [])] if out and out[-1]["role"] == "assistant" else []
            if call_id is None and len(open_calls) == 1:
                call_id = open_calls[0]
            out.append({"role": "tool", "tool_call_id": call_id, "content": body})
        else:
            raise TrajectoryError(f"unknown smolagents role {role!r}", path=path, line=line,
                                  field=f"messages[{i}].role")
    task = next((m["content"] for m in out if m["role"] == "user"), None)
    record = {"id": id, "task": task, "framing": "trace", "messages": out, "meta": {"source": "smolagents"}}
    record.update(extra)
    return Trajectory.from_dict(record, path=path, line=line)


def iter_import(path: str | Path, fmt: str) -> Iterator[Trajectory]:
    """Read a .json or .jsonl log of the given format and yield trajectories."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    path = Path(path)
    if path.suffix == ".json":
        data = load_json(path, error=TrajectoryError, max_bytes=None)
        entries = [(None, d) for d in (data if isinstance(data, list) and fmt == "masking" else [data])]
    else:
        entries = list(read_jsonl(path, error=TrajectoryError))
    if not entries:
        raise TrajectoryError("no records in this file (it is empty)", path=str(path))
    for n, (lineno, rec) in enumerate(entries):
        traj = _import_one(path, fmt, n, lineno, rec)
        traj.origin = f"{path}, line {lineno}" if lineno is not None else (
            f"{path}[{n}]" if len(entries) > 1 else str(path))
        yield traj


def _import_one(path: Path, fmt: str, n: int, lineno: int | None, rec: Any) -> Trajectory:
    default_id = f"{path.stem}-{lineno if lineno is not None else n}"
    where = str(path)
    if fmt == "masking":
        return from_masking_record(rec, path=where, line=lineno)
    if fmt == "tags":
        return from_tag_log(rec, default_id=default_id, path=where, line=lineno)
    messages = rec.get("messages") if isinstance(rec, dict) else rec
    if not isinstance(messages, list):
        raise TrajectoryError("expected a list of messages or an object with 'messages'", path=where,
                              line=lineno, field="messages")
    rid = _id(rec.get("id", default_id), where, lineno, "id") if isinstance(rec, dict) else default_id
    try:
        if fmt == "openai":
            tools = rec.get("tools") if isinstance(rec, dict) else None
            return from_openai_messages(messages, id=rid, tools=tools)
        return from_smolagents_memory(messages, id=rid, path=where, line=lineno)
    except TrajectoryError as exc:
        if exc.path is None:
            raise TrajectoryError(exc.reason, path=where, line=lineno, field=exc.field) from None
        raise


# ------------------------------------------------------------------ tag-format agents (Search-R1 / IRCoT)
_TAG_TEXT_FIELDS = ("response", "output", "completion", "text", "trajectory")
_TAG_PROMPT_FIELDS = ("prompt", "question", "query", "input")


def tag_annotations(role: str, text: str, *, pending: bool = False, path=None, line=None,
                    field: str | None = None) -> tuple[list[dict], bool]:
    """The ``annotations`` of one message of a tag-format agent (:mod:`attnprobe.trajectory.tags`: queries
    ``tool_call``/self, documents ``observation``/external, tags included) and whether a query is left
    unanswered. Assistant text may hold both (a Search-R1 rollout is one text with the documents inserted);
    a user message only documents. Malformed tags are one located error; beyond :func:`scan`'s rules an
    import also refuses a nested ``<search>`` and an empty query (the loop reads those as a query's text and
    as no query; a measured record with either is ambiguous)."""
    try:
        spans, pending = scan(text, searches=role == "assistant", information=True, pending=pending)
    except TagError as exc:
        raise TrajectoryError(str(exc), path=path, line=line, field=field) from None
    for sp in spans:  # stricter than the loop's reading: an import is a record to measure, not a reply to act on
        query = sp.inner(text) if sp.kind == "search" else None
        if query is None:
            continue
        nested = query.find(SEARCH_OPEN)
        if nested >= 0:
            raise TrajectoryError(f"a <search> at character {sp.start + len(SEARCH_OPEN) + nested} inside the query "
                                  f"opened at character {sp.start} (nested <search>)", path=path, line=line,
                                  field=field)
        if not query.strip():
            raise TrajectoryError(f"the <search> at character {sp.start} has an empty query", path=path, line=line,
                                  field=field)
    return [sp.annotation() for sp in spans], pending


def _tag_message(role: str, text: str, anns: list[dict]) -> dict:
    msg: dict[str, Any] = {"role": role, "content": text}
    if anns:
        msg["annotations"] = anns
    return msg


def from_tag_log(record: Any, *, default_id: str, path: str | None = None, line: int | None = None) -> Trajectory:
    """A tag-format agent log, its text kept exactly as the agent saw it, the spans labelled by ``annotations``
    (never re-rendered as tool calls: that would score text the agent never saw).

    - ``{"id", "prompt"|"question"|..., "response"|"output"|...}``: the prompt as the user message and the
      generated text as **one** assistant message. A Search-R1 rollout is one token sequence: the documents
      are inserted into the generation after each ``</search>``, with no message boundary, so none is made.
    - ``{"messages": [...]}``: the agent's own message boundaries (e.g. attnprobe's IRCoT loop, which sends
      each observation as a user message ``<information>...</information>``), kept as they are. User messages
      before the first assistant turn (the instructions, which name the tags) are not read for tags.

    Other fields go to ``meta`` (``answer``, ``golden_answers`` and ``correct``/``score`` to ``labels``)."""
    if not isinstance(record, dict):
        raise TrajectoryError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    rid = _id(record.get("id", default_id), path, line, "id")
    if isinstance(record.get("messages"), list):
        messages, pending, seen_assistant = [], False, False
        for i, msg in enumerate(record["messages"]):
            if not isinstance(msg, dict):
                raise TrajectoryError("a message must be a JSON object", path=path, line=line, field=f"messages[{i}]")
            role = msg.get("role")
            text = _text(msg.get("content"), path, line, f"messages[{i}].content")
            anns: list[dict] = []
            if role == "assistant":
                seen_assistant = True
                anns, pending = tag_annotations(role, text, path=path, line=line, field=f"messages[{i}].content")
            elif role == "user" and seen_assistant:
                anns, pending = tag_annotations(role, text, pending=pending, path=path, line=line,
                                                field=f"messages[{i}].content")
            messages.append(_tag_message(role, text, anns))
        used = {"messages"}
    else:
        tf = next((f for f in _TAG_TEXT_FIELDS if f in record), None)
        if tf is None:
            raise TrajectoryError(f"missing the agent's text (one of {', '.join(_TAG_TEXT_FIELDS)}) or 'messages'",
                                  path=path, line=line, field="response")
        pf = next((f for f in _TAG_PROMPT_FIELDS if f in record), None)
        text = _text(record[tf], path, line, tf)
        anns, _ = tag_annotations("assistant", text, path=path, line=line, field=tf)
        messages = ([{"role": "user", "content": _text(record[pf], path, line, pf)}] if pf else []) + \
            [_tag_message("assistant", text, anns)]
        used = {tf, pf}
    labels = {k: record[k] for k in ("answer", "golden_answers", "correct", "score") if k in record}
    meta = {k: v for k, v in record.items() if k not in used | {"id"} | set(labels)}
    meta["source"] = "tags"
    task = next((m["content"] for m in messages if m["role"] == "user"), None)
    return Trajectory.from_dict({"id": rid, "task": task, "framing": "trace", "messages": messages,
                                 "labels": labels, "meta": meta}, path=path, line=line)
