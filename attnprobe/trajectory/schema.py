"""The trajectory data model: OpenAI-style chat messages plus run metadata, stored as JSON Lines.

Validation happens on load so that every later stage can trust the structure; errors name the
file, the line and the field. Unknown fields are kept and written back unchanged.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.errors import TrajectoryError
from attnprobe.io import load_json, loads_strict, read_jsonl, unique_names, write_jsonl

ROLES = ("system", "user", "assistant", "tool")
KNOWN_KEYS = ("id", "task", "model", "framing", "tools", "messages", "labels", "meta")
ANNOTATION_ROLES = ("system", "task", "reasoning", "tool_call", "observation", "template")


CHARS_PER_TOKEN = 3.5  # message JSON characters per token, for cost estimates (Trajectory.estimated_tokens)


@dataclass
class Trajectory:
    """One recorded model context: the messages exactly as the model saw them."""

    id: str
    messages: list[dict[str, Any]]
    task: str | None = None
    model: str | None = None
    framing: str = "trace"
    tools: list[dict[str, Any]] | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    origin: str | None = field(default=None, compare=False, repr=False)  # "file, line N" it was read from

    @classmethod
    def from_dict(cls, record: Any, *, path: str | None = None, line: int | None = None) -> Trajectory:
        validate_record(record, path=path, line=line)
        record = copy.deepcopy(record)
        return cls(
            id=str(record["id"]),
            messages=record["messages"],
            task=record.get("task"),
            model=record.get("model"),
            framing=record.get("framing") or "trace",
            tools=record.get("tools"),
            labels=record.get("labels") or {},
            meta=record.get("meta") or {},
            extra={k: v for k, v in record.items() if k not in KNOWN_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.task is not None:
            out["task"] = self.task
        if self.model is not None:
            out["model"] = self.model
        out["framing"] = self.framing
        if self.tools is not None:
            out["tools"] = self.tools
        out["messages"] = self.messages
        out["labels"] = self.labels
        out["meta"] = self.meta
        out.update(self.extra)
        return copy.deepcopy(out)

    def content_hash(self) -> str:
        """16 hex digits over everything the record holds (canonical JSON): a capture resumes only
        when the trajectory it was made from is unchanged."""
        canon = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]

    def estimated_tokens(self, cap: int | None = None) -> int:
        """Tokens estimated from the message (and tool) JSON, no tokenizer needed: Ray balances work by
        it on a driver that never loads the model. Measured on the shipped samples with the SmolLM2
        tokenizer: 3.4-3.6 characters per token; only relative sizes matter, so one constant serves."""
        chars = len(json.dumps(self.messages, ensure_ascii=False))
        if self.tools:
            chars += len(json.dumps(self.tools, ensure_ascii=False))
        est = max(1, round(chars / CHARS_PER_TOKEN))
        return min(est, cap) if cap else est

    @property
    def num_turns(self) -> int:
        return max(1, sum(1 for m in self.messages if m["role"] == "assistant"))


def _fail(msg: str, path, line, fld):
    raise TrajectoryError(msg, path=path, line=line, field=fld)


def _check_str(value, fld, path, line, *, allow_none=False, allow_empty=True):
    if value is None and allow_none:
        return
    if not isinstance(value, str):
        _fail(f"expected a string, got {type(value).__name__}", path, line, fld)
    if not allow_empty and not value.strip():
        _fail("must not be empty", path, line, fld)


def message_text(content: Any) -> str:
    """Plain text of a message's content (a string or a list of OpenAI text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def validate_record(record: Any, *, path: str | None = None, line: int | None = None) -> None:
    """Raise TrajectoryError (file, line, field) for anything later stages could not handle."""
    if not isinstance(record, dict):
        _fail(f"a trajectory must be a JSON object, got {type(record).__name__}", path, line, None)
    if "id" not in record:
        _fail("missing required field", path, line, "id")
    if isinstance(record["id"], bool) or not isinstance(record["id"], (str, int)) or str(record["id"]).strip() == "":
        _fail(f"must be a non-empty string (or an integer), got {record['id']!r}", path, line, "id")
    for key in ("task", "model", "framing"):
        _check_str(record.get(key), key, path, line, allow_none=True)
    for key in ("labels", "meta"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            _fail("expected an object", path, line, key)
    tools = record.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            _fail("expected a list", path, line, "tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                _fail("expected {'type': 'function', 'function': {'name': ...}}", path, line, f"tools[{i}]")
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                _fail(f"expected a JSON Schema object, got {type(fn['parameters']).__name__}", path, line,
                      f"tools[{i}].function.parameters")
            _check_str(fn.get("description"), f"tools[{i}].function.description", path, line, allow_none=True)
    messages = record.get("messages")
    if messages is None:
        _fail("missing required field", path, line, "messages")
    if not isinstance(messages, list) or not messages:
        _fail("must be a non-empty list of messages", path, line, "messages")
    open_calls: list[str] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            _fail("a message must be a JSON object", path, line, where)
        role = msg.get("role")
        if role not in ROLES:
            _fail(f"role must be one of {', '.join(ROLES)}; got {role!r}", path, line, f"{where}.role")
        content = msg.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    _fail("only text parts {'type': 'text', 'text': ...} are supported", path, line,
                          f"{where}.content[{j}]")
        elif content is not None and not isinstance(content, str):
            _fail(f"expected a string, a list of text parts or null, got {type(content).__name__}",
                  path, line, f"{where}.content")
        _check_str(msg.get("reasoning_content"), f"{where}.reasoning_content", path, line, allow_none=True)
        if role != "assistant":
            if content is None:
                _fail("missing content", path, line, f"{where}.content")
            for key in ("tool_calls", "reasoning_content"):
                if msg.get(key):
                    _fail(f"only assistant messages may have {key}", path, line, f"{where}.{key}")
        calls = msg.get("tool_calls") or []
        if role == "assistant":
            if not isinstance(calls, list):
                _fail("expected a list", path, line, f"{where}.tool_calls")
            if not calls and not message_text(content).strip() and not (msg.get("reasoning_content") or "").strip():
                _fail("an assistant message needs content, reasoning_content or tool_calls", path, line, where)
            open_calls = []
            for j, call in enumerate(calls):
                cw = f"{where}.tool_calls[{j}]"
                if not isinstance(call, dict):
                    _fail("a tool call must be an object", path, line, cw)
                fn = call.get("function")
                if not isinstance(fn, dict):
                    _fail("missing 'function' object", path, line, f"{cw}.function")
                _check_str(fn.get("name"), f"{cw}.function.name", path, line, allow_empty=False)
                args = fn.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        parsed = call_arguments(fn)
                    except ArgumentsError as exc:
                        _fail(f"arguments are not valid JSON ({exc.detail})", path, line, f"{cw}.function.arguments")
                    if not isinstance(parsed, dict):
                        _fail("arguments must encode a JSON object", path, line, f"{cw}.function.arguments")
                elif not isinstance(args, dict):
                    _fail("arguments must be a JSON string or an object", path, line, f"{cw}.function.arguments")
                if call.get("id") is not None:
                    _check_str(call["id"], f"{cw}.id", path, line)
                    open_calls.append(call["id"])
        if role == "tool":
            prev = messages[i - 1] if i else None
            if not (isinstance(prev, dict) and (prev.get("role") == "tool" or
                                                (prev.get("role") == "assistant" and prev.get("tool_calls")))):
                _fail("a tool message must follow an assistant message with tool_calls (or another tool message)",
                      path, line, f"{where}.role")
            tcid = msg.get("tool_call_id")
            if tcid is not None:
                _check_str(tcid, f"{where}.tool_call_id", path, line)
                if open_calls and tcid not in open_calls:
                    _fail(f"answers no tool call of the preceding assistant message (open calls: "
                          f"{', '.join(open_calls)})", path, line, f"{where}.tool_call_id")
        anns = msg.get("annotations")
        if anns is not None:
            text = message_text(content)
            if not isinstance(anns, list):
                _fail("expected a list", path, line, f"{where}.annotations")
            for j, ann in enumerate(anns):
                aw = f"{where}.annotations[{j}]"
                if not isinstance(ann, dict):
                    _fail("expected {'start', 'end', 'role'}", path, line, aw)
                s, e = ann.get("start"), ann.get("end")
                if not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(text)):
                    _fail(f"start/end must satisfy 0 <= start < end <= {len(text)} (content length)",
                          path, line, aw)
                if ann.get("role") not in ANNOTATION_ROLES:
                    _fail(f"role must be one of {', '.join(ANNOTATION_ROLES)}", path, line, f"{aw}.role")
                if ann.get("author", "external") not in ("self", "external"):
                    _fail("author must be 'self' or 'external'", path, line, f"{aw}.author")
                t = ann.get("turn", 0)
                if not (isinstance(t, int) and not isinstance(t, bool) and t >= 0):
                    _fail("turn (turns after the message's own) must be an integer >= 0", path, line, f"{aw}.turn")


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Load and validate every trajectory of a .jsonl file (or a .json list/object)."""
    return list(iter_trajectories(path))


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Validated trajectories of one file, each with its ``origin``. A file with none is an error
    (an empty input is a mistake, not a successful run over nothing)."""
    path = Path(path)
    if not path.exists():
        raise TrajectoryError("file not found", path=str(path))
    count = 0
    if path.suffix == ".json":
        data = load_json(path, error=TrajectoryError, max_bytes=None)
        records = data if isinstance(data, list) else [data]
        for i, rec in enumerate(records):
            where = f"{path}[{i}]" if isinstance(data, list) else str(path)
            traj = Trajectory.from_dict(rec, path=where)
            traj.origin = where
            count += 1
            yield traj
    else:
        seen: dict[str, int] = {}
        for lineno, rec in read_jsonl(path, error=TrajectoryError):
            traj = Trajectory.from_dict(rec, path=str(path), line=lineno)
            if traj.id in seen:
                raise TrajectoryError(f"duplicate id {traj.id!r} (first on line {seen[traj.id]})",
                                      path=str(path), line=lineno, field="id")
            seen[traj.id] = lineno
            traj.origin = f"{path}, line {lineno}"
            count += 1
            yield traj
    if not count:
        raise TrajectoryError("no trajectories in this file (it is empty)", path=str(path))


def check_unique_ids(trajs: Iterable[Trajectory]) -> None:
    """Refuse two trajectories with one id (across files too): their results would share one folder
    or one record, and one would silently replace the other. The message names both places."""
    first: dict[str, Trajectory] = {}
    for t in trajs:
        if t.id in first:
            raise TrajectoryError(f"duplicate trajectory id {t.id!r}: also at {first[t.id].origin or '?'}; "
                                  "ids must be unique across all inputs", path=t.origin or None, field="id")
        first[t.id] = t


ARGUMENT_ERRORS = ("raise", "raw", "input", "empty")


class ArgumentsError(ValueError):
    """A tool call's arguments text is not JSON; ``detail`` is the decoder's reason."""

    def __init__(self, name: Any, detail: str):
        super().__init__(f"tool call {name!r}: arguments are not JSON ({detail})")
        self.detail = detail


def call_arguments(call: dict, *, on_error: str = "raise", dict_only: bool = False) -> Any:
    """The decoded arguments of one tool call: an OpenAI call (``{"function": {"name", "arguments"}}``)
    or its bare function dict. Arguments are JSON text (decoded; blank text is ``{}``) or already a
    value. Text that is not JSON: ``on_error`` "raise" (:class:`ArgumentsError`), "raw" (``{"raw": text}``),
    "input" (``{"input": text}``) or "empty" (``{}``). ``dict_only``: a decoded value that is not an
    object becomes ``{"input": value}`` with on_error "input", else ``{}``."""
    if on_error not in ARGUMENT_ERRORS:
        raise ValueError(f"on_error must be one of {ARGUMENT_ERRORS}, got {on_error!r}")
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    args = fn.get("arguments", {})
    if isinstance(args, str):
        if not args.strip():
            return {}
        try:
            args = loads_strict(args)
        except (ValueError, RecursionError) as exc:  # not JSON; a duplicate key, NaN, a 5000-digit integer
            if on_error == "raise":
                detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0]
                raise ArgumentsError(fn.get("name"), detail) from None
            return {"raw": args} if on_error == "raw" else {"input": args} if on_error == "input" else {}
    if dict_only and not isinstance(args, dict):
        return {"input": args} if on_error == "input" else {}
    return args


def load_files(paths: Iterable[str | Path]) -> list[Trajectory]:
    """Every trajectory of every file, validated before any slow work: refuses no trajectory at all
    and one id in two places (across files too), as every command that reads several files must."""
    trajs: list[Trajectory] = []
    for p in paths:
        trajs.extend(load_trajectories(p))
    if not trajs:
        raise TrajectoryError("no trajectories in the given files")
    check_unique_ids(trajs)
    unique_names(t.id for t in trajs)  # one output folder each, never shared (a hash collision is refused)
    return trajs


def save_trajectories(trajs: Iterable[Trajectory], path: str | Path) -> None:
    """Write trajectories as JSON Lines atomically (a crash leaves the old file intact)."""
    write_jsonl(Path(path), (t.to_dict() for t in trajs))
